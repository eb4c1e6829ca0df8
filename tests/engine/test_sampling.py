"""The counter-based sampler: keyed uniforms, processed probabilities, and the exponential race.

Statistical tests are chi-square tests (scipy.stats.chisquare / chi2_contingency) on fixed
keys, so they are deterministic: a pass is a pass on every machine. A property holds when its
p-value is above ALPHA = 1e-3; every such test has a negative control (a wrong distribution, or
a deliberately lossy sampler) whose p-value must fall below CONTROL_ALPHA = 1e-6, which shows
the test has the power to fail.
"""
import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import stats

from engine.errors import RequestError
from engine.sampling import (
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_SAMPLE,
    SamplingParams,
    keyed_uniform,
    processed_probs,
    request_key,
    sample_from_probs,
)

ALPHA = 1e-3
CONTROL_ALPHA = 1e-6
keys_st = st.integers(0, 2 ** 62 - 1)


def spread_keys(n: int, base: int = 12345) -> torch.Tensor:
    return torch.arange(n, dtype=torch.long) * 0x9E3779B1 + base


# ---- keyed uniforms ------------------------------------------------------------------------

# With 24-bit uniforms this key's lane 34 (position 0, sampling stream) rounded to exactly 1.0.
REGRESSION_KEY = 23277 * 7919 + 12345


def sweep_keys() -> torch.Tensor:
    return torch.cat([torch.tensor([REGRESSION_KEY]), spread_keys(1 << 14)])


def test_keyed_uniforms_are_strictly_inside_0_1():
    keys = sweep_keys()  # 4 million draws
    u = keyed_uniform(keys, torch.zeros_like(keys), STREAM_SAMPLE, 260)
    assert u.dtype == torch.float32 and u.shape == (len(keys), 260)
    assert u.min() > 0 and u.max() < 1
    assert -torch.log(u).min() > 0  # the exponential race never divides by zero


def test_keyed_uniforms_are_uniform():
    """Chi-square over 64 equal bins of 262,144 draws (4,096 keys x 64 lanes): p > ALPHA."""
    u = keyed_uniform(spread_keys(4096), torch.full((4096,), 7), STREAM_SAMPLE, 64).flatten()
    counts = torch.histc(u, bins=64, min=0, max=1)
    assert stats.chisquare(counts.numpy()).pvalue > ALPHA
    # Control: the same draws squared are not uniform.
    assert stats.chisquare(torch.histc(u ** 2, bins=64, min=0, max=1).numpy()).pvalue < CONTROL_ALPHA


@pytest.mark.parametrize("pair", ["position", "stream", "key"])
def test_neighbouring_uniforms_are_independent(pair):
    """Chi-square test of independence on a 10 x 10 table of (u, u') where u' is the next
    position, another stream, or the next key: p > ALPHA."""
    n = 20000
    keys, positions = spread_keys(n), torch.arange(n) % 97
    u = keyed_uniform(keys, positions, STREAM_SAMPLE, 1)[:, 0]
    other = {"position": keyed_uniform(keys, positions + 1, STREAM_SAMPLE, 1),
             "stream": keyed_uniform(keys, positions, STREAM_ACCEPT, 1),
             "key": keyed_uniform(keys + 1, positions, STREAM_SAMPLE, 1)}[pair][:, 0]
    table = torch.zeros(10, 10)
    table.index_put_(((u * 10).long(), (other * 10).long()), torch.ones(n), accumulate=True)
    assert stats.chi2_contingency(table.numpy()).pvalue > ALPHA
    # Control: u against itself is as dependent as it gets.
    same = torch.zeros(10, 10)
    same.index_put_(((u * 10).long(), (u * 10).long()), torch.ones(n), accumulate=True)
    assert stats.chi2_contingency(same.numpy()).pvalue < CONTROL_ALPHA


@given(key=keys_st, position=st.integers(0, 1 << 20),
       stream=st.sampled_from([STREAM_SAMPLE, STREAM_ACCEPT, STREAM_DRAFT]),
       others=st.lists(st.tuples(keys_st, st.integers(0, 1 << 20)), max_size=6), index=st.integers(0, 6))
def test_keyed_uniforms_are_a_pure_function_of_key_position_stream(key, position, stream, others, index):
    alone = keyed_uniform(torch.tensor([key]), torch.tensor([position]), stream, 16)[0]
    rows = list(others)
    rows.insert(min(index, len(rows)), (key, position))
    batch = keyed_uniform(torch.tensor([k for k, _ in rows]), torch.tensor([p for _, p in rows]), stream, 16)
    assert torch.equal(batch[min(index, len(others))], alone)  # whoever shares the batch
    assert torch.equal(keyed_uniform(torch.tensor([key]), torch.tensor([position]), stream, 16)[0], alone)
    # Each input matters.
    assert not torch.equal(keyed_uniform(torch.tensor([key ^ 1]), torch.tensor([position]), stream, 16)[0], alone)
    assert not torch.equal(keyed_uniform(torch.tensor([key]), torch.tensor([position + 1]), stream, 16)[0], alone)
    assert not torch.equal(keyed_uniform(torch.tensor([key]), torch.tensor([position]), stream + 1, 16)[0], alone)


@given(seed=st.integers(0, 2 ** 64 - 1), other=st.integers(0, 2 ** 64 - 1))
def test_request_key_depends_on_every_bit_of_the_seed(seed, other):
    assume(seed != other)
    engine_rng = torch.Generator().manual_seed(0)
    key = request_key(seed, engine_rng)
    assert 0 <= key < 1 << 62
    assert request_key(seed, torch.Generator().manual_seed(99)) == key  # not the engine's generator
    assert request_key(other, engine_rng) != key


def test_seeds_that_share_their_low_32_bits_get_different_keys():
    g = torch.Generator()
    keys = {request_key(s, g) for s in (1, 2 ** 32 + 1, 2 ** 63 + 1, 2 ** 64 - 1, 2 ** 63 - 1)}
    assert len(keys) == 5


# ---- processed probabilities ---------------------------------------------------------------

# keyed_uniform's known answers: (n + 0.5) / 2**23 for these n, per stream, at keys 0, 1,
# REGRESSION_KEY and 2**62 - 1 (positions 0, 7, 0, 123456), lanes 0 and 1.
KNOWN_LANES = {
    STREAM_SAMPLE: [[2297600, 6414728], [7254463, 506025], [2344530, 4125298], [7179225, 5583257]],
    STREAM_ACCEPT: [[1803454, 2232032], [4975936, 3676631], [4671112, 2943379], [7392644, 1237479]],
    STREAM_DRAFT: [[116267, 5105255], [5933519, 6433360], [6290647, 6703801], [4207626, 145665]],
}


@pytest.mark.parametrize("stream", sorted(KNOWN_LANES))
def test_keyed_uniforms_give_their_known_answers(stream):
    """A seeded request gives the same tokens on every machine and in every version of the
    engine only while these numbers hold: a change to the hash has to be deliberate."""
    keys = torch.tensor([0, 1, REGRESSION_KEY, (1 << 62) - 1])
    u = keyed_uniform(keys, torch.tensor([0, 7, 0, 123456]), stream, 2)
    assert u.tolist() == [[(n + 0.5) / (1 << 23) for n in row] for row in KNOWN_LANES[stream]]


def random_logits(seed: int, vocab: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * scale


def process(logits, temperature=1.0, top_k=-1, top_p=1.0) -> torch.Tensor:
    return processed_probs(logits[None], torch.tensor([float(temperature)]), torch.tensor([top_k]),
                           torch.tensor([float(top_p)]))[0]


def support(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs).flatten().tolist())


@given(seed=st.integers(0, 10 ** 6), vocab=st.integers(2, 64), data=st.data())
def test_top_k_keeps_exactly_the_k_largest(seed, vocab, data):
    logits = random_logits(seed, vocab)
    k = data.draw(st.integers(1, vocab))
    temperature = data.draw(st.sampled_from([0.5, 1.0, 2.0]))
    probs = process(logits, temperature, top_k=k)
    assert support(probs) == set(logits.topk(k).indices.tolist())
    expected = torch.softmax(logits.topk(k).values / temperature, -1)
    torch.testing.assert_close(probs[logits.topk(k).indices], expected)


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_top_p_stops_at_the_token_whose_mass_reaches_p_exactly(kept):
    """top_p set to the float32 mass before token `kept` (as the sampler sums it): the run of
    tokens whose mass before them is below top_p is kept, and not one token more."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    sorted_probs = torch.softmax(logits, -1)
    top_p = float((sorted_probs.cumsum(-1) - sorted_probs)[kept])
    probs = process(logits, top_p=top_p)
    assert support(probs) == set(range(kept))
    assert probs.sum().item() == pytest.approx(1.0)


@given(seed=st.integers(0, 10 ** 6), vocab=st.integers(2, 64), top_p=st.floats(0.01, 1.0),
       temperature=st.sampled_from([0.7, 1.0, 1.5]), top_k=st.sampled_from([-1, 0, 3, 10]))
def test_top_p_keeps_the_smallest_prefix_reaching_p(seed, vocab, top_p, temperature, top_k):
    logits = random_logits(seed, vocab).double()
    # top-k first, then top-p over the renormalized top-k distribution.
    k = top_k if 0 < top_k < vocab else vocab
    order = logits.argsort(descending=True)[:k]
    p = torch.softmax(logits[order] / temperature, -1)
    cumulative = p.cumsum(0)
    assume(all(abs(c - top_p) > 1e-4 for c in cumulative.tolist()[:-1]))  # no float-rounding ties
    num_kept = int((cumulative < top_p).sum()) + 1
    num_kept = min(num_kept, k)
    probs = process(logits.float(), temperature, top_k=top_k, top_p=top_p)
    assert support(probs) == set(order[:num_kept].tolist())
    assert probs[order[:num_kept]].double().sum() == pytest.approx(1.0, abs=1e-5)
    if num_kept > 1:  # kept tokens keep their relative odds
        ratio = probs[order[0]].double() / probs[order[1]].double()
        assert ratio.item() == pytest.approx((p[0] / p[1]).item(), rel=1e-4)


@given(seed=st.integers(0, 10 ** 6), vocab=st.integers(2, 64), top_k=st.sampled_from([-1, 0, 1, 5]),
       top_p=st.sampled_from([0.1, 0.9, 1.0]))
def test_temperature_zero_is_one_hot_argmax(seed, vocab, top_k, top_p):
    logits = random_logits(seed, vocab)
    probs = process(logits, 0.0, top_k=top_k, top_p=top_p)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(), vocab).float())


@given(seed=st.integers(0, 10 ** 6), temperature=st.floats(0.05, 5.0))
def test_no_filters_is_the_tempered_softmax(seed, temperature):
    logits = random_logits(seed, 40)
    torch.testing.assert_close(process(logits, temperature), torch.softmax(logits / temperature, -1))


@given(rows=st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from([0.0, 0.6, 1.0, 1.7]),
                               st.sampled_from([-1, 0, 1, 7]), st.sampled_from([0.3, 0.95, 1.0])),
                     min_size=1, max_size=8))
def test_each_row_is_processed_with_its_own_params(rows):
    logits = torch.stack([random_logits(s, 50) for s, *_ in rows])
    batch = processed_probs(logits, torch.tensor([t for _, t, _, _ in rows]),
                            torch.tensor([k for _, _, k, _ in rows]), torch.tensor([p for *_, p in rows]))
    for r, (_, t, k, p) in enumerate(rows):
        torch.testing.assert_close(batch[r], process(logits[r], t, k, p), rtol=0, atol=1e-7)


# ---- the exponential race ------------------------------------------------------------------

TARGET = torch.tensor([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])
NUM_DRAWS = 40000


def chisquare_pvalue(samples: torch.Tensor, dist: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=len(dist)).double()
    expected = dist.double() / dist.double().sum() * len(samples)
    return stats.chisquare(counts.numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("over", ["keys", "positions"])
def test_sampler_reproduces_the_distribution(over):
    """40,000 draws from TARGET, over many keys at one position (many requests) or one key over
    many positions (one request's stream); chi-square goodness of fit: p > ALPHA."""
    if over == "keys":
        keys, positions = spread_keys(NUM_DRAWS), torch.full((NUM_DRAWS,), 3)
    else:
        keys, positions = torch.full((NUM_DRAWS,), 987654321), torch.arange(NUM_DRAWS)
    samples = sample_from_probs(TARGET.expand(NUM_DRAWS, -1), keys, positions)
    assert chisquare_pvalue(samples, TARGET) > ALPHA
    # Negative control 1: the same samples against a slightly wrong distribution (1% of the
    # mass moved from the first token to the last) must be rejected.
    wrong = TARGET.clone()
    wrong[0] -= 0.01
    wrong[-1] += 0.01
    assert chisquare_pvalue(samples, wrong) < CONTROL_ALPHA
    # Negative control 2: a lossy sampler (the target sharpened as if by temperature 0.9)
    # must be rejected against the target.
    sharpened = TARGET ** (1 / 0.9)
    lossy = sample_from_probs((sharpened / sharpened.sum()).expand(NUM_DRAWS, -1), keys, positions)
    assert chisquare_pvalue(lossy, TARGET) < CONTROL_ALPHA


def test_zero_probability_tokens_are_never_sampled():
    keys = sweep_keys()
    n = len(keys)
    positions = torch.zeros(n, dtype=torch.long)
    logits = random_logits(0, 260)
    greedy = process(logits, temperature=0).expand(n, -1)
    assert (sample_from_probs(greedy, keys, positions) == logits.argmax()).all()
    top3 = process(logits, temperature=1, top_k=3).expand(n, -1)
    sampled = sample_from_probs(top3, keys, positions)
    assert set(sampled.unique().tolist()) == set(logits.topk(3).indices.tolist())


# ---- SamplingParams --------------------------------------------------------------------------

valid_params = st.builds(
    SamplingParams, temperature=st.floats(0, 10), top_k=st.integers(-1, 1000),
    top_p=st.floats(0, 1, exclude_min=True), seed=st.none() | st.integers(0, 2 ** 64 - 1),
    max_tokens=st.integers(1, 10 ** 6), stop_token_ids=st.lists(st.integers(0, 259), max_size=4),
    ignore_eos=st.booleans())


@given(params=valid_params)
def test_valid_sampling_params_round_trip(params):
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    assert SamplingParams(**fields) == params
    assert params.is_greedy == (params.temperature == 0)


invalid_values = st.one_of(
    st.tuples(st.just("temperature"), st.floats(max_value=-1e-12) | st.just(math.inf) | st.just(math.nan)),
    st.tuples(st.just("top_p"), st.floats(max_value=0) | st.floats(min_value=1.0000001) | st.just(math.nan)),
    st.tuples(st.just("top_k"), st.integers(max_value=-2)),
    st.tuples(st.just("max_tokens"), st.integers(max_value=0)),
    st.tuples(st.just("seed"), st.integers(max_value=-1) | st.integers(min_value=2 ** 64) | st.floats()),
)


@given(case=invalid_values)
def test_invalid_sampling_params_name_the_field(case):
    field, value = case
    with pytest.raises(RequestError, match=f"^{field} must be"):
        SamplingParams(**{field: value})
