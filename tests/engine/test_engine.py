"""End-to-end properties of the engine on the fixture target (plain decoding, CPU).

The reference for every property is the same request run alone: greedy decoding is
deterministic and seeded sampling is counter-based, so batching, arrival times, preemption and
the choice of runner must not change a single token.
"""
import functools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import LLM, SamplingParams
from engine.tokenizer import EOS_ID
from fixtures import TARGET_DIR

# Mixed prompt lengths; EOS_PROMPT makes the model write "\n" and then EOS.
EOS_PROMPT = 'if __name__ == "__main__":\n    main()'
PROMPTS = ["def main(", "import os\n", "x", EOS_PROMPT,
           "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, item):\n",
           "for i in range(10):\n" * 5]
MAX_TOKENS = 12


def greedy(max_tokens=MAX_TOKENS, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def engine(**kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("max_num_batched_tokens", 1024)
    return LLM(TARGET_DIR, **kwargs)


@functools.cache
def alone(prompt: str, params_key: tuple) -> tuple[tuple[int, ...], str]:
    """(tokens, finish_reason) of one request run by itself on the sync runner."""
    fields = dict(params_key)
    fields["stop_token_ids"] = list(fields["stop_token_ids"])
    out, = engine(async_runner=False).generate([prompt], SamplingParams(**fields))
    return tuple(out.token_ids), out.finish_reason


def key(params: SamplingParams) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in vars(params).items() if k != "logits_processors"))


def expected_greedy(prompt: str, max_tokens: int) -> list[int]:
    """Greedy tokens are a prefix of a longer greedy run (up to and including EOS)."""
    tokens, _ = alone(prompt, key(greedy(MAX_TOKENS)))
    return list(tokens[:max_tokens])


def first_steps(trace) -> dict[int, int]:
    first = {}
    for step in trace:
        for r in step.requests:
            first.setdefault(r.request_id, step.step)
    return first


# ---- continuous batching -------------------------------------------------------------------

@given(batch=st.lists(st.tuples(st.sampled_from(PROMPTS), st.integers(1, MAX_TOKENS)), min_size=2, max_size=7),
       max_num_seqs=st.integers(1, 3), async_runner=st.booleans())
def test_batched_greedy_equals_each_prompt_alone(batch, max_num_seqs, async_runner):
    llm = engine(max_num_seqs=max_num_seqs, async_runner=async_runner, trace=True)
    outs = llm.generate([p for p, _ in batch], [greedy(m) for _, m in batch])
    for (prompt, max_tokens), out in zip(batch, outs):
        expected = expected_greedy(prompt, max_tokens)
        assert out.token_ids == expected
        assert out.finish_reason == ("stop" if expected[-1] == EOS_ID else "length")
    # The case occurred: never more than max_num_seqs per step, and later requests waited.
    assert max(s.num_reqs for s in llm.trace) <= max_num_seqs
    if len(batch) > max_num_seqs:
        assert max(first_steps(llm.trace).values()) > 0


def test_continuous_batching_mixes_prefill_and_decode():
    llm = engine(max_num_seqs=2, trace=True)
    outs = llm.generate(PROMPTS, [greedy(2 + 2 * i) for i in range(len(PROMPTS))])
    assert [o.token_ids for o in outs] == [expected_greedy(p, 2 + 2 * i) for i, p in enumerate(PROMPTS)]
    mixed = [s for s in llm.trace if {r.is_prefill for r in s.requests} == {True, False}]
    assert mixed, "no step ran a new request's prefill next to another request's decode"


@given(arrivals=st.lists(st.integers(0, 8), min_size=len(PROMPTS), max_size=len(PROMPTS)),
       async_runner=st.booleans())
def test_arrival_steps_do_not_change_greedy_tokens(arrivals, async_runner):
    llm = engine(max_num_seqs=3, async_runner=async_runner, trace=True)
    outs = llm.generate(PROMPTS, greedy(), arrival_steps=arrivals)
    assert [o.token_ids for o in outs] == [expected_greedy(p, MAX_TOKENS) for p in PROMPTS]
    first = first_steps(llm.trace)
    assert all(first[o.request_id] >= a for o, a in zip(outs, arrivals))  # nobody ran early


# ---- finishing -----------------------------------------------------------------------------

def test_max_tokens_gives_exact_length():
    outs = engine().generate(PROMPTS, [greedy(m, ignore_eos=True) for m in (1, 2, 5, 8, 12, 3)])
    assert [len(o.token_ids) for o in outs] == [1, 2, 5, 8, 12, 3]
    assert {o.finish_reason for o in outs} == {"length"}


def test_stop_token_ids_end_each_request_at_its_first_stop_token():
    refs = [list(alone(p, key(greedy(ignore_eos=True)))[0]) for p in PROMPTS]
    # Stop each request at the first occurrence of its output's third distinct token.
    stops = [list(dict.fromkeys(r))[2] for r in refs]
    outs = engine(max_num_seqs=3).generate(PROMPTS, [greedy(ignore_eos=True, stop_token_ids=[s]) for s in stops])
    for ref, stop, out in zip(refs, stops, outs):
        assert out.token_ids == ref[:ref.index(stop) + 1]
        assert out.token_ids[-1] == stop
        assert out.finish_reason == "stop"
        assert len(out.token_ids) < MAX_TOKENS  # the case occurred: a stop before max_tokens


def test_stop_token_in_the_prompt_does_not_stop():
    ref = expected_greedy("def main(", MAX_TOKENS)
    assert ord("(") not in ref
    out, = engine().generate(["def main("], greedy(stop_token_ids=[ord("(")]))
    assert out.token_ids == ref and out.finish_reason == "length"


def test_eos_stops_unless_ignore_eos():
    llm = engine()
    stopped, ignored, explicit = llm.generate(
        [EOS_PROMPT] * 3, [greedy(), greedy(ignore_eos=True), greedy(ignore_eos=True, stop_token_ids=[EOS_ID])])
    assert stopped.token_ids[-1] == EOS_ID and stopped.finish_reason == "stop"
    assert len(stopped.token_ids) < MAX_TOKENS
    assert ignored.token_ids[:len(stopped.token_ids)] == stopped.token_ids
    assert len(ignored.token_ids) == MAX_TOKENS and ignored.finish_reason == "length"
    assert explicit.token_ids == stopped.token_ids and explicit.finish_reason == "stop"
    assert stopped.text == "\n"  # EOS is dropped from the text


def test_output_fills_the_context_exactly_at_max_model_len():
    prompt = "for i in range(10):\n" * 12  # 240 bytes + BOS
    out, = engine().generate([prompt], greedy(40, ignore_eos=True))
    assert len(out.prompt_token_ids) + len(out.token_ids) == 256
    assert out.finish_reason == "context"  # cut by max_model_len, not by max_tokens ("length")
    longer, = engine(max_model_len=512).generate([prompt], greedy(40, ignore_eos=True))
    assert out.token_ids == longer.token_ids[:len(out.token_ids)]


# ---- preemption ----------------------------------------------------------------------------

PREEMPT_PROMPTS = ["def main(" * 10, "import os\n" * 9, "class A:\n    pass\n" * 5,
                   "for i in range(10):\n" * 4, "x = 1\n" * 15]


@pytest.mark.parametrize("async_runner", [True, False])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "seeded"])
def test_preempted_requests_finish_with_unpreempted_tokens(async_runner, sampled):
    params = [SamplingParams(temperature=0.8, seed=10 + i, max_tokens=40) if sampled else greedy(40)
              for i in range(len(PREEMPT_PROMPTS))]
    reference = engine(async_runner=async_runner).generate(PREEMPT_PROMPTS, params)
    # 18 blocks of 16 tokens barely hold one full-length request: the prompts (~90 tokens)
    # plus 40 new tokens need 9 blocks each, so running requests must be preempted to grow.
    outs = engine(async_runner=async_runner, num_kv_blocks=18, block_size=16).generate(PREEMPT_PROMPTS, params)
    assert sum(o.stats.num_preemptions for o in reference) == 0
    assert sum(o.stats.num_preemptions for o in outs) > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert all(len(o.token_ids) == 40 or o.finish_reason == "stop" for o in outs)


# ---- seeded sampling -----------------------------------------------------------------------

PROBES = [SamplingParams(temperature=0.8, seed=7, max_tokens=MAX_TOKENS),
          SamplingParams(temperature=0.8, seed=2 ** 40 + 7, max_tokens=MAX_TOKENS, top_k=20, top_p=0.9)]
others = st.lists(st.tuples(
    st.sampled_from(PROMPTS),
    st.one_of(st.just(greedy()),
              st.builds(lambda s, m: SamplingParams(temperature=1.0, seed=s, max_tokens=m),
                        st.integers(0, 2 ** 63), st.integers(1, MAX_TOKENS)),
              st.builds(lambda t: SamplingParams(temperature=t, max_tokens=MAX_TOKENS),
                        st.sampled_from([0.5, 1.0, 1.5])))),
    max_size=5)


@given(probe=st.sampled_from(PROBES), prompt=st.sampled_from(PROMPTS), others=others,
       position=st.integers(0, 5), max_num_seqs=st.integers(1, 4), async_runner=st.booleans())
def test_seeded_request_is_the_same_alone_and_in_any_batch(probe, prompt, others, position,
                                                           max_num_seqs, async_runner):
    batch = list(others)
    position = min(position, len(batch))
    batch.insert(position, (prompt, probe))
    outs = engine(max_num_seqs=max_num_seqs, async_runner=async_runner).generate(
        [p for p, _ in batch], [params for _, params in batch])
    tokens, reason = alone(prompt, key(probe))
    assert (tuple(outs[position].token_ids), outs[position].finish_reason) == (tokens, reason)


def test_different_seeds_give_different_outputs():
    seeds = [0, 1, 2, 3, 4, 5, 2 ** 32 + 1, 2 ** 63 + 1]
    outs = engine().generate(["def main("] * len(seeds),
                             [SamplingParams(temperature=0.8, seed=s, max_tokens=MAX_TOKENS) for s in seeds])
    assert len({tuple(o.token_ids) for o in outs}) == len(seeds)
    assert all(len(o.token_ids) == MAX_TOKENS for o in outs)
    assert tuple(outs[0].token_ids) != tuple(expected_greedy("def main(", MAX_TOKENS))


def test_unseeded_requests_follow_the_engine_seed():
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS)
    run = [[o.token_ids for o in engine(seed=s).generate(PROMPTS[:3], params)] for s in (0, 0, 1)]
    assert run[0] == run[1]
    assert run[0] != run[2]


# ---- runners and dtypes --------------------------------------------------------------------

def test_async_runner_gives_the_same_tokens_as_sync():
    params = [greedy(12), SamplingParams(temperature=0.8, seed=3, max_tokens=10), greedy(5),
              SamplingParams(temperature=1.0, top_k=5, seed=4, max_tokens=12), greedy(12), greedy(7)]
    async_llm, sync_llm = engine(max_num_seqs=3), engine(max_num_seqs=3, async_runner=False)
    assert async_llm.is_async and not sync_llm.is_async  # plain decoding is async by default
    async_outs = async_llm.generate(PROMPTS, params)
    sync_outs = sync_llm.generate(PROMPTS, params)
    assert [o.token_ids for o in async_outs] == [o.token_ids for o in sync_outs]
    assert [o.finish_reason for o in async_outs] == [o.finish_reason for o in sync_outs]


CODE_AFTER_DEF = re.compile(r"[\w, =*]*\):\n( {4}|\t)")


def is_printable_code(text: str) -> bool:
    return all(c.isascii() and (c.isprintable() or c in "\n\t") for c in text)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fixture_target_writes_code_after_def_main(dtype):
    llm = engine(dtype=dtype)
    assert llm.model.model.embed_tokens.weight.dtype == llm.config.torch_dtype
    out, = llm.generate(["def main("], greedy(24))
    assert len(out.token_ids) == 24
    assert is_printable_code(out.text), out.text
    assert CODE_AFTER_DEF.match(out.text), out.text  # closes the signature, indents a body


def test_bfloat16_batch_runs_and_writes_printable_text():
    outs = engine(dtype="bfloat16", max_num_seqs=3).generate(PROMPTS, greedy(16, ignore_eos=True))
    assert all(len(o.token_ids) == 16 for o in outs)
    assert all(is_printable_code(o.text) for o in outs)


def test_a_late_arrival_is_waited_for_not_a_stall():
    llm = LLM(TARGET_DIR, max_model_len=128)
    out = llm.generate(["def main("], SamplingParams(max_tokens=3), arrival_steps=[5])
    assert len(out[0].token_ids) == 3 and llm.scheduler.step > 5


def test_graph_buckets_are_powers_of_two_below_the_batch_then_the_batch():
    from engine.step_plan import graph_buckets
    assert [graph_buckets(n) for n in (1, 2, 3, 4, 6, 8)] == [[1], [1, 2], [1, 2, 3], [1, 2, 4], [1, 2, 4, 6],
                                                               [1, 2, 4, 8]]


def test_generate_shows_a_progress_bar_of_finished_requests_on_a_terminal(monkeypatch):
    """use_tqdm: one bar counting finished requests out of all, in requests, on a terminal's
    stderr; nothing when stderr is a file or a pipe."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True
    llm, prompts = engine(), ["def main(", "x", "import os\n"]
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        outs = llm.generate(prompts, greedy(max_tokens=3), use_tqdm=True)
        assert [len(o.token_ids) for o in outs] == [3, 3, 3]
        final = stream.getvalue().split("\r")[-1]
        assert (re.search(r"100%\|.*\| 3/3 \[.*(req/s|s/req)\]", final) is not None) == shown, stream.getvalue()
