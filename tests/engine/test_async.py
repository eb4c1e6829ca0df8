"""The async runner equals the sync runner: the same tokens, and per step and request the same
emit counts (num_accepted + 1) and the same device inputs, for both drafters, k from 1 to 6,
1 to 8 requests with mixed lengths, arrivals, finishes, preemptions and logits-processor
requests, in both arms. Each test asserts that the mix it claims to cover occurred."""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from engine.policy import REFUSE_HOST_HISTORY, REFUSE_PREFILL, REFUSE_RESUMED
from gates.compare import first_difference, verify_steps
from gates.workloads import MIXED_REFUSALS, no_immediate_repeat, workloads
from helpers.strategies import examples


def run(make_llm, batch, processor_mask, **kwargs):
    llm = make_llm(trace=True, **kwargs)
    params = [SamplingParams(temperature=0, max_tokens=m,
                             logits_processors=[no_immediate_repeat] if use else [])
              for m, use in zip(batch.max_tokens, processor_mask)]
    outs = llm.generate(list(batch.prompts), params, arrival_steps=list(batch.arrival_steps))
    return llm, outs


def compare_runs(sync, async_):
    (llm_s, outs_s), (llm_a, outs_a) = sync, async_
    assert not llm_s.is_async and llm_a.is_async
    for i, (s, a) in enumerate(zip(outs_s, outs_a)):
        assert a.token_ids == s.token_ids, f"request {i}: async tokens differ from sync"
    final_len = {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in outs_s}
    steps_s, steps_a = verify_steps(llm_s.trace, final_len), verify_steps(llm_a.trace, final_len)
    if not any(o.stats.num_preemptions for o in outs_s + outs_a):
        assert steps_s.keys() == steps_a.keys()
    assert steps_s.keys() & steps_a.keys()
    for field in ("emit_count", "device_inputs"):
        diff = first_difference(steps_s, steps_a, field)
        assert diff is None, str(diff)
    return llm_a


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
@given(batch=workloads(min_reqs=2), k=st.integers(1, 6), data=st.data())
@examples(5)
def test_async_equals_sync_step_by_step(make_llm, drafter, graph, batch, k, data):
    processor_mask = data.draw(st.lists(st.booleans(), min_size=batch.num_reqs, max_size=batch.num_reqs))
    batch = dataclasses.replace(batch, max_tokens=tuple(max(m, 8) for m in batch.max_tokens))  # room for verify steps
    preempt = data.draw(st.booleans())
    kwargs = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=4,
                  num_kv_blocks=18 if preempt else None)
    llm_a = compare_runs(run(make_llm, batch, processor_mask, async_runner=False, **kwargs),
                         run(make_llm, batch, processor_mask, async_runner=True, **kwargs))
    if graph and not any(processor_mask):
        assert any(step.route == "async/graph" for step in llm_a.trace), "the graph arm never ran"


def test_every_refusal_kind_shares_steps_with_device_fed_requests(make_llm):
    """A deterministic mix: arrivals during decode (prefill), a tight cache (resumed) and a
    logits-processor request (host history), in steps with device-fed requests."""
    batch = MIXED_REFUSALS  # the predicate-split gate's mix
    processor_mask = list(MIXED_REFUSALS.host_history)
    kwargs = dict(spec="ngram", num_spec_tokens=3, max_num_seqs=4, num_kv_blocks=18)
    llm_a = compare_runs(run(make_llm, batch, processor_mask, async_runner=False, **kwargs),
                         run(make_llm, batch, processor_mask, async_runner=True, **kwargs))
    mixed_reasons = set()
    for step in llm_a.trace:
        if any(r.device_fed for r in step.requests):
            mixed_reasons |= {r.refusal for r in step.requests if not r.device_fed}
    assert {REFUSE_PREFILL, REFUSE_RESUMED, REFUSE_HOST_HISTORY} <= mixed_reasons, mixed_reasons


def test_tokens_past_the_end_are_never_emitted(make_llm):
    """The async runner learns of a finish one step late; what the device produced after it
    must not reach the output."""
    from helpers.strategies import PROMPT_POOL
    prompts = PROMPT_POOL[:4]
    params = [SamplingParams(temperature=0, max_tokens=m) for m in (1, 2, 5, 9)]
    sync = make_llm(spec="ngram", num_spec_tokens=4, async_runner=False).generate(prompts, params)
    llm = make_llm(spec="ngram", num_spec_tokens=4, async_runner=True, trace=True)
    outs = llm.generate(prompts, params)
    assert [len(o.token_ids) for o in outs] == [1, 2, 5, 9]
    assert [o.token_ids for o in outs] == [o.token_ids for o in sync]
    ran_past_end = sum(1 for step in llm.trace for r in step.requests
                       if r.positions[0] >= len(outs[r.request_id].prompt_token_ids)
                                            + len(outs[r.request_id].token_ids) - 1
                       and not r.is_prefill)
    assert ran_past_end > 0, "the device never ran past a finished request: the lag was not exercised"


def test_veto(make_llm, monkeypatch, caplog):
    monkeypatch.delenv("VT_ASYNC_RUNNER", raising=False)
    with caplog.at_level("WARNING", logger="specgate"):
        assert not make_llm(spec="ngram").is_async
    assert sum("vetoed" in r.message for r in caplog.records) == 1
    assert make_llm(spec="ngram", async_runner=True).is_async
    assert make_llm().is_async  # plain decoding runs async by default
    monkeypatch.setenv("VT_ASYNC_RUNNER", "1")
    assert make_llm(spec="ngram").is_async
    monkeypatch.setenv("VT_ASYNC_RUNNER", "0")
    assert not make_llm(spec="ngram", async_runner=True).is_async
    assert not make_llm().is_async


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_async_host_never_waits_on_the_step_it_just_launched(make_llm, spec):
    """Counted where the host reads device results: the sync runner blocks once per step; the
    async runner reads step t's results only after step t+1 is queued, except the final drain."""
    from helpers.strategies import PROMPT_POOL
    params = SamplingParams(temperature=0, max_tokens=24)
    sync = make_llm(spec=spec, async_runner=False, trace=True)
    sync.generate(PROMPT_POOL[:4], params)
    assert sync.host_reads == {"blocking": len(sync.trace), "deferred": 0}
    async_ = make_llm(spec=spec, async_runner=True, trace=True)
    async_.generate(PROMPT_POOL[:4], params)
    assert async_.host_reads == {"blocking": 1, "deferred": len(async_.trace) - 1}


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_graph_arm_padding_never_reaches_outputs_or_metrics(make_llm, async_runner):
    from helpers.strategies import PROMPT_POOL
    params = SamplingParams(temperature=0, max_tokens=30)
    eager = make_llm(spec="ngram", num_spec_tokens=3, async_runner=async_runner).generate(PROMPT_POOL[:3], params)
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=async_runner, graph=True, trace=True)
    graph = llm.generate(PROMPT_POOL[:3], params)
    assert any(step.num_padding_rows > 0 for step in llm.trace), "3 requests never padded to bucket 4"
    assert [o.token_ids for o in graph] == [o.token_ids for o in eager]
    assert [o.stats for o in graph] == [o.stats for o in eager]
