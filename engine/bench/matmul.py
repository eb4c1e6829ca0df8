"""Matmul bandwidth per weight matrix (issue 36, point 3): what each of a model's weight matrices,
as the fused forward packs them (engine/fused.py: q/k/v stacked, gate/up stacked), reaches at the
row counts a step multiplies it by: M = 1 and 8 (plain decode at c=1 and c=8) and 5 x 8 (verify
with k=4 at c=8).

Each variant multiplies the same bf16 weight: `eager` is F.linear (cuBLAS / cuBLASLt on CUDA),
`inductor` the same call under torch.compile (inductor's choice: a template, an extern call to
cuBLAS, or a Triton kernel), `autotune` torch.compile with mode="max-autotune-no-cudagraphs"
(inductor benchmarks its Triton templates against cuBLAS and keeps the fastest) and
`coordinate-descent` inductor with coordinate_descent_tuning on. On CUDA, `reps` calls are
captured in one CUDA graph and the replay is timed with CUDA events, so launch gaps do not count
(a plain decode step replays a graph too); bandwidth = (weight + input + output bytes) / time.
The calls cycle through copies of the weight that together hold twice the GPU's L2 cache, so each
call reads its weight from memory, as a step reads each layer's once: one weight called 100 times
in a row stayed partly in the H100's 50 MB L2, and o_proj (8 MB) read 2,143 GB/s "alone" against
1,301 GB/s over 16 distinct copies (2026-12-07, docs/measurements.md).
On the CPU the same code runs with a wall clock and without a graph (tests check the plumbing;
the figures are not the point there).
"""
import itertools
import statistics
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from engine.attention import compile_fullgraph
from engine.config import ModelConfig

VARIANTS = ("eager", "inductor", "autotune", "coordinate-descent")
ROWS = (1, 8, 40)


def weight_matrices(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each matrix a decode step multiplies, packed as engine/fused.py packs them."""
    d, q, kv = cfg.hidden_size, cfg.num_attention_heads * cfg.dim_per_head, cfg.num_key_value_heads * cfg.dim_per_head
    return {"qkv": (q + 2 * kv, d), "o_proj": (d, q), "gate_up": (2 * cfg.intermediate_size, d),
            "down": (d, cfg.intermediate_size), "lm_head": (cfg.vocab_size, d)}


def matmul_fn(variant: str):
    """F.linear, or it compiled the way `variant` names."""
    if variant == "eager":
        return F.linear
    # A report compiles F.linear (one code object) once per matrix, row count and variant: 45 graphs on
    # the 1B shape, past dynamo's default recompile limit of 8, beyond which a plain torch.compile
    # silently runs F.linear eagerly. compile_fullgraph raises the limit, and fails past it.
    if variant == "inductor":
        return compile_fullgraph(F.linear, dynamic=False)
    if variant == "autotune":
        return compile_fullgraph(F.linear, dynamic=False, mode="max-autotune-no-cudagraphs")
    if variant == "coordinate-descent":
        return compile_fullgraph(F.linear, dynamic=False, options={"coordinate_descent_tuning": True})
    raise ValueError(f"unknown matmul variant {variant!r} (known: {', '.join(VARIANTS)})")


@dataclass(frozen=True)
class MatmulTiming:
    matrix: str
    rows: int
    variant: str
    microseconds: float     # one call, the median over the repeats
    bytes: int              # weight + input + output
    gb_per_s: float


def copies_past_l2(weight_bytes: int, l2_bytes: int) -> int:
    """How many copies of a weight hold at least twice the L2 cache: cycled through, no call finds
    its weight still cached by the calls before it."""
    return max(1, -(-2 * l2_bytes // weight_bytes))


def weight_copies(w: torch.Tensor, l2_bytes: int) -> list[torch.Tensor]:
    """w and as many clones as copies_past_l2 asks for."""
    return [w] + [w.clone() for _ in range(copies_past_l2(w.numel() * w.element_size(), l2_bytes) - 1)]


def cycling(fn, weights: list[torch.Tensor]):
    """fn, each call given the next of `weights` (copies of one weight) in place of the weight it
    is passed; fn itself where there is one copy."""
    if len(weights) == 1:
        return fn
    turn = itertools.count()
    return lambda x, _w: fn(x, weights[next(turn) % len(weights)])


def time_call(fn, x: torch.Tensor, w: torch.Tensor, reps: int, repeats: int) -> float:
    """Median seconds of one fn(x, w) over `repeats` timings of `reps` calls (a CUDA graph on CUDA)."""
    cuda = x.device.type == "cuda"
    for _ in range(3):  # compile, autotune, warm the caches
        fn(x, w)
    if cuda:
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(x, w)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn(x, w)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        if cuda:
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / reps)  # ms
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn(x, w)
            times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def matmul_report(cfg: ModelConfig, device: str, dtype: torch.dtype = torch.bfloat16, rows=ROWS,
                  variants=VARIANTS, reps: int = 100, repeats: int = 5, progress=None) -> dict:
    """Every matrix x row count x variant, on seeded random weights of the shape."""
    g = torch.Generator().manual_seed(0)
    timings = []
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.startswith("cuda") else 0
    for name, (out_f, in_f) in weight_matrices(cfg).items():
        w = torch.randn(out_f, in_f, generator=g).to(device=device, dtype=dtype)
        weights = weight_copies(w, l2)
        for m in rows:
            x = torch.randn(m, in_f, generator=g).to(device=device, dtype=dtype)
            moved = (w.numel() + x.numel() + m * out_f) * w.element_size()
            for variant in variants:
                seconds = time_call(cycling(matmul_fn(variant), weights), x, w, reps, repeats)
                t = MatmulTiming(name, m, variant, round(seconds * 1e6, 3), moved, round(moved / seconds / 1e9, 1))
                timings.append(t)
                if progress is not None:
                    progress(f"{name} M={m} {variant}: {t.microseconds:.2f} µs, {t.gb_per_s:.0f} GB/s")
    best = {}
    for t in timings:
        key = f"{t.matrix} M={t.rows}"
        if key not in best or t.microseconds < best[key]["microseconds"]:
            best[key] = {"variant": t.variant, "microseconds": t.microseconds, "gb_per_s": t.gb_per_s}
    # A plain step multiplies each layer's four matrices and the head once: its matmul time at the
    # best variant of each (issue 36's target: at most 0.60 ms at c=1 on the 1B shape).
    per_step = {str(m): round(sum(best[f"{name} M={m}"]["microseconds"] * (1 if name == "lm_head" else
                                                                           cfg.num_hidden_layers)
                                  for name in weight_matrices(cfg)), 3) for m in rows}
    return {"device": device, "gpu": torch.cuda.get_device_name(0) if device.startswith("cuda") else None,
            "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "reps": reps, "repeats": repeats,
            "timings": [asdict(t) for t in timings], "best": best, "per_step_us": per_step}
