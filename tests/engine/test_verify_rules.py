"""verify() rule by rule, on small hand-made distributions (exact, no statistics).

test_verify.py checks the greedy rule and, by chi-square, that sampled verification is lossless.
Here each part of the rule is pinned exactly: which uniform decides each draft, the strict
`u < p/q` test, where the correction after a rejection may land (one-hot and sampled drafters,
k = 1 included), the fallback to p when a rejection leaves no residual mass, and that padding
may hold any id.
"""
import math

import pytest
import torch

from engine.sampling import STREAM_ACCEPT, SamplingTensors, keyed_uniform, processed_probs, sample_from_probs
from engine.verify import verify

NEG = -math.inf


def logits_of(probs: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax (temperature 1, no filters) is `probs`; zero stays exactly zero."""
    return torch.where(probs > 0, probs.log(), torch.tensor(NEG))


def run(logits, drafts, num_draft, draft_probs, keys, first_position):
    num_reqs = logits.shape[0]
    return verify(logits, drafts, num_draft, draft_probs, sampling(torch.ones(num_reqs), keys), first_position)


def sampling(temperature, keys) -> SamplingTensors:
    """Plain sampling at `temperature`: no top-k, no top-p."""
    n = keys.shape[0]
    return SamplingTensors(temperature=temperature, top_k=torch.full((n,), -1), top_p=torch.ones(n), keys=keys)


def accept_uniform(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return keyed_uniform(keys, positions, STREAM_ACCEPT, 1)[..., 0]


def test_each_draft_is_decided_by_the_uniform_of_its_own_position():
    """Draft j of a row is accepted iff u(key, first_position + j) < p(x_j) / q(x_j), and
    acceptance stops at the first rejection: checked against that formula, row by row."""
    gen = torch.Generator().manual_seed(1)
    num_reqs, k, vocab = 400, 3, 5
    p = torch.softmax(torch.randn(num_reqs, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(num_reqs, k, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(num_reqs, k)
    num_draft = torch.randint(0, k + 1, (num_reqs,), generator=gen)
    keys = torch.arange(num_reqs) * 7919 + 11
    first_position = torch.randint(1, 200, (num_reqs,), generator=gen)
    logits = logits_of(p)
    _, num_accepted = run(logits, drafts, num_draft, q, keys, first_position)

    p_used = processed_probs(logits, torch.ones(num_reqs, 1), torch.full((num_reqs, 1), -1), torch.ones(num_reqs, 1))
    p_x = p_used[:, :-1].gather(-1, drafts[..., None])[..., 0]
    q_x = q.gather(-1, drafts[..., None])[..., 0]
    u = accept_uniform(keys[:, None], first_position[:, None] + torch.arange(k))
    ok = (torch.arange(k) < num_draft[:, None]) & (u < p_x / q_x)
    expected = ok.long().cumprod(1).sum(1)
    assert num_accepted.tolist() == expected.tolist()
    assert len(set(expected.tolist())) == k + 1  # every count from 0 to k occurred


def test_a_draft_whose_ratio_equals_its_uniform_is_rejected():
    """Acceptance is strict: u < p/q. Rows where p(x)/q(x) is exactly the row's uniform reject
    their draft, and the correction comes from the residual, never the draft itself."""
    keys = torch.arange(4000)
    u = accept_uniform(keys, torch.zeros_like(keys))
    half = torch.tensor(0.5)
    ties = []
    for key, u0 in zip(keys.tolist(), u.tolist()):
        if u0 <= 0.55:
            continue
        q_x = half / torch.tensor(u0)
        for cand in (q_x, torch.nextafter(q_x, torch.tensor(1.0)), torch.nextafter(q_x, torch.tensor(0.0))):
            if cand <= 1 and (half / cand).item() == u0:
                ties.append((key, cand.item()))
                break
        if len(ties) == 8:
            break
    assert len(ties) == 8, "no exact ties were found"
    num_reqs, vocab = len(ties), 3
    # p = (0.5, 0.5, 0) at the draft row; draft x = 0 with q(x) chosen so p(x)/q(x) == u exactly.
    p = torch.tensor([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]).expand(num_reqs, 2, vocab)
    q = torch.tensor([[[c, 0.0, 1 - c]] for _, c in ties])
    _, num_accepted = run(logits_of(p), torch.zeros(num_reqs, 1, dtype=torch.long),
                          torch.ones(num_reqs, dtype=torch.long),
                          q, torch.tensor([key for key, _ in ties]), torch.zeros(num_reqs, dtype=torch.long))
    assert num_accepted.tolist() == [0] * num_reqs


@pytest.mark.parametrize("k", [1, 3])
def test_one_hot_drafter_correction_is_never_the_rejected_draft(k):
    """q is one-hot at the draft x, so the residual max(0, p - q) has no mass at x: a rejected
    draft is never emitted as its own correction, and the correction is in p's support."""
    num_reqs, vocab, x = 600, 4, 2
    p = torch.tensor([0.25, 0.25, 0.5, 0.0]).expand(num_reqs, k + 1, vocab)
    drafts = torch.full((num_reqs, k), x)
    sampled, num_accepted = run(logits_of(p), drafts, torch.full((num_reqs,), k), None, torch.arange(num_reqs),
                                torch.zeros(num_reqs, dtype=torch.long))
    rejected = num_accepted < k
    assert rejected.any() and (~rejected).any()
    corrections = sampled[torch.arange(num_reqs), num_accepted][rejected]
    assert set(corrections.tolist()) == {0, 1}


@pytest.mark.parametrize("k", [1, 2])
def test_sampled_drafter_correction_comes_from_the_residual(k):
    """p = (.5, .5, 0, 0), q = (.5, 0, .5, 0): the draft 2 has p = 0 and is always rejected, and
    the residual max(0, p - q) is all on token 1, so every correction is 1. The draft 0 has
    p/q = 1 and is always accepted."""
    num_reqs, vocab = 300, 4
    p = torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(num_reqs, k + 1, vocab)
    q = torch.tensor([0.5, 0.0, 0.5, 0.0]).expand(num_reqs, k, vocab).clone()
    first = torch.where(torch.arange(num_reqs) % 2 == 0, 2, 0)  # even rows draft 2 first, odd rows draft 0 throughout
    drafts = first[:, None].expand(num_reqs, k).clone()
    sampled, num_accepted = run(logits_of(p), drafts, torch.full((num_reqs,), k), q, torch.arange(num_reqs),
                                torch.zeros(num_reqs, dtype=torch.long))
    assert num_accepted[0::2].tolist() == [0] * (num_reqs // 2)
    assert sampled[0::2, 0].tolist() == [1] * (num_reqs // 2)
    assert num_accepted[1::2].tolist() == [k] * (num_reqs // 2)
    assert set(sampled[1::2, k].tolist()) == {0, 1}  # the bonus token, from p


def test_a_rejection_without_residual_mass_draws_from_p():
    """When q covers p everywhere (rounding can leave it so), a rejection has no residual mass:
    the correction is then drawn from p, never a token p gives zero probability. Other rows in
    the batch have ordinary residuals, which must not leak into it."""
    num_reqs, vocab = 200, 4
    p = torch.tensor([0.0, 0.5, 0.5, 0.0]).expand(num_reqs, 2, vocab)
    covering = torch.tensor([0.0, 0.5, 0.75, 0.0])       # >= p everywhere: no residual
    ordinary = torch.tensor([0.0, 0.0, 1.0, 0.0])        # residual on token 1
    q = torch.where(torch.arange(num_reqs)[:, None, None] % 2 == 0, covering, ordinary).expand(num_reqs, 1, vocab)
    drafts = torch.full((num_reqs, 1), 2)
    sampled, num_accepted = run(logits_of(p), drafts, torch.ones(num_reqs, dtype=torch.long), q,
                                torch.arange(num_reqs), torch.zeros(num_reqs, dtype=torch.long))
    rejected_covering = (num_accepted == 0) & (torch.arange(num_reqs) % 2 == 0)
    assert rejected_covering.any()
    assert set(sampled[rejected_covering, 0].tolist()) <= {1, 2}
    assert set(sampled[(num_accepted == 0) & (torch.arange(num_reqs) % 2 == 1), 0].tolist()) == {1}


def test_the_token_after_the_prefix_is_drawn_with_its_own_position_s_key():
    """Every real draft is certain under p, so all are accepted and the bonus token, at position
    first_position + num_draft, must be sample_from_probs with that position's key: the noise
    plain decoding draws there, never a neighbour's (reused noise correlates tokens)."""
    gen = torch.Generator().manual_seed(5)
    num_reqs, k, vocab = 64, 3, 6
    num_draft = torch.arange(num_reqs) % (k + 1)
    drafts = torch.randint(0, vocab, (num_reqs, k), generator=gen)
    probs = torch.softmax(torch.randn(num_reqs, k + 1, vocab, generator=gen), -1)
    real = torch.arange(k) < num_draft[:, None]
    probs[:, :-1] = torch.where(real[..., None], torch.nn.functional.one_hot(drafts, vocab).float(), probs[:, :-1])
    keys = torch.randint(0, 1 << 62, (num_reqs,), generator=gen)
    first_position = torch.randint(0, 1000, (num_reqs,), generator=gen)
    logits = logits_of(probs)
    sampled, num_accepted = run(logits, drafts, num_draft, None, keys, first_position)
    assert num_accepted.tolist() == num_draft.tolist()
    rows = torch.arange(num_reqs)
    p = processed_probs(logits, torch.ones(num_reqs, 1), torch.full((num_reqs, 1), -1), torch.ones(num_reqs, 1))
    bonus = sample_from_probs(p[rows, num_draft], keys, first_position + num_draft)
    assert sampled[rows, num_draft].tolist() == bonus.tolist()


@pytest.mark.parametrize("pad", [-1, 259, 260, 10 ** 6])
def test_padding_drafts_may_hold_any_id(pad):
    """Only the first num_draft drafts are real; padding is never looked up as a token, so an id
    outside the vocabulary (or -1) gives the same result as padding with 0."""
    vocab, k = 260, 3
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, k + 1, vocab, generator=gen)
    real = logits[:, :-1].argmax(-1)
    num_draft = torch.tensor([0, 1, 2, 3])
    keep = torch.arange(k) < num_draft[:, None]
    args = (num_draft, None, sampling(torch.zeros(4), torch.arange(4)), torch.zeros(4, dtype=torch.long))
    padded = verify(logits, torch.where(keep, real, pad), *args)
    zeros = verify(logits, torch.where(keep, real, 0), *args)
    assert padded[0].tolist() == zeros[0].tolist() and padded[1].tolist() == [0, 1, 2, 3]


def test_rows_without_drafts_accept_an_empty_q():
    """k = 0 with a drafter that has q: draft_probs is [R, 0, V], and each row draws its one
    token from p, as with draft_probs None."""
    logits = torch.randn(3, 1, 10, generator=torch.Generator().manual_seed(4))
    args = (torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long))
    rest = (sampling(torch.ones(3), torch.arange(3)), torch.zeros(3, dtype=torch.long))
    with_q = verify(logits, *args, torch.zeros(3, 0, 10), *rest)
    without = verify(logits, *args, None, *rest)
    assert with_q[0].tolist() == without[0].tolist() and with_q[1].tolist() == [0, 0, 0]
