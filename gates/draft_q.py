"""The sampled path's own checks: the q verify is given is the q the drafts were drawn from, and
verify stays lossless with the engine's own drafter q at binding temperature, top-k and top-p.

The verify-level chi-square of gates/distribution.py builds its q itself with top-k/top-p off, so
a q that disagrees with the drafts, or a verify that mishandles the zero-mass tails a binding
top-k/top-p leaves in p and q, passes it. Here:

- `DraftRecorder` keeps every (drafts, q, sampling) a block proposer returned during a run, and
  `draft_q_difference` checks each sampled row: q is a distribution (sums to 1), every draft has
  q(x) > 0, q is already cut by the row's top-k and top-p (processing it again with temperature 1
  changes nothing), and redrawing with the drafter's own random stream from the stored q gives
  the drafts back (so they were drawn from this q, at this temperature).
- `engine_q_p_values` runs verify N times on one recorded verify row (the target's logits there
  and the drafter's q) and tests the tokens emitted at every position against p, in float64, with
  a chi-square over p's support; a token outside the support fails outright.
- `binding_steps` counts the emitted tokens where top-k and top-p each removed probability mass;
  `cut_counts` the same over a StepRecorder's verify rows (gates/pq_rule.py), with the rows whose
  top-k cut is inside a tie group; `tied_verify_row` picks such a row for `engine_q_p_values`.
"""
import numpy as np
import torch
from scipy.stats import chisquare

from engine.sampling import STREAM_DRAFT, SamplingTensors, processed_probs, sample_from_probs
from engine.verify import verify
from gates.compare import Difference
from gates.pq_rule import SampledRow, sorted_scaled, tied_at_k

BINDING_MASS = 1e-3     # a cut binds at a step when it removes at least this much probability
MIN_EXPECTED = 5        # chi-square cells expected fewer times than this are pooled into one


class DraftRecorder:
    """Wraps the runner's propose (the proposer's own, or compile=True's compiled one); `calls`
    holds a copy of every proposal, on the engine's device (a host copy here would sync inside the
    step). Under CUDA graph replay the Python propose does not run, so only eagerly executed
    proposals are recorded."""

    def __init__(self, llm):
        self.calls: list[dict] = []
        proposer = llm.runner.proposer
        propose = llm.runner.propose

        target = getattr(proposer, "target", None)

        def recorded(inp):
            logits = []
            if target is not None:  # the drafter's logits: the block proposer runs the target's lm_head
                compute = target.compute_logits
                target.compute_logits = lambda hidden: logits.append(compute(hidden)) or logits[-1]
            try:
                drafts, num_draft, q = propose(inp)
            finally:
                if target is not None:
                    del target.compute_logits
            if q is not None and logits:
                s = inp.sampling
                self.calls.append(dict(drafts=drafts.clone(), q=q.clone(), logits=logits[-1].clone(),
                                       num_committed=inp.num_committed.clone(),
                                       token_ids=inp.token_ids.clone(), temperature=s.temperature.clone(),
                                       top_k=s.top_k.clone(), top_p=s.top_p.clone(), keys=s.keys.clone()))
            return drafts, num_draft, q
        llm.runner.propose = recorded


def draft_q_difference(calls: list[dict]) -> Difference | None:
    """The first sampled row whose stored q is not the distribution its drafts came from (the
    Difference's step is the proposal's index in the run)."""
    for n, c in enumerate(calls):
        c = {name: t.cpu() for name, t in c.items()}  # recorded on the engine's device
        sampled = c["temperature"] > 0
        if not sampled.any():
            continue
        q, drafts = c["q"][sampled], c["drafts"][sampled]
        t, top_k, top_p = c["temperature"][sampled], c["top_k"][sampled], c["top_p"][sampled]
        k = q.shape[1]
        def diff(what, expected, actual):
            return Difference(f"draft q: {what}", n, -1, -1, expected, actual)
        if not torch.allclose(q.sum(-1), torch.ones(()), atol=1e-4):
            return diff("sum", 1.0, q.sum(-1).flatten()[:4].tolist())
        q_x = q.gather(-1, drafts[..., None]).squeeze(-1)
        if (q_x <= 0).any():
            return diff("q(draft) > 0", "> 0", q_x.tolist()[:2])
        want = processed_probs(c["logits"][sampled], t[:, None], top_k[:, None], top_p[:, None])
        if not torch.allclose(want, q, atol=1e-6):
            r, j = (~torch.isclose(want, q, rtol=1e-5, atol=1e-6)).any(-1).nonzero()[0].tolist()  # the first row off
            return diff(f"the drafter's logits processed like p (temperature {float(t[r]):g}, top_k {int(top_k[r])}, "
                        f"top_p {float(top_p[r]):g}) at sampled row {r}, draft {j}, support",
                        torch.nonzero(want[r, j]).flatten().tolist(), torch.nonzero(q[r, j]).flatten().tolist())
        positions = c["num_committed"][sampled][:, None] + torch.arange(k)  # the drafts' positions
        redrawn = sample_from_probs(q, c["keys"][sampled][:, None], positions, STREAM_DRAFT)
        if not torch.equal(redrawn, drafts):
            return diff("drafts redrawn from the stored q", redrawn.tolist()[:1], drafts.tolist()[:1])
    return None


def binding_steps(model, outputs, params) -> dict[str, int]:
    """Emitted tokens at which top-k, and top-p after it, removed at least BINDING_MASS of p."""
    counts = {"top_k": 0, "top_p": 0}
    for out, sp in zip(outputs, params):
        if sp.temperature == 0:
            continue
        seq = list(out.prompt_token_ids) + list(out.token_ids)
        with torch.inference_mode():
            logits, _ = model.forward_dense(torch.tensor([seq], device=next(model.parameters()).device))
        rows = logits[0, len(out.prompt_token_ids) - 1:len(seq) - 1].double().cpu()
        n = rows.shape[0]
        t = torch.full((n,), float(sp.temperature), dtype=torch.float64)
        plain = processed_probs(rows, t, torch.full((n,), -1), torch.ones(n, dtype=torch.float64))
        top_k_only = processed_probs(rows, t, torch.full((n,), sp.top_k), torch.ones(n, dtype=torch.float64))
        both = processed_probs(rows, t, torch.full((n,), sp.top_k),
                               torch.full((n,), float(sp.top_p), dtype=torch.float64))
        counts["top_k"] += int((plain.masked_fill(top_k_only > 0, 0).sum(-1) >= BINDING_MASS).sum())
        counts["top_p"] += int((top_k_only.masked_fill(both > 0, 0).sum(-1) >= BINDING_MASS).sum())
    return counts


def support_p_value(observed: np.ndarray, p: np.ndarray) -> float:
    """Chi-square of token counts against p over p's support (cells expected < MIN_EXPECTED times
    pooled); any count outside the support gives 0."""
    if observed[p == 0].sum():
        return 0.0
    n = observed.sum()
    expected = p * n
    small = (expected < MIN_EXPECTED) & (p > 0)
    big = expected >= MIN_EXPECTED
    obs = np.append(observed[big], observed[small].sum())
    exp = np.append(expected[big], expected[small].sum())
    keep = exp > 0
    if keep.sum() < 2:
        return 1.0  # every token fell in the support, and one cell leaves nothing to test
    return float(chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def engine_q_p_values(target_logits: torch.Tensor, q: torch.Tensor, temperature: float, top_k: int, top_p: float,
                      num_rounds: int, verify_fn=verify) -> list[tuple[int, float]]:
    """N verify rounds of one recorded row: target_logits [k+1, V], the drafter's q [k, V]; drafts
    drawn from q with a fresh key per round. (rounds reaching position j, p-value there)."""
    k, vocab = q.shape
    n = num_rounds
    keys = torch.arange(n, dtype=torch.long) * 7919 + 13
    drafts = sample_from_probs(q.expand(n, -1, -1), keys[:, None].expand(-1, k),
                               torch.arange(1, k + 1)[None, :].expand(n, -1), STREAM_DRAFT)
    sampling = SamplingTensors(temperature=torch.full((n,), temperature), top_k=torch.full((n,), top_k),
                               top_p=torch.full((n,), top_p), keys=keys)
    sampled, num_accepted = verify_fn(target_logits.expand(n, -1, -1).clone(), drafts, torch.full((n,), k),
                                      q.expand(n, -1, -1).clone(), sampling, torch.ones(n, dtype=torch.long))
    p = processed_probs(target_logits.double(), torch.full((k + 1,), float(temperature), dtype=torch.float64),
                        torch.full((k + 1,), top_k), torch.full((k + 1,), float(top_p), dtype=torch.float64)).numpy()
    sampled, num_accepted = sampled.numpy(), num_accepted.numpy()
    out = []
    for j in range(k + 1):
        reached = num_accepted >= j
        observed = np.bincount(sampled[reached, j], minlength=vocab)
        out.append((int(reached.sum()), support_p_value(observed, p[j])))
    return out


@torch.inference_mode()
def telling_verify_row(model, calls: list[dict], limit: int = 64,
                       min_reach: float = 0.05) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Among the first `limit` sampled rows recorded, one where verify has work to do: the target
    accepts every draft often enough that each position is reached (the product over positions
    of sum(min(p, q)) at least `min_reach`), and p and q disagree most (the sum over positions of
    1 - sum(min(p, q)): a rejection's residual, where a lossy verify shows). Returns (target
    logits [k+1, V] at that row, its q [k, V], its sampling parameters)."""
    best, best_score = None, 0.0
    device = next(model.parameters()).device
    rows = [(c, r) for c in calls for r in (c["temperature"] > 0).nonzero().flatten().tolist()][:limit]
    for c, r in rows:
        committed = int(c["num_committed"][r])
        sequence = c["token_ids"][r, :committed].tolist() + c["drafts"][r].tolist()
        logits, _ = model.forward_dense(torch.tensor([sequence], device=device))
        target = logits[0, committed - 1:].float().cpu()
        k = target.shape[0] - 1
        params = dict(temperature=float(c["temperature"][r]), top_k=int(c["top_k"][r]), top_p=float(c["top_p"][r]))
        p = processed_probs(target[:k], torch.full((k,), params["temperature"]), torch.full((k,), params["top_k"]),
                            torch.full((k,), params["top_p"]))
        overlap = torch.minimum(p, c["q"][r].cpu()).sum(-1)
        score = float((1 - overlap).sum())
        if float(overlap.prod()) >= min_reach and score > best_score:
            best, best_score = (target, c["q"][r].cpu(), params), score
    if best is None:
        raise ValueError(f"no recorded sampled row reaches its last draft with probability {min_reach} and "
                         f"disagrees with the target")
    return best


def tied_verify_row(rows: list[SampledRow], min_disagreement: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Among recorded rows with drafts and their q, the draft position whose top-k cut lands inside
    a tie group that top-p keeps (tokens tied at the k-th largest logit have p > 0 past the first
    k) with the most mass in that group, among those where p and q differ by at least
    `min_disagreement` (1 - sum(min(p, q)): what a lossy verify gets wrong). Returns (target
    logits [2, V] at that position and the next, q [1, V] there, its sampling parameters)."""
    best, best_mass = None, 0.0
    for row in rows:
        n = row.num_draft
        if row.q is None or n == 0:
            continue
        p = processed_probs(row.logits[:n], torch.full((n,), row.temperature), torch.full((n,), row.top_k),
                            torch.full((n,), row.top_p))
        for j in range(n):
            if not tied_at_k(row.logits[j], row.temperature, row.top_k) or int((p[j] > 0).sum()) <= row.top_k:
                continue
            scaled = row.logits[j].float() / torch.tensor(row.temperature, dtype=torch.float32)
            mass = float(p[j][scaled == sorted_scaled(row.logits[j], row.temperature)[row.top_k - 1]].sum())
            if 1 - float(torch.minimum(p[j], row.q[j]).sum()) >= min_disagreement and mass > best_mass:
                best = (row.logits[j:j + 2], row.q[j:j + 1],
                        dict(temperature=row.temperature, top_k=row.top_k, top_p=row.top_p))
                best_mass = mass
    if best is None:
        raise ValueError("no recorded sampled draft position has a top-k cut inside a tie group that top-p keeps "
                         f"and p and q differing by {min_disagreement}")
    return best


def cut_counts(rows: list[SampledRow], binding_mass: float = 1e-3) -> dict[str, int]:
    """Over every position of the recorded rows: where top-k removed at least `binding_mass` of p,
    where top-p then did, where the top-k cut is inside a tie group (the k-th largest logit equals
    the next), and where that tie group is kept by top-p too."""
    counts = dict(top_k=0, top_p=0, tied_at_k=0, tied_and_kept=0)
    for row in rows:
        n = row.logits.shape[0]
        t = torch.full((n,), row.temperature)
        plain = processed_probs(row.logits, t, torch.full((n,), -1), torch.ones(n))
        top_k_only = processed_probs(row.logits, t, torch.full((n,), row.top_k), torch.ones(n))
        both = processed_probs(row.logits, t, torch.full((n,), row.top_k), torch.full((n,), row.top_p))
        counts["top_k"] += int((plain.masked_fill(top_k_only > 0, 0).sum(-1) >= binding_mass).sum())
        counts["top_p"] += int((top_k_only.masked_fill(both > 0, 0).sum(-1) >= binding_mass).sum())
        for logits, kept in zip(row.logits, (both > 0).sum(-1).tolist()):
            if tied_at_k(logits, row.temperature, row.top_k):
                counts["tied_at_k"] += 1
                counts["tied_and_kept"] += kept > row.top_k
    return counts
