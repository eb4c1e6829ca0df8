"""no-sync with the compiled forward (gates/no_sync.py), on the CPU with inductor: the host-read hook
would be traced by dynamo (a fullgraph compile refuses it), so the compiled pieces run with the hook
popped off torch's function-mode stack, and the workload runs once before the check so nothing compiles inside it; a
host read outside the compiled pieces is still caught (the negative control). On CUDA the gate's
compiled arm runs this path; on the CPU only this test does (a CPU compile takes a minute)."""
import os

import pytest

from gates import no_sync

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "mutation",
                                 reason="dynamo cannot trace mutmut's trampolines")]


def checked_run(llm) -> no_sync.HostReads:
    reads = no_sync.HostReads(llm.runner.declared_syncs)
    no_sync.add_workload(llm)
    while llm.has_unfinished():
        no_sync.checked_step(llm, reads)
    return reads


def test_the_compiled_loop_is_checked_without_compiling_and_a_read_outside_is_caught(make_llm):
    import torch._dynamo.utils as dynamo_utils
    llm = make_llm(compile=True, spec="ngram", num_spec_tokens=4, async_runner=True, max_num_seqs=4)
    # the fused forward's five compiled kernels (engine/gemv.py's, CUDA's only, are Triton launches,
    # not compiled pieces), the combine, verify, the logits gather, the ngram proposer, the sdpa
    # metadata: every compiled piece the runner holds, none left hooked
    assert no_sync.run_compiled_unhooked(llm) == 10
    assert not [name for name, piece in vars(llm.runner).items() if no_sync.is_compiled(piece)]
    no_sync.compile_unchecked(llm)
    graphs = dynamo_utils.counters["stats"]["unique_graphs"]
    assert graphs > 0
    reads = checked_run(llm)
    assert reads.undeclared == [] and reads.allowed > 0
    assert dynamo_utils.counters["stats"]["unique_graphs"] == graphs, "dynamo compiled inside the checked run"
    launch = llm.runner.launch

    def reads_after_launch(plan, *args, **kwargs):
        in_flight = launch(plan, *args, **kwargs)
        int(llm.runner.state.num_committed[0])  # the negative control: a blocking read in the host loop
        return in_flight
    llm.runner.launch = reads_after_launch
    caught = checked_run(llm)
    assert caught.undeclared and caught.undeclared[0].startswith(".__int__()")


def test_the_reference_forward_has_nothing_to_unhook(make_llm):
    assert no_sync.run_compiled_unhooked(make_llm(spec="ngram", num_spec_tokens=2, async_runner=True)) == 0
