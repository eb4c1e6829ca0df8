"""The request lifecycle: LLM.abort (waiting, running, preempted, with its step in flight; several
ids; unknown or finished ids refused), streaming (LLM.stream, LLM.step_deltas), and Hypothesis
schedules of admissions and aborts where the requests not aborted give exactly the tokens of a run
without the aborted ones and every slot and KV block is free after the run."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from engine.config import EngineConfig
from engine.errors import RequestError
from engine.outputs import RequestDelta
from engine.policy import ASYNC
from engine.request import Request
from engine.scheduler import Scheduler
from gates.lifecycle import (
    ABORT_REUSE,
    ABORT_REUSE_ENGINE,
    launched_behind_abort,
    lifecycle_difference,
    lifecycles,
    run_lifecycle,
)
from gates.workloads import params
from helpers.liveness import drain
from helpers.strategies import examples

GREEDY = SamplingParams(temperature=0, max_tokens=24)


def free_everything(llm) -> bool:
    s = llm.scheduler
    return (len(s.free_slots) == llm.config.max_num_seqs and not s.held
            and s.block_manager.num_free_blocks == s.block_manager.num_blocks)


def test_the_scheduler_holds_an_aborted_requests_slot_and_blocks_until_its_step_is_read():
    sched = Scheduler(EngineConfig(model="x", max_num_seqs=1, max_model_len=64, max_num_batched_tokens=64), ASYNC)
    first, second = (Request(i, [1, 2, 3], GREEDY, rng_key=0) for i in range(2))
    sched.add(first)
    sched.add(second)
    assert sched.schedule().requests == [first]
    slot, blocks = first.slot, list(first.block_ids)
    sched.abort(first, step=1, in_flight=True)
    assert first.finish_reason == "abort" and first.is_finished and first.finish_step == 1 and sched.held == [first]
    assert sched.schedule().requests == [], "the held slot went to a new admission while its step was in flight"
    assert (first.slot, first.block_ids) == (slot, blocks)
    sched.release_held([first])
    assert sched.schedule().requests == [second] and second.slot == slot


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_abort_returns_what_was_committed_and_frees_everything(make_llm, async_runner):
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=async_runner, max_num_seqs=2)
    running, other, waiting = (llm.add_request(p, GREEDY) for p in ("def main(", "import os\n", "class Foo:"))
    for _ in range(3):
        llm.step()
    assert (running.request_id in llm.in_flight_request_ids) == async_runner
    committed = list(running.output_token_ids)
    (out,) = llm.abort(running.request_id)
    assert out.finish_reason == "abort" and out.token_ids == committed and len(committed) >= 1
    (out_waiting,) = llm.abort([waiting.request_id])
    assert out_waiting.finish_reason == "abort" and out_waiting.token_ids == []
    while llm.has_unfinished():
        llm.step()
    assert running.output_token_ids == committed, "a step in flight emitted for an aborted request"
    assert other.finish_reason == "length" and free_everything(llm)


def test_aborting_an_unknown_or_finished_id_raises_and_aborts_nothing(make_llm):
    llm = make_llm(spec="ngram", num_spec_tokens=2)
    done = llm.add_request("def main(", SamplingParams(temperature=0, max_tokens=2))
    live = llm.add_request("import os\n", GREEDY)
    while not done.is_finished:
        llm.step()
    llm.deltas()
    for bad in (99, done.request_id, [live.request_id, 99], [live.request_id, live.request_id], "0", True):
        with pytest.raises(RequestError, match="abort"):
            llm.abort(bad)
        assert not live.is_finished
    assert llm.abort([live.request_id])[0].finish_reason == "abort"


def test_a_preempted_request_can_be_aborted(make_llm):
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=True, max_num_seqs=4, num_kv_blocks=18)
    reqs = [llm.add_request(p * 3, SamplingParams(temperature=0, max_tokens=40))
            for p in ("def parse(self, data):\n", "class Foo:\n", "import os\nimport sys\n", "for i in range(9):\n")]
    while not any(r.stats.num_preemptions and r.slot is None and not r.is_finished for r in reqs):
        assert llm.has_unfinished(), "no request was preempted"
        llm.step()
    victim = next(r for r in reqs if r.stats.num_preemptions and r.slot is None and not r.is_finished)
    assert llm.abort(victim.request_id)[0].finish_reason == "abort"
    while llm.has_unfinished():
        llm.step()
    assert free_everything(llm)


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_stream_yields_each_requests_tokens_as_generate_returns_them(make_llm, async_runner):
    prompts = ["def main(", "x = 1\n" * 3, "import os\n"]
    budgets = [SamplingParams(temperature=0, max_tokens=m) for m in (5, 17, 30)]
    whole = make_llm(spec="ngram", num_spec_tokens=3).generate(prompts, budgets)
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=async_runner)
    got: dict[int, list[int]] = {}
    finished: dict[int, str] = {}
    for delta in llm.stream(prompts, budgets):
        assert isinstance(delta, RequestDelta) and delta.request_id not in finished
        got.setdefault(delta.request_id, []).extend(delta.token_ids)
        if delta.is_finished:
            finished[delta.request_id] = delta.finish_reason
    assert [got[i] for i in sorted(got)] == [o.token_ids for o in whole]
    assert [finished[i] for i in sorted(finished)] == [o.finish_reason for o in whole]


def test_a_streamed_request_arrives_at_its_arrival_step(make_llm):
    """A step yields at most one delta per request, and request 0 gains tokens every step: the
    request arriving at step 5 has its first delta after five of request 0's, and the streamed
    tokens are generate's with the same arrivals. A stream that stops stepping fails, not hangs."""
    prompts, arrivals = ["def main(", "import os\n"], [0, 5]
    params = SamplingParams(temperature=0, max_tokens=30)
    whole = make_llm(spec="ngram", num_spec_tokens=3).generate(prompts, params, arrival_steps=arrivals)
    llm = make_llm(spec="ngram", num_spec_tokens=3)
    order = [(d.request_id, d.token_ids) for d in drain(llm.stream(prompts, params, arrival_steps=arrivals))]
    first_late = next(i for i, (rid, _) in enumerate(order) if rid == 1)
    assert first_late >= 5 and all(rid == 0 for rid, _ in order[:first_late])
    assert [sum((t for rid, t in order if rid == i), []) for i in (0, 1)] == [o.token_ids for o in whole]


def test_a_stream_aborted_midway_ends_that_request_with_an_abort_delta(make_llm):
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=True)
    deltas = []
    for delta in llm.stream(["def main(", "import os\n"], SamplingParams(temperature=0, max_tokens=30)):
        deltas.append(delta)
        if len(deltas) == 3:
            llm.abort(0)
    last = [d for d in deltas if d.request_id == 0][-1]
    assert last == RequestDelta(0, [], "abort")
    assert [d for d in deltas if d.request_id == 1][-1].finish_reason == "length"
    assert sum(len(d.token_ids) for d in deltas if d.request_id == 1) == 30


def test_step_deltas_deliver_every_request_s_news_in_the_call_of_its_step(make_llm):
    """After every step_deltas() each live request's delivered tokens are all it has committed: news
    is never held back to a later call, also when the async runner reads a step it launched past
    an earlier request's end (that request, already delivered whole, is touched again first)."""
    llm = make_llm(spec="ngram", num_spec_tokens=2, async_runner=True, max_num_seqs=2)
    reqs = [llm.add_request("def main(", SamplingParams(temperature=0, max_tokens=m)) for m in (4, 24)]
    got = {r.request_id: 0 for r in reqs}
    while llm.has_unfinished():
        for d in llm.step_deltas():
            got[d.request_id] += len(d.token_ids)
        assert got == {r.request_id: len(r.output_token_ids) for r in reqs}, "news held back to a later call"
    assert [r.finish_reason for r in reqs] == ["length", "length"] and reqs[0].finish_step < reqs[1].finish_step


def test_step_deltas_report_news_once(make_llm):
    llm = make_llm(spec="ngram", num_spec_tokens=2, async_runner=True)
    req = llm.add_request("def main(", SamplingParams(temperature=0, max_tokens=6))
    seen = []
    while llm.has_unfinished():
        seen += llm.step_deltas()
    assert [t for d in seen for t in d.token_ids] == req.output_token_ids
    assert [d.finish_reason for d in seen].count("length") == 1 and llm.deltas() == []


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@given(lifecycle=lifecycles(min_tokens=4, host_history=None), k=st.integers(1, 4), graph=st.booleans())
@examples(6)
def test_requests_not_aborted_give_the_tokens_of_a_run_without_the_aborted(make_llm, async_runner, lifecycle, k,
                                                                          graph):
    engine = dict(spec="ngram", num_spec_tokens=k, graph=graph, max_num_seqs=3)
    life = run_lifecycle(make_llm, lifecycle, async_runner=async_runner, **engine)
    diff = lifecycle_difference(life)
    assert diff is None, str(diff)
    kept = lifecycle.kept(life.aborted_ids)
    without = make_llm(**engine).generate(kept.prompt_list(), params(kept), arrival_steps=kept.arrivals())
    mine = [o.token_ids for o in life.run.outputs if o.request_id not in life.aborted_ids]
    assert mine == [o.token_ids for o in without]


def test_the_reuse_schedule_aborts_with_a_step_in_flight_and_hands_the_slot_on(make_llm):
    life = run_lifecycle(make_llm, ABORT_REUSE, async_runner=True, spec="ngram", num_spec_tokens=3,
                         **ABORT_REUSE_ENGINE)
    assert [(e.status, e.in_flight) for e in life.events] == [("waiting", False), ("running", True)]
    assert lifecycle_difference(life) is None


def test_an_abort_counts_as_in_flight_only_where_the_trace_shows_the_next_step_launched_behind_it(make_llm):
    """The claim "abort with a step in flight" stands for the slot-and-block check having run: a
    trace that lost what was in flight at each launch (launched_behind) skips that check, and then
    the claim must go unmet instead of the gate going green on a check that never ran."""
    import dataclasses
    life = run_lifecycle(make_llm, ABORT_REUSE, async_runner=True, spec="ngram", num_spec_tokens=3,
                         **ABORT_REUSE_ENGINE)
    (running,) = [e for e in life.events if e.in_flight]
    mine, launched = launched_behind_abort(life, running)
    assert mine.request_id == running.request_id and launched.step == running.step
    lost = [dataclasses.replace(s, launched_behind=None) for s in life.run.trace]
    blind = dataclasses.replace(life, run=dataclasses.replace(life.run, trace=lost))
    assert launched_behind_abort(blind, running) is None
