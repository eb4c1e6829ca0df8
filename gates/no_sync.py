"""Gate no-sync: on CUDA, the async runner's decode step performs no host synchronisation.

torch.cuda.set_sync_debug_mode("error") around runner.execute makes every synchronising call
(.item(), .tolist(), .cpu(), nonzero, a blocking copy) raise. Steps that capture a new CUDA graph
are left out (capture synchronises once, by design); every other decode step is checked, in the
eager and the graph arm, for both drafters.
"""
import pytest
import torch

from engine import SamplingParams
from gates.workloads import DRAFTERS, PROMPTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA: torch.cuda.is_available() is False on this machine")

CLAIMS = ("ngram", "block", "eager arm", "graph arm", "decode steps checked", "num_reqs>1")


class SyncFound(Exception):
    pass


def guard_decode_steps(llm, checked: list):
    """Wrap runner.execute: decode steps run under sync debug mode 'error'."""
    runner, execute = llm.runner, llm.runner.execute

    def guarded(plan):
        captures = plan.arm == "graph" and plan.num_rows not in runner.graphs
        if any(row.is_prefill for row in plan.rows) or captures:
            return execute(plan)
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = execute(plan)
        except RuntimeError as e:
            raise SyncFound(f"step {plan.step} ({plan.arm}, {len(plan.requests)} requests): {e}") from e
        finally:
            torch.cuda.set_sync_debug_mode("default")
        checked.append((plan.step, plan.arm, len(plan.requests)))
        return out
    runner.execute = guarded


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_async_decode_step_makes_no_host_sync(make_llm, gate_record, drafter, graph):
    llm = make_llm(device="cuda", spec=drafter, num_spec_tokens=4, graph=graph, async_runner=True, max_num_seqs=4)
    assert llm.is_async
    checked = []
    guard_decode_steps(llm, checked)
    gate_record.case(drafter=drafter, graph=graph)
    try:
        llm.generate(list(PROMPTS[:6]), SamplingParams(temperature=0, max_tokens=32), arrival_steps=[0, 0, 0, 2, 4, 6])
    except SyncFound as e:
        gate_record.evidence(sync=str(e))
        pytest.fail(f"the async decode step synchronised with the host: {e}", pytrace=False)
    gate_record.occurred(drafter)
    gate_record.occurred("decode steps checked", len(checked) > 0)
    gate_record.occurred("num_reqs>1", any(n > 1 for _, _, n in checked))
    gate_record.occurred("graph arm" if graph else "eager arm", any(arm == ("graph" if graph else "eager")
                                                                   for _, arm, _ in checked))
    assert checked, "no decode step ran under the sync check"
