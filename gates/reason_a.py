"""Gate reason-a: on every verify step, in the eager and the graph arm, on both runners, each
request's logits window (the trace's logits_indices) starts at its query start and covers its
num_draft + 1 rows: the real cu_num_logits reached the gather. A window that falls back to the
query's end (the last draft slot) is reason A: every token can stay right while acceptance
collapses, because verify is lossless."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gates.invariants import logits_window_difference
from gates.workloads import DRAFTERS, gate_settings, run, workloads

CLAIMS = ("ngram", "block", "eager arm", "graph arm", "sync runner", "async runner", "num_reqs>1", "k>1",
          "verify rows with drafts", "prefill and verify rows in one step")


@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(min_reqs=2, max_reqs=6, min_tokens=8), k=st.integers(2, 6))
@gate_settings(3)
def test_logits_window_starts_at_query_start(make_llm, gate_record, drafter, workload, k):
    for graph in (False, True):
        for async_runner in (False, True):
            r = run(make_llm, workload, spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=4,
                    async_runner=async_runner)
            gate_record.case(drafter=drafter, k=k, graph=graph, async_runner=async_runner,
                             num_reqs=workload.num_reqs)
            gate_record.check(logits_window_difference(r.trace), r.label())
            verify = [rec for s in r.trace for rec in s.requests if not rec.is_prefill]
            gate_record.occurred(drafter)
            gate_record.occurred("sync runner" if not r.is_async else "async runner")
            gate_record.occurred("eager arm", any(route.endswith("/eager") for route in r.routes))
            gate_record.occurred("graph arm", any(route.endswith("/graph") for route in r.routes))
            gate_record.occurred("num_reqs>1", max(s.num_reqs for s in r.trace) > 1)
            gate_record.occurred("k>1", k > 1)
            gate_record.occurred("verify rows with drafts", any(rec.num_draft > 0 for rec in verify))
            gate_record.occurred("prefill and verify rows in one step",
                                 any(len({rec.is_prefill for rec in s.requests}) == 2 for s in r.trace))
            assert verify, "no verify step ran"
            if graph:
                assert any(route.endswith("/graph") for route in r.routes), "graph=True never took the graph arm"
