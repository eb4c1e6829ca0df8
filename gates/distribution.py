"""Statistical tests that sampled tokens follow the target distribution p.

Two tests, one threshold: a Pearson chi-square p-value below P_VALUE_THRESHOLD (1e-3) fails.
Both are deterministic (fixed keys and seeds), so a pass is reproducible; the threshold states
the false-failure probability a fresh seed would carry (about 0.1% per test).

- Verify alone (`verify_round`, `position_p_values`): N independent verify rounds of one fixed
  (p, q) as N batch rows; the tokens emitted at each draft position and the bonus position are
  tested against p in float64. Drafts are sampled from q, or one-hot (a deterministic drafter).
- Whole engine runs (`pit_values`, `uniformity_p_value`): every token a sampled run emitted has
  its own history, so its p differs; the randomized probability integral transform maps token x
  drawn from p to u = P(X ranked before x) + V * p(x), V ~ U(0, 1), which is exactly uniform
  and independent from token to token when every token is drawn from its p. The tokens are ranked
  by p, so an excess of likely tokens (an over-accepting verify) piles up near u = 0. p comes
  from a dense float64-softmaxed forward of the final sequence, processed like the sampler's.

- Accept decisions of a deterministic drafter (`acceptance_pit_values`): a lossless verify accepts
  a one-hot draft x exactly with probability p(x), so each reached draft's decision maps to
  u = V * p(x) if accepted, else p(x) + V * (1 - p(x)), again exactly uniform and independent.
  Token PIT alone has little power where drafts are unrelated to p (a random-weight target): an
  over-accepting verify then emits unlikely-but-drafted tokens whose ranks look ordinary; their
  accept decisions pile up near u = 0.

A negative control (the acceptance ratio computed with the wrong q) must fail each test.
"""
import numpy as np
import torch
from scipy.stats import chisquare

from engine.sampling import STREAM_DRAFT, SamplingTensors, processed_probs, sample_from_probs
from engine.verify import verify

P_VALUE_THRESHOLD = 1e-3
PIT_BINS = 20


def wrong_q_verify(logits, draft_token_ids, num_draft, draft_probs, *rest):
    """The negative control: verify with a uniform q in the ratio and the residual instead of the
    q the drafts came from. Lossy: it accepts drafts the target finds likely too often."""
    vocab = logits.shape[-1]
    uniform = torch.full((*draft_token_ids.shape, vocab), 1.0 / vocab, device=logits.device)
    return verify(logits, draft_token_ids, num_draft, uniform, *rest)


# ---- verify alone ------------------------------------------------------------------------------
def verify_round(num_rounds: int, vocab: int, k: int, drafter: str, lossy: bool, seed: int = 0):
    """N verify rounds of one target p ([k+1, vocab]) and drafter q; `drafter` is 'sampled' (drafts
    drawn from q, q passed to verify) or 'one-hot' (the fixed draft sequence of p's most likely
    tokens, as a good deterministic drafter proposes; q one-hot).
    Returns (p in float64 [k+1, vocab], sampled [N, k+1], num_accepted [N])."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(k + 1, vocab, generator=gen) * 1.5
    n = num_rounds
    temp, top_k, top_p = torch.ones(n), torch.full((n,), -1), torch.ones(n)
    keys = torch.arange(n, dtype=torch.long) * 7919 + 13
    if drafter == "sampled":
        q = processed_probs((torch.randn(k, vocab, generator=gen) * 1.5).expand(n, -1, -1),
                            temp[:, None], top_k[:, None], top_p[:, None])
        positions = torch.arange(1, k + 1)[None, :].expand(n, -1)
        drafts = sample_from_probs(q, keys[:, None].expand(-1, k), positions, STREAM_DRAFT)
    else:
        q = None
        drafts = target_logits[:k].argmax(-1).expand(n, -1)
    verify_fn = wrong_q_verify if lossy else verify
    sampled, num_accepted = verify_fn(target_logits.expand(n, -1, -1).clone(), drafts, torch.full((n,), k),
                                      q, SamplingTensors(temperature=temp, top_k=top_k, top_p=top_p, keys=keys),
                                      torch.ones(n, dtype=torch.long))
    p = torch.softmax(target_logits.double(), dim=-1)
    return p.numpy(), sampled.numpy(), num_accepted.numpy()


def position_p_values(p, sampled, num_accepted) -> list[tuple[int, float]]:
    """(rounds reaching position j, chi-square p-value of the tokens emitted there), j = 0..k."""
    out = []
    for j in range(p.shape[0]):
        reached = num_accepted >= j  # position j is emitted when drafts 0..j-1 were accepted
        observed = np.bincount(sampled[reached, j], minlength=p.shape[1])
        out.append((int(reached.sum()), float(chisquare(observed, p[j] * reached.sum()).pvalue)))
    return out


# ---- whole engine runs -------------------------------------------------------------------------
def sequence_probs(model, out, sp) -> np.ndarray:
    """p of every next token along the request's final sequence, processed like the sampler's:
    row t is the distribution of token t + 1 given tokens 0..t (float64, dense forward)."""
    sequence = list(out.prompt_token_ids) + list(out.token_ids)
    device = next(model.parameters()).device
    logits, _ = model.forward_dense(torch.tensor([sequence], device=device))
    rows = logits[0, :len(sequence) - 1].double().cpu()
    n = rows.shape[0]
    return processed_probs(rows, torch.full((n,), float(sp.temperature), dtype=torch.float64),
                           torch.full((n,), sp.top_k), torch.full((n,), float(sp.top_p), dtype=torch.float64)).numpy()


@torch.inference_mode()
def pit_values(model, outputs, params, seed: int = 0) -> np.ndarray:
    """Randomized PIT value of every emitted token (see the module docstring)."""
    rng = np.random.default_rng(seed)
    values = []
    for out, sp in zip(outputs, params):
        p = sequence_probs(model, out, sp)[len(out.prompt_token_ids) - 1:]
        n = p.shape[0]
        order = np.argsort(-p, axis=1, kind="stable")
        sorted_p = np.take_along_axis(p, order, 1)
        before = np.cumsum(sorted_p, 1) - sorted_p
        rank = np.argsort(order, axis=1)[np.arange(n), np.array(out.token_ids)]
        values.append(before[np.arange(n), rank] + rng.random(n) * sorted_p[np.arange(n), rank])
    return np.concatenate(values) if values else np.zeros(0)


@torch.inference_mode()
def acceptance_pit_values(model, outputs, params, trace, seed: int = 1) -> np.ndarray:
    """Randomized PIT value of every accept decision on a one-hot drafter's drafts (see the module
    docstring); `trace`: the run's LLM.trace. Draft j of a verify step is reached when drafts
    0..j-1 were accepted; drafts past the request's last token (its length is fixed by max_tokens)
    are left out, which depends on no decision."""
    rng = np.random.default_rng(seed)
    steps: dict[int, list] = {}
    for step in trace:
        for r in step.requests:
            if r.num_draft:  # a verify row, or a resumed prefill verifying the drafts it held
                steps.setdefault(r.request_id, []).append(r)
    values = []
    for out, sp in zip(outputs, params):
        if not steps.get(out.request_id):
            continue
        p = sequence_probs(model, out, sp)
        for r in steps[out.request_id]:
            s = r.window_position  # the last committed token; draft j is token s + 1 + j
            for j in range(min(r.num_accepted + 1, r.num_draft)):
                if s + j >= p.shape[0]:
                    break
                px, v = p[s + j, r.draft_token_ids[j]], rng.random()
                values.append(v * px if j < r.num_accepted else px + v * (1 - px))
    return np.array(values)


def uniformity_p_value(u: np.ndarray, bins: int = PIT_BINS) -> float:
    observed = np.histogram(u, bins=bins, range=(0.0, 1.0))[0]
    return float(chisquare(observed).pvalue)
