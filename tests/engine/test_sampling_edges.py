"""Sampling values at their edges can never poison the engine: each is refused when added, or has
a defined meaning; a request that fails while a step runs fails alone and the engine keeps serving."""
import pytest
import torch

from engine import SamplingParams
from engine.errors import RequestError
from engine.sampling import MAX_TOP_K, MIN_TEMPERATURE, processed_probs

PROMPTS = ["def main(", "import os\n", "class A:\n    "]


def greedy(max_tokens=12, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


@pytest.mark.parametrize("temperature", [1e-38, 5e-324, 1e-6])
def test_a_temperature_too_small_to_divide_by_is_greedy(make_llm, temperature):
    params = SamplingParams(temperature=temperature, max_tokens=12, ignore_eos=True, seed=1)
    assert params.temperature == 0 and params.is_greedy
    llm = make_llm()
    tiny = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in tiny] == [o.token_ids for o in llm.generate(PROMPTS, greedy())]


def test_the_smallest_sampled_temperature_gives_finite_probabilities():
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE  # sampled, as vLLM
    assert SamplingParams(temperature=MIN_TEMPERATURE / 2).temperature == 0.0
    logits = torch.tensor([[30.0, -30.0, 0.0]])
    probs = processed_probs(logits, torch.tensor([1e-5]), torch.tensor([-1]), torch.tensor([1.0]))
    assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0)
    # sampled, not greedy: two tied tokens share the mass instead of the argmax taking it all
    tied = processed_probs(torch.tensor([[1.0, 1.0]]), torch.tensor([MIN_TEMPERATURE]), torch.tensor([-1]),
                           torch.tensor([1.0]))
    assert tied.tolist() == [[0.5, 0.5]]


@pytest.mark.parametrize("top_k", [MAX_TOP_K + 1, 2 ** 64])
def test_top_k_beyond_int64_is_refused_when_made(top_k):
    with pytest.raises(RequestError, match="top_k must be .* below 2\\*\\*63"):
        SamplingParams(top_k=top_k)


def test_top_k_beyond_the_vocabulary_is_refused_at_add_time_and_the_engine_keeps_serving(make_llm):
    llm = make_llm()
    expected = [o.token_ids for o in llm.generate(PROMPTS, greedy())]
    for top_k in (261, MAX_TOP_K):
        with pytest.raises(RequestError, match=rf"top_k \({top_k}\) exceeds the vocabulary \(260\)"):
            llm.generate(PROMPTS, SamplingParams(top_k=top_k))
    assert SamplingParams(top_k=260).top_k == 260
    whole = llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=260, seed=1, max_tokens=4, ignore_eos=True))
    assert [len(o.token_ids) for o in whole] == [4, 4, 4]
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy())] == expected


@pytest.mark.parametrize("row", [[0.0, -20.0, -20.0], [5.0, -40.0, -40.0, -40.0], [0.0, 0.0, -100.0]])
def test_top_p_one_is_the_identity(row):
    logits = torch.tensor([row])
    probs = processed_probs(logits, torch.tensor([1.0]), torch.tensor([-1]), torch.tensor([1.0]))
    assert torch.equal(probs, torch.softmax(logits, -1))
    assert (probs > 0).all()


def test_top_p_one_keeps_every_token_of_a_large_vocabulary():
    logits = torch.randn(2, 128_256, generator=torch.Generator().manual_seed(0)) * 6
    probs = processed_probs(logits, torch.ones(2), torch.full((2,), -1), torch.ones(2))
    assert (probs > 0).sum().item() == (torch.softmax(logits, -1) > 0).sum().item()


@pytest.mark.parametrize("top_p", [1e-50, 5e-324])
def test_a_top_p_that_float32_rounds_to_zero_keeps_the_most_likely_token(make_llm, top_p):
    """A top_p inside (0, 1] is accepted, however small; the step's float32 makes these 0. The
    shortest run whose mass reaches it is still the most likely token alone: sampling is greedy."""
    params = SamplingParams(temperature=1.0, top_p=top_p, max_tokens=12, ignore_eos=True, seed=1)
    assert params.top_p == top_p and torch.tensor([top_p]).item() == 0.0
    llm = make_llm()
    tiny = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in tiny] == [o.token_ids for o in llm.generate(PROMPTS, greedy())]
    probs = processed_probs(torch.tensor([[0.5, 2.0, -1.0]]), torch.tensor([1.0]), torch.tensor([-1]),
                            torch.tensor([top_p]))
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


class FailsOnCall:
    """A logits processor that raises on its n-th call: a failure forced inside the step."""

    def __init__(self, n: int):
        self.n, self.calls = n, 0

    def __call__(self, output_ids, row):
        self.calls += 1
        if self.calls == self.n:
            raise RuntimeError("forced failure")
        return row


@pytest.mark.parametrize("async_runner", [False, True])
@pytest.mark.parametrize("spec", [None, "ngram"])
def test_a_request_failing_inside_the_step_fails_alone(make_llm, async_runner, spec):
    llm = make_llm(async_runner=async_runner, spec=spec, max_num_seqs=4)
    expected = [o.token_ids for o in llm.generate(PROMPTS, greedy())]
    params = [greedy(), greedy(logits_processors=[FailsOnCall(3)]), greedy()]
    outs = llm.generate(PROMPTS, params)
    assert [o.finish_reason for o in outs] == ["length", "error", "length"]
    proc = params[1].logits_processors[0]  # an object without a __name__: named by its repr
    assert outs[1].error == f"logits processor {proc!r} failed: RuntimeError: forced failure"
    assert outs[1].token_ids == expected[1][:2]
    assert outs[1].stats.num_truncated == 0  # it ends where it failed: nothing it emitted is cut
    assert [outs[0].token_ids, outs[2].token_ids] == [expected[0], expected[2]]
    # The engine keeps serving: the same LLM runs the same batch again, identically.
    assert [o.token_ids for o in llm.generate(PROMPTS, greedy())] == expected
    assert not llm.has_unfinished()


def test_a_failed_request_ends_at_the_step_it_failed_in(make_llm):
    """Its processor fails on its third call: the third step that samples for it (steps 0, 1, 2);
    a step hands it back finished, once."""
    llm = make_llm(max_num_seqs=4)
    failing = llm.add_request(PROMPTS[1], greedy(logits_processors=[FailsOnCall(3)]))
    llm.add_request(PROMPTS[0], greedy())
    returned = []
    while llm.has_unfinished():
        returned.append(llm.step())
    assert failing.finish_reason == "error" and failing.finish_step == 2
    assert sum(failing in done for done in returned) == 1


def truncated(ids, row):
    return row[:3]


def listed(ids, row):
    return row.tolist()


@pytest.mark.parametrize("proc, returned", [(truncated, "Tensor torch.Size([3])"), (listed, "list ")])
def test_a_processor_returning_a_wrong_shape_fails_its_request_alone(make_llm, proc, returned):
    """The error names the processor, what it returned (its type, and its shape if it has one)
    and the row it should have returned."""
    llm = make_llm()
    outs = llm.generate(PROMPTS[:2], [greedy(), greedy(logits_processors=[proc])])
    assert [o.finish_reason for o in outs] == ["length", "error"] and outs[1].token_ids == []
    vocab = llm.model.config.vocab_size
    assert outs[1].error == (f"logits processor {proc.__name__!r} failed: TypeError: returned {returned}, "
                             f"not a logits row of shape ({vocab},)")


def all_nan(ids, row):
    return torch.full_like(row, float("nan"))


def all_minus_inf(ids, row):
    return torch.full_like(row, float("-inf"))


@pytest.mark.parametrize("proc", [all_nan, all_minus_inf])
def test_a_processor_leaving_no_possible_token_fails_its_request_instead_of_emitting_token_0(make_llm, proc):
    """transformers raises on such a row; argmax over it would emit token 0 at every step."""
    llm = make_llm()
    outs = llm.generate(PROMPTS[:2], [greedy(), greedy(logits_processors=[proc])])
    assert [o.finish_reason for o in outs] == ["length", "error"] and outs[1].token_ids == []
    assert outs[1].error == (f"logits processor {proc.__name__!r} failed: ValueError: returned a row with every "
                             f"logit NaN or -inf: no token can be chosen (transformers raises here too); leave at "
                             f"least one token finite")
