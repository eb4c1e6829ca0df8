"""Ties in the sampler's cuts: top-k and top-p are thresholds on values, never positions in a sort.

bfloat16 ties the k-th largest logit with the next in about one row in 30, and which of equal
values a sort puts first differs between sort and topk, stable and unstable sorts, and devices.
The rule (engine/sampling.py processed_probs): top-k keeps every logit equal to the k-th largest;
top-p keeps the shortest run of the largest probabilities reaching top_p and every token tied
with its last one. So p depends on the row's values alone: these tests pin known answers, the
rule against an independent float64 statement of it on tie-heavy rows, a permutation of the
vocabulary (bit for bit), and batch shape and dtype.
"""
import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from engine.sampling import processed_probs


def process(logits, temperature=1.0, top_k=-1, top_p=1.0) -> torch.Tensor:
    return processed_probs(logits[None], torch.tensor([float(temperature)]), torch.tensor([top_k]),
                           torch.tensor([float(top_p)]))[0]


def support(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs).flatten().tolist())


def tied_logits(seed: int, shape: tuple[int, ...], step: float = 0.25) -> torch.Tensor:
    """Logits on a grid of `step` (bfloat16 rounding, coarser): most values are shared by several
    tokens, so the k-th largest and top-p's boundary often fall inside a tie group."""
    gen = torch.Generator().manual_seed(seed)
    return torch.round(torch.randn(shape, generator=gen) * 2 / step) * step


def value_rule(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> set[int]:
    """The support by the documented rule, written with topk's values (never its indices) in
    float64: top-k keeps every logit >= the k-th largest; top-p keeps the tokens at least as
    likely as the first one whose renormalised mass before it reaches top_p."""
    scaled = logits.double() / temperature
    k = top_k if 0 < top_k < len(logits) else len(logits)
    in_top_k = scaled >= scaled.topk(k).values[-1]
    p = torch.softmax(scaled.masked_fill(~in_top_k, -math.inf), -1)
    values = p.sort(descending=True).values
    before = values.cumsum(0) - values
    last = int((before < top_p).sum()) - 1 if top_p < 1 else len(values) - 1
    kept = (p >= values[max(last, 0)]) & in_top_k
    return set(torch.nonzero(kept).flatten().tolist())


def test_top_k_keeps_every_token_tied_with_the_k_th_and_top_p_the_whole_boundary_group():
    """Known answers on one row: [4, 2, 2, 2, 1, 1, 0], p = [.656, .089 x 3, .033 x 2, .012]. top_k 2
    cuts at the 2nd largest, which three tokens share: all stay. top_p 0.7 lands inside the group
    of 2s (mass before them .656, .745, .834), top_p 0.94 inside the group of 1s (.923, .955): each
    group stays whole."""
    logits = torch.tensor([4.0, 2.0, 2.0, 2.0, 1.0, 1.0, 0.0])
    assert support(process(logits, top_k=2)) == {0, 1, 2, 3}
    assert support(process(logits, top_k=1)) == {0}
    assert support(process(logits, top_k=5)) == {0, 1, 2, 3, 4, 5}
    before = (torch.softmax(logits, -1).cumsum(-1) - torch.softmax(logits, -1)).tolist()
    assert before[1] < 0.7 < before[2] and before[4] < 0.94 < before[5] and before[6] < 0.99
    assert support(process(logits, top_p=0.7)) == {0, 1, 2, 3}
    assert support(process(logits, top_p=0.94)) == {0, 1, 2, 3, 4, 5}
    assert support(process(logits, top_p=0.5)) == {0}
    assert support(process(logits, top_p=0.99)) == set(range(7))
    kept = process(logits, top_k=2, top_p=0.99)
    torch.testing.assert_close(kept, torch.softmax(logits.masked_fill(logits < 2, -math.inf), -1), rtol=0, atol=0)


@given(seed=st.integers(0, 10 ** 6), vocab=st.integers(2, 48), data=st.data())
def test_ties_follow_the_value_rule_and_a_permutation_of_the_vocabulary(seed, vocab, data):
    """On tie-heavy rows the support is the value rule's (value_rule, from topk's values in
    float64), and permuting the tokens permutes p bit for bit: no tied token is kept or dropped
    for its index or its place in the sort."""
    logits = tied_logits(seed, (vocab,))
    temperature = data.draw(st.sampled_from([0.5, 0.8, 1.0, 1.3]))
    top_k = data.draw(st.integers(-1, vocab + 2))
    top_p = data.draw(st.sampled_from([0.3, 0.5, 0.7, 0.9, 0.95, 1.0]))
    probs = process(logits, temperature, top_k, top_p)
    cumulative = torch.softmax(logits.double() / temperature, -1).sort(descending=True).values.cumsum(0)
    assume(all(abs(c - top_p) > 1e-5 for c in cumulative.tolist()))  # no float-rounding boundary
    assert support(probs) == value_rule(logits, temperature, top_k, top_p)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(process(logits[perm], temperature, top_k, top_p), probs[perm])


@given(seed=st.integers(0, 10 ** 6))
def test_tied_rows_give_the_same_p_whatever_the_batch_shape_and_dtype(seed):
    """Verify processes [R, k+1, V] with one parameter set per request, a proposer [R, k, V], a
    gate's reference one row in float64: each row's p is the same bit for bit in float32 (and the
    same support in float64), wherever it sits."""
    gen = torch.Generator().manual_seed(seed)
    logits = tied_logits(seed, (5, 3, 40))
    temperature = torch.tensor([0.0, 0.8, 1.0, 1.3, 0.6])
    top_k = torch.randint(-1, 12, (5,), generator=gen)
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.7, 0.95])
    batch = processed_probs(logits, temperature[:, None], top_k[:, None], top_p[:, None])
    for r in range(5):
        for w in range(3):
            alone = process(logits[r, w], float(temperature[r]), int(top_k[r]), float(top_p[r]))
            assert torch.equal(batch[r, w], alone)
            wide = processed_probs(logits[r, w].double()[None], temperature[r:r + 1].double(), top_k[r:r + 1],
                                   top_p[r:r + 1].double())[0]
            assert support(wide) == support(alone)


def test_top_k_beyond_the_finite_logits_or_the_vocabulary():
    """top_k at or past the vocabulary keeps every token; past the finite logits, the -inf ones get 0."""
    distinct = torch.tensor([3.0, 1.0, 2.0, 0.0])
    for top_k in (4, 5, 2 ** 63 - 1):
        assert process(distinct, top_k=top_k).tolist() == process(distinct).tolist()
    assert support(process(distinct, top_k=3)) == {0, 1, 2}
    logits = torch.tensor([1.0, -math.inf, 0.0, -math.inf])
    assert process(logits, top_k=3).tolist() == process(logits).tolist()
    assert process(logits, top_k=2 ** 63 - 1).tolist() == process(logits).tolist()
    assert support(process(logits, top_k=3)) == {0, 2}
    assert support(process(logits, top_k=0)) == {0, 2}


@pytest.mark.parametrize("vocab, top_p", [(2, 0.5), (4, 0.25), (4, 0.5), (4, 0.75)])
def test_a_top_p_cut_inside_a_tie_group_keeps_the_whole_group(vocab, top_p):
    """Equal logits tie every token: wherever the running mass reaches top_p, the group stays whole
    (which of equal tokens a sort puts first is no reason to keep one and drop another)."""
    probs = process(torch.zeros(vocab), top_p=top_p)
    assert probs.tolist() == [1 / vocab] * vocab
