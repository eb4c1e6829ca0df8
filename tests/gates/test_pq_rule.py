"""gates/pq_rule.py on synthetic inputs: the tie rows and their parameters, the probes that read
verify's p from its accept decisions (a faithful verify passes, one that cuts a tied token or
tempers after top-p is named), the proposer's q through a stand-in propose, and the counts."""
from types import SimpleNamespace

import pytest
import torch

from engine.proposers import ProposeInput
from engine.sampling import SamplingTensors, processed_probs
from engine.verify import verify
from gates.draft_q import cut_counts, tied_verify_row
from gates.pq_rule import (
    EPS,
    SampledRow,
    one_rule_difference,
    proposer_q,
    tie_parameters,
    tie_rows,
    tied_at_k,
    verify_accepts,
)

ROW = torch.tensor([4.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.0, -1.0])


def tied(seed: int, vocab: int = 24) -> torch.Tensor:
    """A row on a grid of 0.25: most values shared by several tokens."""
    return torch.round(torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 8) / 4


def support(p: torch.Tensor) -> set[int]:
    return set(torch.nonzero(p).flatten().tolist())


def rule(logits, t, k, p):
    n = logits.shape[0]
    return processed_probs(logits, torch.full((n,), t), torch.full((n,), k), torch.full((n,), p))


def test_tie_parameters_put_each_cut_inside_a_tie_group():
    top_k, top_p = tie_parameters(ROW, 1.0, "top-k")
    assert (top_k, top_p) == (2, 1.0) and tied_at_k(ROW, 1.0, 2)
    assert support(rule(ROW[None], 1.0, top_k, top_p)[0]) == {0, 1, 2, 3}
    top_k, top_p = tie_parameters(ROW, 1.0, "top-p")
    p = torch.softmax(ROW.double(), -1)
    assert top_k == -1 and float(p[:2].sum()) > top_p > float(p[:1].sum())  # between the first two 2s
    assert support(rule(ROW[None], 1.0, top_k, top_p)[0]) == {0, 1, 2, 3}
    assert tie_parameters(ROW, 1.0, "both") is None  # no two tied tokens within the top 2
    distinct = torch.arange(8.0)
    assert all(tie_parameters(distinct, 1.0, kind) is None for kind in ("top-k", "top-p", "both"))
    assert not tied_at_k(distinct, 1.0, 3) and not tied_at_k(ROW, 1.0, -1) and not tied_at_k(ROW, 1.0, 4)
    assert tied_at_k(ROW, 1.0, 3) and tied_at_k(ROW, 1.0, 5)


def test_tie_rows_cycle_kinds_and_temperatures():
    rows = tie_rows([tied(s) for s in range(40)], limit=9)
    assert rows.kinds == ("top-k", "top-p", "both") * 3
    assert rows.temperature.tolist() == pytest.approx([0.8] * 3 + [1.0] * 3 + [1.3] * 3)
    for i, kind in enumerate(rows.kinds):
        assert (int(rows.top_k[i]) > 0) == (kind != "top-p") and (float(rows.top_p[i]) < 1) == (kind != "top-k")
    with pytest.raises(ValueError, match="no recorded row"):
        tie_rows([torch.arange(8.0)])


def lossy_verify(change):
    """verify with its logits' p changed by `change` (logits, sampling) -> (logits, sampling)."""
    def run(logits, drafts, num_draft, draft_probs, sampling, first_position):
        return verify(*change(logits, sampling)[:1], drafts, num_draft, draft_probs, change(logits, sampling)[1],
                      first_position)
    return run


def read(verify_fn, rows, q):
    probes, accepted = verify_accepts(verify_fn, rows, q)
    return one_rule_difference(rows, q, probes, accepted)


@pytest.fixture(scope="module")
def rows():
    return tie_rows([tied(s) for s in range(60)], limit=9)


def engine_q(rows):
    return processed_probs(rows.logits, rows.temperature, rows.top_k, rows.top_p)


def test_a_verify_on_the_same_rule_reads_as_q(rows):
    q = engine_q(rows)
    probes, accepted = verify_accepts(verify, rows, q)
    assert accepted.tolist() == probes.expect_accept.tolist()
    assert len(accepted) == q.numel() + int((q > 0).sum())
    assert one_rule_difference(rows, q, probes, accepted) is None


def test_a_q_that_drops_a_tied_token_is_read_as_p_keeping_it(rows):
    q = engine_q(rows)
    i = rows.kinds.index("top-k")
    kept = q[i].nonzero().flatten()
    smallest = kept[q[i, kept].argmin()]
    q[i, smallest] = 0
    q[i] /= q[i].sum()
    diff = read(verify, rows, q)
    assert diff is not None and diff.step == i and diff.position == int(smallest)
    assert diff.actual == "p(x) > 0" and "q leaves the engine's rule" in diff.what


def test_a_verify_that_cuts_top_k_by_rank_is_named(rows):
    def by_rank(logits, sampling):
        rank = logits.argsort(dim=-1, descending=True).argsort(dim=-1)
        k = sampling.top_k[:, None, None]
        return logits.masked_fill((k > 0) & (rank >= k), float("-inf")), sampling
    diff = read(lossy_verify(by_rank), rows, engine_q(rows))
    assert diff is not None and diff.actual == f"p(x) < q(x) (1 - {EPS})" and "q follows" in diff.what


def test_a_verify_that_tempers_after_top_p_is_named(rows):
    def tempered_after(logits, sampling):
        flat = SamplingTensors(torch.ones_like(sampling.temperature), sampling.top_k, sampling.top_p, sampling.keys)
        return logits.masked_fill(flat.probs(logits) == 0, float("-inf")), sampling
    diff = read(lossy_verify(tempered_after), rows, engine_q(rows))
    assert diff is not None and rows.kinds[diff.step] != "top-k"


def test_a_verify_at_a_slightly_other_temperature_is_named(rows):
    def hotter(logits, sampling):
        return logits, SamplingTensors(sampling.temperature * 1.001, sampling.top_k, sampling.top_p, sampling.keys)
    diff = read(lossy_verify(hotter), rows, engine_q(rows))
    assert diff is not None and diff.actual in (f"p(x) < q(x) (1 - {EPS})", f"p(x) > q(x) (1 + {EPS})")


class Target:
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*hidden.shape[:-1], 24)


class StandIn:
    """A block proposer's shape: its logits come from target.compute_logits, q from sampling.probs."""

    def __init__(self, calls_compute: bool = True):
        self.target = Target()
        self.calls_compute = calls_compute

    def propose(self, inp: ProposeInput):
        hidden = torch.zeros(inp.token_ids.shape[0], 3, 5)
        logits = self.target.compute_logits(hidden) if self.calls_compute else torch.zeros(*hidden.shape[:-1], 24)
        return torch.zeros(hidden.shape[:2], dtype=torch.long), torch.full((hidden.shape[0],), 3), \
            inp.sampling.probs(logits)


def recorder_of(proposer) -> SimpleNamespace:
    n = 4
    sampling = SamplingTensors(torch.ones(n), torch.full((n,), -1), torch.ones(n), torch.arange(n))
    inp = ProposeInput(torch.zeros(n, 8, dtype=torch.long), torch.full((n,), 3), sampling, torch.arange(n),
                       torch.zeros(n, 2, dtype=torch.long))
    return SimpleNamespace(propose_inputs=[inp], propose=proposer.propose,
                           runner=SimpleNamespace(proposer=proposer))


def test_the_proposers_q_is_its_processing_of_the_rows_handed_to_it(rows):
    proposer = StandIn()
    q = proposer_q(recorder_of(proposer), rows)
    assert torch.equal(q, engine_q(rows))
    assert "compute_logits" not in vars(proposer.target)  # the method is the target's own again
    wrapper = proposer.target.compute_logits = lambda hidden: Target.compute_logits(proposer.target, hidden)
    proposer_q(recorder_of(proposer), rows)
    assert vars(proposer.target)["compute_logits"] is wrapper  # another recorder's wrapper is put back
    with pytest.raises(ValueError, match="did not come from the rows"):
        proposer_q(recorder_of(StandIn(calls_compute=False)), rows)


def recorded_row(logits, q, t=1.0, k=2, p=1.0) -> SampledRow:
    return SampledRow(logits=logits, num_draft=logits.shape[0] - 1, temperature=t, top_k=k, top_p=p, q=q)


def test_cut_counts_count_binding_cuts_and_ties():
    distinct = torch.arange(8.0).flip(0)
    counts = cut_counts([recorded_row(torch.stack([ROW, distinct]), None, k=2, p=1.0),
                         recorded_row(torch.stack([ROW]), None, k=-1, p=0.6)])
    assert counts == dict(top_k=2, top_p=1, tied_at_k=1, tied_and_kept=1)
    counts = cut_counts([recorded_row(torch.stack([ROW]), None, k=2, p=0.5)])
    assert counts == dict(top_k=1, top_p=1, tied_at_k=1, tied_and_kept=0)


def test_tied_verify_row_picks_a_kept_tie_where_p_and_q_differ():
    distinct = torch.arange(8.0).flip(0)
    far_q = torch.zeros(1, 8)
    far_q[0, 7] = 1.0
    rows = [recorded_row(torch.stack([distinct, distinct]), far_q),            # no tie
            recorded_row(torch.stack([ROW, distinct]), rule(ROW[None], 1.0, 2, 1.0)),  # p = q
            recorded_row(torch.stack([distinct, ROW, distinct]), torch.cat([far_q, far_q])),
            recorded_row(torch.stack([ROW, distinct]), None)]
    logits, q, params = tied_verify_row(rows)
    assert torch.equal(logits, torch.stack([ROW, distinct])) and torch.equal(q, far_q)
    assert params == dict(temperature=1.0, top_k=2, top_p=1.0)
    with pytest.raises(ValueError, match="no recorded sampled draft position"):
        tied_verify_row(rows[:2])
