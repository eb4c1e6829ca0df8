"""`specgate bench --count-kernels`: the profiled window holds only decode steps, the count is
per step, and device events are told apart (kernels from copies and syncs)."""
from types import SimpleNamespace

import pytest

from engine.kernel_count import count_kernels, device_kind, kernel_class
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


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"), ("void gemv2T_kernel_val<int, int, float>", "matmul"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "matmul"), ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention"),
    ("pytorch_flash::flash_fwd_kernel", "attention"), ("triton_tem_fused_flex_attention_0", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "inductor fused"),
    ("void at::native::index_elementwise_kernel<128, 4>", "index/gather/scatter"),
    ("void at::native::reduce_kernel<512, 1>", "reduction"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("void at::native::CatArrayBatchedCopy<float>", "copy/cat"), ("void at::native::radixSortKVInPlace", "other")])
def test_kernels_are_classed_by_name(name, cls):
    """The per-class GPU time (`kernel_us_per_step`) says where a step goes: first matching class wins."""
    assert kernel_class(name) == cls
