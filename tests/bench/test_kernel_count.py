"""`specgate bench --count-kernels`: the profiled window holds only decode steps, the count is
per step, and device events are told apart (kernels from copies and syncs)."""
import re
import warnings
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from engine import SamplingParams
from engine.bench.kernel_count import count_cuda_events, count_kernels, count_top_level_ops, device_kind, kernel_class
from engine.bench.workload import Workload


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


def test_refuses_the_graph_arm_a_busy_engine_and_a_workload_too_short(make_llm):
    with pytest.raises(ValueError, match=re.escape(
            "count_kernels counts the eager arm: build the engine with graph=False") + "$"):
        count_kernels(make_llm(graph=True), Workload.uniform([[5, 6]], max_tokens=40))
    busy = make_llm()
    busy.add_request([5, 6], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="^count_kernels needs an idle engine$"):
        count_kernels(busy, Workload.uniform([[5, 6]], max_tokens=40))
    with pytest.raises(ValueError, match=re.escape(
            "the workload leaves no decode step to profile (2 tokens left before max_tokens or the context "
            "length)") + "$"):
        count_kernels(make_llm(), Workload.uniform([[5, 6]], max_tokens=3))


@pytest.mark.parametrize("leaves", ["finished", "preempted"])
def test_a_request_that_leaves_the_batch_inside_the_window_is_refused(make_llm, monkeypatch, leaves):
    """The window's count is per step of one batch: a request that finished (left the running
    set) or was preempted (back to waiting) inside it makes the count another batch's."""
    import contextlib

    import torch
    llm = make_llm(spec="ngram", num_spec_tokens=2, max_num_seqs=3)
    profile = torch.profiler.profile

    @contextlib.contextmanager
    def profile_then_leave(**kwargs):
        with profile(**kwargs) as prof:
            yield prof
            if leaves == "finished":
                llm.scheduler.running.pop()
            else:  # waiting again, and the running set as many (as when a new arrival took the slot)
                llm.scheduler.waiting.append(llm.scheduler.running[0])
    monkeypatch.setattr(torch.profiler, "profile", profile_then_leave)
    with pytest.raises(RuntimeError, match="^a request was preempted or finished inside the profiled decode window$"):
        count_kernels(llm, Workload.uniform([[5, 6, 7, 8], [9, 10], [11, 12, 13]], max_tokens=40), max_steps=2)


def test_the_shortest_window_is_one_decode_step_and_it_decodes_past_eos(make_llm):
    """max_tokens=4 leaves exactly one step to profile (3 tokens left after the warm-up step, at
    k+1 = 1 a step, less the step the host learns late and the last one). The prompt's greedy
    continuation is EOS at its second token: the window still holds the request (ignore_eos).
    Counting on the CPU asks the profiler for no CUDA activity (it would warn)."""
    llm = make_llm()
    prompt = [223, 92, 31]
    assert llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4))[0].token_ids == [195, 257]
    assert llm.eos_token_ids == {257}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = count_kernels(llm, Workload.uniform([prompt], max_tokens=4))
    assert got.pop("aten_ops_per_step") > 50
    assert got == {"arm": "eager", "steps": 1, "num_reqs": 1, "k": 0,
                   "counted": "CPU: top-level aten ops (no kernels on the CPU)"}


def test_the_context_length_bounds_the_window_as_max_tokens_does(make_llm):
    """max_tokens leaves room, but max_model_len would cut the request (finish reason "context"):
    the window shrinks to the steps the context allows, or is refused when it allows none,
    rather than profiling a batch a request leaves."""
    got = count_kernels(make_llm(max_model_len=10), Workload.uniform([[5, 6]], max_tokens=40))
    assert (got["steps"], got["num_reqs"]) == (5, 1)  # 7 positions left past the 3 tokens known, less 2 steps
    with pytest.raises(ValueError, match=re.escape(
            "the workload leaves no decode step to profile (1 tokens left before max_tokens or the context "
            "length)") + "$"):
        count_kernels(make_llm(max_model_len=4), Workload.uniform([[5, 6]], max_tokens=40), max_steps=2)


def cuda_event(name: str, us: float, activity: str = "kernel") -> SimpleNamespace:
    return SimpleNamespace(device_type=DeviceType.CUDA, name=name, activity_type=activity, cpu_parent=None,
                           time_range=SimpleNamespace(elapsed_us=lambda: us))


def cpu_event(name: str, parent=None) -> SimpleNamespace:
    return SimpleNamespace(device_type=DeviceType.CPU, name=name, activity_type="cpu_op", cpu_parent=parent,
                           time_range=SimpleNamespace(elapsed_us=lambda: 1000.0))


def test_cuda_counts_are_per_step_and_the_device_time_goes_to_kernel_classes_largest_first():
    """A window of 3 steps: 4 kernels (two matmuls), a copy and a set, a sync, and host events
    that are not the device's. Known answers: 4/3 kernels and 2/3 copies a step; per class the
    summed device time over 3 steps, rounded to 0.1 µs, in falling order (not by name)."""
    addmm = cpu_event("aten::addmm")
    events = [addmm, cpu_event("aten::t", addmm),
              cuda_event("sm90_xmma_gemm_bf16bf16_bf16f32", 30.0), cuda_event("triton_red_fused_add_0", 4.6),
              cuda_event("pytorch_flash::flash_fwd_kernel", 62.5), cuda_event("void gemv2T_kernel_val", 15.4),
              cuda_event("Memcpy HtoD (Pinned -> Device)", 2.0, "gpu_memcpy"),
              cuda_event("Memset (Device)", 1.0, "gpu_memset"), cuda_event("Event Sync", 50.0, "cuda_sync")]
    got = count_cuda_events(events, steps=3)
    assert got == {"counted": "CUDA kernels", "kernels_per_step": 1.33, "copies_per_step": 0.67,
                   "kernel_us_per_step": {"attention": 20.8, "matmul": 15.1, "inductor fused": 1.5},
                   "top_kernels": [
                       {"name": "pytorch_flash::flash_fwd_kernel", "per_step": 0.33, "us_per_step": 20.8},
                       {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "per_step": 0.33, "us_per_step": 10.0},
                       {"name": "void gemv2T_kernel_val", "per_step": 0.33, "us_per_step": 5.1},
                       {"name": "triton_red_fused_add_0", "per_step": 0.33, "us_per_step": 1.5}]}
    assert list(got["kernel_us_per_step"]) == ["attention", "matmul", "inductor fused"]


def test_the_top_kernels_sum_each_name_s_launches_cut_long_names_and_keep_the_largest():
    """Kernels by name: one name launched twice a step counts 2 launches and both times; a
    templated name longer than KERNEL_NAME_CHARS is cut to it (two that share the cut prefix are
    one row); past TOP_KERNELS rows, the least device time is left out."""
    from engine.bench.kernel_count import KERNEL_NAME_CHARS, TOP_KERNELS
    long_name = "void cutlass::Kernel<" + "x" * 200
    events = ([cuda_event("triton_poi_fused_mul_silu_1", 2.0) for _ in range(4)]
              + [cuda_event(long_name + "A", 9.0), cuda_event(long_name + "B", 9.0)]
              + [cuda_event(f"tiny_{i}", 0.01 * (i + 1)) for i in range(TOP_KERNELS)])
    top = count_cuda_events(events, steps=2)["top_kernels"]
    assert top[0] == {"name": long_name[:KERNEL_NAME_CHARS], "per_step": 1.0, "us_per_step": 9.0}
    assert top[1] == {"name": "triton_poi_fused_mul_silu_1", "per_step": 2.0, "us_per_step": 4.0}
    assert len(top) == TOP_KERNELS and "tiny_0" not in [row["name"] for row in top]
    assert [row["us_per_step"] for row in top] == sorted((row["us_per_step"] for row in top), reverse=True)


def test_cpu_counts_are_the_top_level_aten_ops_per_step():
    """Top level: an aten op with no parent, or one called from a non-aten frame (a module);
    an aten op called by another aten op, and a host event that is no aten op, do not count."""
    module = cpu_event("nn.Module: Linear_0")
    addmm = cpu_event("aten::addmm", module)
    t = cpu_event("aten::t", addmm)
    events = [cpu_event("ProfilerStep#1"), module, addmm, t, cpu_event("aten::empty", t),
              cpu_event("aten::mm"), cpu_event("aten::copy_"), cpu_event("aten::sum", module),
              cpu_event("aten::argmax"), cuda_event("void gemv2T_kernel_val", 5.0)]
    assert count_top_level_ops(events, steps=3) == {"counted": "CPU: top-level aten ops (no kernels on the CPU)",
                                                    "aten_ops_per_step": 1.67}


@pytest.mark.parametrize("activity, name, kind", [
    ("kernel", "void gemv<float>", "kernel"), ("gpu_memcpy", "Memcpy HtoD", "gpu_memcpy"),
    (None, "Memcpy DtoH (Device -> Pinned)", "gpu_memcpy"), (None, "Memset (Device)", "gpu_memset"),
    (None, "Event Sync", "cuda_sync"), (None, "cudaStreamWaitEvent", "cuda_sync"),
    (None, "ampere_sgemm_128x64_tn", "kernel"), ("kernel", "Memset_fused_kernel", "kernel")])
def test_device_events_are_told_apart(activity, name, kind):
    """The recorded activity type, where there is one, wins over the name."""
    assert device_kind(SimpleNamespace(activity_type=activity, name=name)) == kind


def test_an_event_of_a_torch_without_activity_types_is_told_by_its_name():
    assert device_kind(SimpleNamespace(name="Memcpy DtoH (Device -> Pinned)")) == "gpu_memcpy"


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
