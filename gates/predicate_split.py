"""Gate predicate-split: the async runner refuses device feeding per request (prefill, resumed
after preemption, host history) while the step as a whole still runs on the device. In batches
where refused and device-fed requests share a step, async must equal sync in tokens and in
emit counts per step and request. A per-request refusal read by a per-step predicate once
shipped as a silent wrong answer that every num_reqs == 1 test passed.

Through the request lifecycle too: with requests aborted in such mixed batches (waiting, running
with their step in flight, their slot then taken by a refused prefill), the requests not aborted
emit exactly what a sync run without the aborted ones emits. Every run's steps stay within their
scheduler limits (gates/invariants.py, limits_difference)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.policy import REFUSE_HOST_HISTORY, REFUSE_PREFILL, REFUSE_RESUMED
from gates.compare import runs_difference
from gates.invariants import limits_difference, mixed_refusals
from gates.lifecycle import Abort, Lifecycle, lifecycles, note_lifecycle, run_against_kept
from gates.workloads import DRAFTERS, MIXED_REFUSALS, MIXED_REFUSALS_ENGINE, gate_settings, run_pair, workloads

REFUSALS = (REFUSE_PREFILL, REFUSE_RESUMED, REFUSE_HOST_HISTORY)
CLAIMS = ("ngram", "block", "graph arm", *(f"mixed step with a {kind} refusal" for kind in REFUSALS),
          "abort with a step in flight", "abort of a waiting request", "aborted slot reused by a new admission")
# The mixed-refusal workload with a running request aborted while its step is in flight (its slot
# then goes to the next arrival's prefill) and the last arrival aborted before it arrives.
MIXED_ABORTS = Lifecycle(MIXED_REFUSALS, (Abort(1, 4), Abort(5, 3)))


def check_pair(gate_record, sync, async_) -> dict[str, int]:
    gate_record.check(runs_difference(sync, async_, fields=("emit_count",)), "async vs sync")
    for r in (sync, async_):
        gate_record.check(limits_difference(r.trace), f"{r.label()}: scheduler limits")
    mixed = mixed_refusals(async_.trace)
    gate_record.occurred(sync.engine["spec"])
    gate_record.occurred("graph arm", any(route.endswith("/graph") for route in async_.routes))
    for kind in mixed:
        gate_record.occurred(f"mixed step with a {kind} refusal")
    return mixed


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_every_refusal_kind_shares_steps_with_device_fed_requests(make_llm, gate_record, drafter):
    gate_record.case(drafter=drafter, workload="mixed refusals", k=3)
    mixed = check_pair(gate_record, *run_pair(make_llm, MIXED_REFUSALS, spec=drafter, num_spec_tokens=3,
                                              **MIXED_REFUSALS_ENGINE))
    missing = [kind for kind in REFUSALS if kind not in mixed]
    assert not missing, f"no step mixed device-fed requests with {missing} refusals (mixed: {mixed})"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(min_reqs=5, max_reqs=7, long_prompts=True, min_tokens=12, host_history=None,
                          max_arrival=8), k=st.integers(1, 5))
@gate_settings(3)
def test_mixed_batches_async_equals_sync(make_llm, gate_record, drafter, graph, workload, k):
    """More requests than max_num_seqs (4): the queue is admitted while others decode. Whether
    an example mixed is recorded with it; the gate's claims need every kind to have mixed."""
    sync, async_ = run_pair(make_llm, workload, spec=drafter, num_spec_tokens=k, graph=graph,
                            **MIXED_REFUSALS_ENGINE)
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=workload.num_reqs,
                     mixed=mixed_refusals(async_.trace))
    check_pair(gate_record, sync, async_)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_aborts_in_mixed_batches(make_llm, gate_record, drafter):
    gate_record.case(drafter=drafter, workload="mixed refusals with aborts", k=3)
    baseline, kept, life = run_against_kept(make_llm, MIXED_ABORTS, spec=drafter, num_spec_tokens=3,
                                            **MIXED_REFUSALS_ENGINE)
    gate_record.check(runs_difference(baseline, kept, fields=("emit_count",)), "aborts: async vs sync without")
    note_lifecycle(gate_record, life)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(lifecycle=lifecycles(min_reqs=5, max_reqs=7, long_prompts=True, min_tokens=12, host_history=None,
                            max_arrival=8), k=st.integers(1, 5))
@gate_settings(2)
def test_aborts_in_mixed_batches_drawn(make_llm, gate_record, drafter, graph, lifecycle, k):
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=lifecycle.workload.num_reqs,
                     aborts=[(a.request, a.step) for a in lifecycle.aborts])
    baseline, kept, life = run_against_kept(make_llm, lifecycle, spec=drafter, num_spec_tokens=k, graph=graph,
                                            **MIXED_REFUSALS_ENGINE)
    gate_record.check(runs_difference(baseline, kept, fields=("emit_count",)), "aborts: async vs sync without")
    note_lifecycle(gate_record, life)
