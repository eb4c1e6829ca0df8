"""p and q processed by one rule: for one logits row and one set of sampling parameters, the p
verify judges with and the q a proposer draws from are the same distribution, on rows where
bfloat16's ties decide the cuts.

The engine has it by construction (verify and the block drafter both call
`SamplingTensors.probs`); this checks it from outside, so a copy of the rule that drifts on one
side (a drafter that cuts top-k by rank, a verify that cuts top-p at a sort position inside a tie
group) is seen. Each side is read through the engine's own call path, never by calling the rule
the gate believes it uses:

- q: the runner's propose runs on a step input recorded in a real run, with the target's
  `compute_logits` (where the block drafter's logits come from) handing it the chosen rows; the
  q it returns is its processing of those rows.
- p: verify returns no p, so p is read from its accept decisions. A draft x given draft
  probability q'(x) is accepted iff u < p(x) / q'(x), u the row's keyed uniform. Per row and
  token, q'(x) = 0 (verify floors it at 1e-30) is accepted iff p(x) > 0, and q'(x) =
  q(x) (1 -/+ EPS) / u iff p(x) > q(x) (1 -/+ EPS). So p is 0 exactly where q is, and within EPS
  of q elsewhere: the same support, the same values to float32 rounding.

The rows are verify's logits recorded in a bfloat16 run, each with parameters chosen so that a
cut lands inside a tie group (`tie_parameters`): top_k at a k whose k-th largest logit equals the
next one, or top_p between the masses before two tied tokens.
"""
from dataclasses import dataclass

import torch

from engine.proposers import ProposeInput
from engine.sampling import STREAM_ACCEPT, SamplingTensors, keyed_uniform, processed_probs
from gates.compare import Difference

# p(x) within this relative distance of q(x) is equal: float32 rounding of one softmax computed in
# another batch shape is about 1e-7; a tied token cut on one side moves every other value by its
# share of the mass, 1e-3 and more on these rows.
EPS = 1e-4
KINDS = ("top-k", "top-p", "both")   # which cut lands inside a tie group, cycled over the rows


def clone_sampling(s: SamplingTensors) -> SamplingTensors:
    return SamplingTensors(temperature=s.temperature.clone(), top_k=s.top_k.clone(), top_p=s.top_p.clone(),
                           keys=s.keys.clone())


@dataclass(frozen=True)
class SampledRow:
    """One sampled request's verify window, as recorded (on the host)."""
    logits: torch.Tensor       # [n+1, V] the target's logits at the last committed token and each draft
    num_draft: int             # n
    temperature: float
    top_k: int
    top_p: float
    q: torch.Tensor | None     # [n, V] the drafter's q of the drafts; None for a one-hot drafter


class StepRecorder:
    """Wraps the runner's verify and propose and keeps a copy (on the engine's device) of each
    verify call's logits, num_draft, draft_probs and sampling, and of each propose call's input.
    `verify` and `propose` are the runner's own, unwrapped, for the probes afterwards."""

    def __init__(self, llm):
        self.verify_calls: list[dict] = []
        self.propose_inputs: list[ProposeInput] = []
        runner = llm.runner
        self.runner, self.verify, self.propose = runner, runner.verify, runner.propose

        def recorded_verify(logits, drafts, num_draft, draft_probs, sampling, first_position):
            self.verify_calls.append(dict(logits=logits.clone(), num_draft=num_draft.clone(),
                                          draft_probs=None if draft_probs is None else draft_probs.clone(),
                                          sampling=clone_sampling(sampling)))
            return self.verify(logits, drafts, num_draft, draft_probs, sampling, first_position)

        def recorded_propose(inp: ProposeInput):
            self.propose_inputs.append(ProposeInput(
                token_ids=inp.token_ids.clone(), num_committed=inp.num_committed.clone(),
                sampling=clone_sampling(inp.sampling), slots=inp.slots.clone(), block_tables=inp.block_tables.clone()))
            return self.propose(inp)

        runner.verify, runner.propose = recorded_verify, recorded_propose

    def sampled_rows(self) -> list[SampledRow]:
        """Every sampled request's verify window of the run, in step order."""
        rows = []
        for c in self.verify_calls:
            s = {name: getattr(c["sampling"], name).cpu() for name in ("temperature", "top_k", "top_p")}
            logits, num_draft = c["logits"].cpu(), c["num_draft"].cpu()
            q = c["draft_probs"].cpu() if c["draft_probs"] is not None else None
            for r in (s["temperature"] > 0).nonzero().flatten().tolist():
                n = int(num_draft[r])
                rows.append(SampledRow(logits=logits[r, :n + 1], num_draft=n, temperature=float(s["temperature"][r]),
                                       top_k=int(s["top_k"][r]), top_p=float(s["top_p"][r]),
                                       q=q[r, :n] if q is not None else None))
        return rows


def sorted_scaled(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """The row's logits / temperature in float32, as the sampler scales them, largest first."""
    return (row.float() / torch.tensor(temperature, dtype=torch.float32)).sort(descending=True).values


def tied_at_k(row: torch.Tensor, temperature: float, top_k: int) -> bool:
    """Whether top-k's k-th largest logit (scaled) equals the next one: the cut is inside a tie group."""
    s = sorted_scaled(row, temperature)
    return 0 < top_k < s.numel() and bool(s[top_k - 1] == s[top_k]) and bool(s[top_k - 1] > -torch.inf)


def tie_parameters(row: torch.Tensor, temperature: float, kind: str) -> tuple[int, float] | None:
    """(top_k, top_p) for `row` whose cut lands inside a tie group: `top-k` the smallest k >= 2 whose
    k-th largest logit equals the next (top_p 1); `top-p` (top_k off) top_p halfway between the
    masses before the first two tied tokens whose masses differ by at least 1e-3; `both` that k
    and top_p inside a tie group of its top k. None when the row has no such tie."""
    s = sorted_scaled(row, temperature).double()
    vocab = s.numel()
    ties = ((s[:-1] == s[1:]) & (s[:-1] > -torch.inf)).nonzero().flatten().tolist()  # i: s[i] == s[i + 1]
    top_k = next((i + 1 for i in ties if i >= 1), None)
    if kind == "top-k":
        return None if top_k is None else (top_k, 1.0)
    k = vocab if kind == "top-p" else top_k
    if k is None:
        return None
    p = torch.softmax(s.masked_fill(s < s[k - 1], -torch.inf), -1)
    before = p.cumsum(0) - p
    inside = next((i for i in ties if i + 1 < k and float(before[i + 1] - before[i]) >= 1e-3), None)
    if inside is None:
        return None
    return (-1 if kind == "top-p" else k), float(before[inside] + before[inside + 1]) / 2


@dataclass(frozen=True)
class TieRows:
    """Rows and the parameters that put a cut inside one of their tie groups."""
    logits: torch.Tensor        # [N, V] float32
    temperature: torch.Tensor   # [N]
    top_k: torch.Tensor         # [N]
    top_p: torch.Tensor         # [N]
    kinds: tuple[str, ...]      # [N] which cut lands in a tie group


def tie_rows(rows: list[torch.Tensor], temperatures=(0.8, 1.0, 1.3), limit: int = 24) -> TieRows:
    """Up to `limit` of `rows` ([V] logits each) with parameters from tie_parameters: the kinds
    cycled so that each takes a third, and each kind cycled through the temperatures."""
    picked, params = [], []
    for row in rows:
        n = len(picked)
        kind, temperature = KINDS[n % len(KINDS)], temperatures[n // len(KINDS) % len(temperatures)]
        cut = tie_parameters(row, temperature, kind)
        if cut is not None:
            picked.append(row.float())
            params.append((temperature, *cut, kind))
        if len(picked) == limit:
            break
    if not picked:
        raise ValueError("no recorded row has a tie group a cut can land in")
    t, k, p, kinds = zip(*params)
    return TieRows(logits=torch.stack(picked), temperature=torch.tensor(t), top_k=torch.tensor(k),
                   top_p=torch.tensor(p), kinds=tuple(kinds))


@torch.inference_mode()
def proposer_q(recorder: StepRecorder, rows: TieRows) -> torch.Tensor:
    """q [N, V]: the runner's propose on a recorded step input (its rows repeated to N), with the
    target's compute_logits handing the drafter `rows` at every draft position, so each of the k
    positions of request i is row i processed with request i's parameters."""
    inp = max(recorder.propose_inputs, key=lambda i: i.token_ids.shape[0])
    n, vocab = rows.logits.shape
    device = inp.token_ids.device
    pick = torch.arange(n, device=device) % inp.token_ids.shape[0]
    sampling = SamplingTensors(temperature=rows.temperature.to(device), top_k=rows.top_k.to(device),
                               top_p=rows.top_p.to(device), keys=inp.sampling.keys[pick])
    probe = ProposeInput(token_ids=inp.token_ids[pick], num_committed=inp.num_committed[pick], sampling=sampling,
                         slots=inp.slots[pick], block_tables=inp.block_tables[pick])
    target = recorder.runner.proposer.target
    handed = []

    def hand_rows(hidden: torch.Tensor) -> torch.Tensor:
        handed.append(tuple(hidden.shape[:-1]))
        return rows.logits.to(device)[:, None, :].expand(n, hidden.shape[1], vocab).clone()

    shadowed = vars(target).get("compute_logits")  # another recorder's wrapper, if any
    target.compute_logits = hand_rows  # the instance attribute shadows the method
    try:
        _, _, q = recorder.propose(probe)
    finally:
        if shadowed is None:
            vars(target).pop("compute_logits", None)
        else:
            target.compute_logits = shadowed
    if len(handed) != 1 or handed[0][0] != n or q is None:
        raise ValueError(f"the proposer's q did not come from the rows handed to compute_logits "
                         f"(its calls: {handed}, q: {None if q is None else tuple(q.shape)})")
    return q[:, 0].float().cpu()


@dataclass(frozen=True)
class Probes:
    """Verify rounds that read p: probe j asks about token `token[j]` of row `row[j]` with draft
    probability `q_prime[j]`; `expect_accept[j]` is what a p equal to q there does."""
    row: torch.Tensor            # [M]
    token: torch.Tensor          # [M]
    q_prime: torch.Tensor        # [M]
    expect_accept: torch.Tensor  # [M] bool
    what: tuple[str, ...]        # [M] "support" | "not below" | "not above"


def probes(q: torch.Tensor, u: torch.Tensor) -> Probes:
    """For q [N, V] and the probe rows' uniforms u (one per probe, in the order built here): every
    token outside q's support with q' = 0 (must be rejected: p = 0), every token inside it with
    q' = q (1 - EPS) / u (accepted: p not below q) and q' = q (1 + EPS) / u (rejected: p not above)."""
    rows, tokens = torch.nonzero(q == 0, as_tuple=True)
    srows, stokens = torch.nonzero(q > 0, as_tuple=True)
    row = torch.cat([rows, srows, srows])
    token = torch.cat([tokens, stokens, stokens])
    m0, m1 = rows.numel(), srows.numel()
    qs = q[srows, stokens].double()
    u = u.double()
    q_prime = torch.cat([torch.zeros(m0, dtype=torch.float64), qs * (1 - EPS) / u[m0:m0 + m1],
                         qs * (1 + EPS) / u[m0 + m1:]])
    expect = torch.cat([torch.zeros(m0, dtype=torch.bool), torch.ones(m1, dtype=torch.bool),
                        torch.zeros(m1, dtype=torch.bool)])
    what = ("support",) * m0 + ("not below",) * m1 + ("not above",) * m1
    return Probes(row=row, token=token, q_prime=q_prime.float(), expect_accept=expect, what=what)


def probe_keys(num: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and the uniform verify draws for the first draft of each probe (first position 1)."""
    keys = torch.arange(num, dtype=torch.long) * 7919 + 13
    return keys, keyed_uniform(keys, torch.ones(num, dtype=torch.long), STREAM_ACCEPT, 1)[..., 0]


@torch.inference_mode()
def verify_accepts(verify_fn, rows: TieRows, q: torch.Tensor, device: str = "cpu") -> tuple[Probes, torch.Tensor]:
    """Run the probes of q through `verify_fn` (the runner's verify): each probe is one verify row
    [row's logits twice], one draft, its draft probability q' at that token and 0 elsewhere."""
    support = int((q > 0).sum())
    num = q.numel() + support
    keys, u = probe_keys(num)
    pr = probes(q, u)
    vocab = q.shape[-1]
    logits = rows.logits[pr.row][:, None, :].expand(num, 2, vocab).contiguous()
    draft_probs = torch.zeros(num, 1, vocab)
    draft_probs[torch.arange(num), 0, pr.token] = pr.q_prime
    sampling = SamplingTensors(temperature=rows.temperature[pr.row].to(device), top_k=rows.top_k[pr.row].to(device),
                               top_p=rows.top_p[pr.row].to(device), keys=keys.to(device))
    ones = torch.ones(num, dtype=torch.long, device=device)
    _, num_accepted = verify_fn(logits.to(device), pr.token[:, None].to(device), ones, draft_probs.to(device),
                                sampling, ones)
    return pr, num_accepted.cpu() == 1


def one_rule_difference(rows: TieRows, q: torch.Tensor, pr: Probes, accepted: torch.Tensor) -> Difference | None:
    """The first probe where verify's p and the proposer's q of the same row and parameters differ
    (step: the row, position: the token), naming which side left the engine's rule."""
    wrong = (accepted != pr.expect_accept).nonzero().flatten()
    if not wrong.numel():
        return None
    j = int(wrong[0])
    i, x = int(pr.row[j]), int(pr.token[j])
    rule = processed_probs(rows.logits[i:i + 1], rows.temperature[i:i + 1], rows.top_k[i:i + 1],
                           rows.top_p[i:i + 1])[0]
    q_on_rule = torch.equal(q[i] > 0, rule > 0) and torch.allclose(q[i], rule, rtol=EPS, atol=0)
    found = {"support": "p(x) > 0", "not below": f"p(x) < q(x) (1 - {EPS})", "not above": f"p(x) > q(x) (1 + {EPS})"}
    return Difference(f"verify's p vs the proposer's q of one row ({rows.kinds[i]} cut in a tie group: temperature "
                      f"{float(rows.temperature[i]):g}, top_k {int(rows.top_k[i])}, top_p {float(rows.top_p[i]):.4f}; "
                      f"q {'follows' if q_on_rule else 'leaves'} the engine's rule there)", i, -1, x,
                      f"q(x) = {float(q[i, x]):.6g}", found[pr.what[j]])
