"""`specgate bench --count-kernels`: the profiled window holds only decode steps, the count is
per step, and device events are told apart (kernels from copies and syncs)."""
from types import SimpleNamespace

import pytest

from engine.kernel_count import count_kernels, device_kind
from engine.workload import Workload


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_counts_decode_steps_only_and_leaves_the_engine_idle(make_llm, spec):
    llm = make_llm(spec=spec, num_spec_tokens=2, max_num_seqs=3, async_runner=True)
    workload = Workload.uniform([[5, 6, 7, 8], [9, 10], [11, 12, 13]], max_tokens=40)
    got = count_kernels(llm, workload, max_steps=4)
    assert got["steps"] == 4 and got["num_reqs"] == 3 and got["arm"] == "eager"
    assert "aten ops" in got["counted"] and got["aten_ops_per_step"] > 50
    assert not llm.has_unfinished()
    again = count_kernels(llm, workload, max_steps=4)   # the same decode steps dispatch the same ops
    assert again["aten_ops_per_step"] == got["aten_ops_per_step"]


def test_refuses_the_graph_arm_and_a_workload_too_short(make_llm):
    with pytest.raises(ValueError, match="eager arm"):
        count_kernels(make_llm(graph=True), Workload.uniform([[5, 6]], max_tokens=40))
    with pytest.raises(ValueError, match="no decode step"):
        count_kernels(make_llm(), Workload.uniform([[5, 6]], max_tokens=3))


@pytest.mark.parametrize("activity, name, kind", [
    ("kernel", "void gemv<float>", "kernel"), ("gpu_memcpy", "Memcpy HtoD", "gpu_memcpy"),
    (None, "Memcpy DtoH (Device -> Pinned)", "gpu_memcpy"), (None, "Memset (Device)", "gpu_memset"),
    (None, "Event Sync", "cuda_sync"), (None, "ampere_sgemm_128x64_tn", "kernel")])
def test_device_events_are_told_apart(activity, name, kind):
    assert device_kind(SimpleNamespace(activity_type=activity, name=name)) == kind
