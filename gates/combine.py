"""Gate combine (G2): the async runner assembles each step's device inputs on the device from
the last step's results; per step and request they must equal what the sync runner built on
the host: input ids (last committed token, then the drafts), positions, sequence length, and
the logits window relative to the query start.

Through the request lifecycle too: with requests aborted (waiting, running, with their step in
flight, their slot then taken by a new admission), the requests not aborted are fed exactly what
a sync run without the aborted ones fed them; with a binding token budget, a running request that
sat out a step is fed, when it comes back, what the sync runner fed it.

Every run's scheduler limits, step by step (gates/invariants.py, limits_difference): tokens within
the budget, KV blocks within the pool and held once, reservations covering every write, also the
writes the step in flight could make."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.compare import runs_difference
from gates.invariants import limits_difference, prefill_deferred_by_budget
from gates.lifecycle import (
    ABORT_REUSE,
    ABORT_REUSE_ENGINE,
    GAPS,
    GAPS_ENGINE,
    lifecycles,
    note_lifecycle,
    run_against_kept,
    scheduling_gaps,
)
from gates.workloads import (
    DRAFTERS,
    GRAPH_PADDING,
    GRAPH_PADDING_ENGINE,
    LIMITS,
    MIXED_REFUSALS,
    MIXED_REFUSALS_ENGINE,
    gate_settings,
    limits_engine,
    run_pair,
    workloads,
)

CLAIMS = ("ngram", "block", "num_reqs>1", "k>1", "device-fed rows compared", "preemption", "eager arm",
          "graph arm", "graph step with padding rows", "host-history request", "abort with a step in flight",
          "abort of a waiting request", "aborted slot reused by a new admission",
          "scheduling gap: a running request sat out a step and came back device-fed",
          "token budget bound: a prefill waited while verify rows ran (sync and async)",
          "preemption under a binding token budget (sync and async)")


def check_pair(gate_record, sync, async_):
    gate_record.check(runs_difference(sync, async_, fields=("device_inputs",)), "async vs sync")
    check_limits(gate_record, sync, async_)
    fed = sum(r.device_fed for s in async_.trace for r in s.requests)
    gate_record.occurred(sync.engine["spec"])
    gate_record.occurred("num_reqs>1", max(s.num_reqs for s in async_.trace) > 1)
    gate_record.occurred("k>1", sync.engine["num_spec_tokens"] > 1)
    gate_record.occurred("device-fed rows compared", fed > 0)
    gate_record.occurred("preemption", sync.num_preemptions > 0 and async_.num_preemptions > 0)
    gate_record.occurred("graph arm", any(route.endswith("/graph") for route in async_.routes))
    gate_record.occurred("graph step with padding rows", any(s.num_padding_rows for s in async_.trace))
    gate_record.occurred("eager arm", any(route.endswith("/eager") for route in async_.routes))
    gate_record.occurred("host-history request", any(async_.workload.host_history))
    assert fed > 0, "no row of the async run was device-fed: nothing was combined on the device"


def check_limits(gate_record, *runs):
    """Every step of each run within the limits it was scheduled under (gates/invariants.py)."""
    for r in runs:
        gate_record.check(limits_difference(r.trace), f"{r.label()}: scheduler limits")


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(min_reqs=2, min_tokens=8, host_history=None), k=st.integers(1, 6),
       preempt=st.booleans())
@gate_settings(4)
def test_async_device_inputs_equal_sync(make_llm, gate_record, drafter, graph, workload, k, preempt):
    engine = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=4,
                  num_kv_blocks=18 if preempt else None)
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=workload.num_reqs, preempt=preempt)
    check_pair(gate_record, *run_pair(make_llm, workload, **engine))


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_device_inputs_with_every_refusal_kind_and_preemption(make_llm, gate_record, drafter):
    gate_record.case(drafter=drafter, workload="mixed refusals", k=3)
    sync, async_ = run_pair(make_llm, MIXED_REFUSALS, spec=drafter, num_spec_tokens=3, **MIXED_REFUSALS_ENGINE)
    assert sync.num_preemptions and async_.num_preemptions, "the cache never filled: no preemption"
    check_pair(gate_record, sync, async_)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_device_inputs_in_padded_graph_steps_with_every_slot_taken(make_llm, gate_record, drafter):
    """Padding rows run alongside real ones and must touch no request's state slot."""
    gate_record.case(drafter=drafter, workload="graph padding", k=3)
    sync, async_ = run_pair(make_llm, GRAPH_PADDING, spec=drafter, num_spec_tokens=3, **GRAPH_PADDING_ENGINE)
    assert any(s.num_padding_rows for s in async_.trace), "no graph step was padded"
    check_pair(gate_record, sync, async_)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(lifecycle=lifecycles(min_tokens=8, host_history=None), k=st.integers(1, 5))
@gate_settings(2)
def test_device_inputs_of_requests_not_aborted_equal_a_run_without_the_aborted(make_llm, gate_record, drafter,
                                                                                  graph, lifecycle, k):
    engine = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=3)
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=lifecycle.workload.num_reqs,
                     aborts=[(a.request, a.step) for a in lifecycle.aborts])
    baseline, kept, life = run_against_kept(make_llm, lifecycle, **engine)
    gate_record.check(runs_difference(baseline, kept, fields=("device_inputs",)), "aborts: async vs sync without")
    note_lifecycle(gate_record, life)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_device_inputs_after_an_abort_whose_slot_is_taken_next(make_llm, gate_record, drafter, graph):
    gate_record.case(drafter=drafter, graph=graph, workload="abort, slot reused", k=3)
    baseline, kept, life = run_against_kept(make_llm, ABORT_REUSE, spec=drafter, num_spec_tokens=3, graph=graph,
                                            **ABORT_REUSE_ENGINE)
    gate_record.check(runs_difference(baseline, kept, fields=("device_inputs",)), "aborts: async vs sync without")
    note_lifecycle(gate_record, life)
    gate_record.occurred("graph arm", any(route.endswith("/graph") for route in life.run.routes))
    gate_record.occurred("eager arm", any(route.endswith("/eager") for route in life.run.routes))


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_device_inputs_after_scheduling_gaps(make_llm, gate_record, drafter):
    """A binding token budget leaves running requests out of steps; back, they are fed what sync fed them."""
    gate_record.case(drafter=drafter, workload="scheduling gaps", **GAPS_ENGINE)
    sync, async_ = run_pair(make_llm, GAPS, spec=drafter, **GAPS_ENGINE)
    gate_record.check(runs_difference(sync, async_, fields=("device_inputs",)), "async vs sync")
    check_limits(gate_record, sync, async_)
    gate_record.occurred("scheduling gap: a running request sat out a step and came back device-fed",
                         any(r.device_fed for r in scheduling_gaps(async_.trace)))


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_device_inputs_under_a_binding_token_budget_and_kv_pool(make_llm, gate_record, drafter):
    """A prefill waits for verify rows to go and requests are preempted (graph=True: uniform verify
    steps in the graph arm, steps with a prefill eager)."""
    engine = limits_engine(make_llm().tokenizer)
    gate_record.case(drafter=drafter, workload="binding limits", **engine)
    sync, async_ = run_pair(make_llm, LIMITS, spec=drafter, **engine)
    check_pair(gate_record, sync, async_)
    assert {"eager", "graph"} <= {route.split("/")[1] for route in async_.routes}, async_.routes
    gate_record.occurred("token budget bound: a prefill waited while verify rows ran (sync and async)",
                         prefill_deferred_by_budget(sync.trace) and prefill_deferred_by_budget(async_.trace))
    gate_record.occurred("preemption under a binding token budget (sync and async)",
                         sync.num_preemptions > 0 and async_.num_preemptions > 0)
