"""`specgate bench --count-kernels`: device kernels launched per decode step, in the eager arm.

Launch count is what bounds the eager arm on a fast GPU (each launch costs the host ~10-20 µs),
so it is counted: torch.profiler over a window of decode steps. On CUDA it counts the CUDA
kernels (memory copies and sets apart) and sums their device time per kernel class (matmul,
attention, inductor's fused kernels, index, ...): where a step's GPU time goes. On the CPU there
are no kernels, and it counts the top-level aten ops instead, labelled as such (the ops the
engine's Python dispatches, each of which becomes one or more kernels on a GPU).
"""
import torch
from torch.autograd import DeviceType

from engine.bench.workload import Workload


def count_kernels(llm, workload: Workload, max_steps: int = 8) -> dict:
    """Admit the workload's requests, run until every one is decoding, then profile up to
    `max_steps` decode steps (none admits, prefills or finishes a request) and count per step."""
    if llm.config.graph:
        raise ValueError("count_kernels counts the eager arm: build the engine with graph=False")
    if llm.has_unfinished():
        raise ValueError("count_kernels needs an idle engine")
    params = workload.params(ignore_eos=True)
    for prompt, p in zip(workload.prompt_list(), params):
        llm.add_request(prompt, p)  # all at once: the decode window then holds every request
    while llm.scheduler.waiting or any(r.needs_prefill for r in llm.scheduler.running):
        llm.step()
    llm.step()  # one decode step outside the window: the first one's one-time costs
    # Each step emits at most k+1 tokens per request, and the host learns them a step late; a
    # request ends at max_tokens or at the context length, whichever comes first.
    room = min(min(r.params.max_tokens - len(r.output_token_ids), llm.config.max_model_len - r.num_tokens)
               for r in llm.scheduler.running)
    steps = min(max_steps, room // (llm.config.k + 1) - 2)
    if steps < 1:
        raise ValueError(f"the workload leaves no decode step to profile ({room} tokens left before max_tokens "
                         f"or the context length)")
    cuda = llm.runner.is_cuda
    if cuda:
        torch.cuda.synchronize()  # the window holds only the work its steps launch
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    running = len(llm.scheduler.running)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            llm.step()
    if llm.scheduler.waiting or len(llm.scheduler.running) != running:
        raise RuntimeError("a request was preempted or finished inside the profiled decode window")
    while llm.has_unfinished():
        llm.step()
    events = prof.events()
    return ({"arm": "eager", "steps": steps, "num_reqs": running, "k": llm.config.k}
            | (count_cuda_events(events, steps) if cuda else count_top_level_ops(events, steps)))


# The kernels a step launches by name, most device time first: which fusions a layer got (inductor
# names a kernel by the operations it fused). Names are cut, templated C++ names run to kilobytes.
TOP_KERNELS, KERNEL_NAME_CHARS = 40, 100


def count_cuda_events(events, steps: int) -> dict:
    """Per step, from a profiled window of `steps` decode steps on CUDA: the kernels, the memory
    copies and sets, the kernels' device time by class (largest first) and the TOP_KERNELS
    kernel names with the most device time (launches and µs a step)."""
    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    kinds = [device_kind(e) for e in device_events]
    by_class: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}  # name -> [launches, µs], per step
    for event, kind in zip(device_events, kinds):
        if kind == "kernel":
            us = event.time_range.elapsed_us() / steps
            name = kernel_class(event.name)
            by_class[name] = by_class.get(name, 0.0) + us
            launches_us = by_name.setdefault(event.name[:KERNEL_NAME_CHARS], [0.0, 0.0])
            launches_us[0] += 1 / steps
            launches_us[1] += us
    largest = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:TOP_KERNELS]
    return {"counted": "CUDA kernels", "kernels_per_step": round(kinds.count("kernel") / steps, 2),
            "copies_per_step": round(sum(k in ("gpu_memcpy", "gpu_memset") for k in kinds) / steps, 2),
            "kernel_us_per_step": {name: round(us, 1) for name, us in sorted(by_class.items(), key=lambda kv: -kv[1])},
            "top_kernels": [{"name": name, "per_step": round(n, 2), "us_per_step": round(us, 1)}
                            for name, (n, us) in largest]}


def count_top_level_ops(events, steps: int) -> dict:
    """Per step, on the CPU: the aten ops the engine's Python dispatched (those not called by
    another aten op)."""
    top = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")
           and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
    return {"counted": "CPU: top-level aten ops (no kernels on the CPU)",
            "aten_ops_per_step": round(len(top) / steps, 2)}


# Kernel classes by name, first match wins: where a step's GPU time goes.
KERNEL_CLASSES = (("attention", ("flash", "fmha", "attention", "flex")),
                  ("matmul", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitk")),
                  ("inductor fused", ("triton_",)),
                  ("index/gather/scatter", ("index", "gather", "scatter")),
                  ("reduction", ("reduce",)),
                  ("elementwise", ("elementwise", "vectorized", "unrolled")),
                  ("copy/cat", ("copy", "cat", "fill")))


def kernel_class(name: str) -> str:
    lowered = name.lower()
    return next((cls for cls, marks in KERNEL_CLASSES if any(m in lowered for m in marks)), "other")


def device_kind(event) -> str:
    """kernel, gpu_memcpy, gpu_memset or cuda_sync: the profiler's activity type where this torch
    records it, else read from the name (copies and sets are named Memcpy/Memset, syncs ...Sync/Wait)."""
    kind = getattr(event, "activity_type", None)
    if kind:
        return kind
    name = event.name
    if name.startswith("Memcpy"):
        return "gpu_memcpy"
    if name.startswith("Memset"):
        return "gpu_memset"
    return "cuda_sync" if "Sync" in name or "Wait" in name else "kernel"
