"""Tile sweep for engine/gemv.py's one-token kernels on the 1B shape, on this GPU (CUDA only).

Each of a layer's four kernels (attention_inputs; o_proj + residual; norm + gate/up; silu * up +
down + residual) is timed over 16 distinct weights a CUDA-graph replay, as a step's 16 layers
read them (past the L2), for every tile setting in TILE_GRID, through the engine's own `project`
and `attention_inputs` (what FusedForward runs, with `tiles=`); the best eight are re-timed,
interleaved, three times. Last, a whole step's 64 kernels with the best tiles against tiles_for's,
twice each. The compiles run first, in parallel processes that fill Triton's disk cache.
Triton's default num_stages throughout: in the first sweep, stages 1 to 4 moved the best
settings by under 1%. tiles_for (engine/gemv.py) holds what this chose; docs/measurements.md (2026-12-07,
fifth session) has the run.

    python scripts/gemv_tile_sweep.py [--json FILE]     # about 90 s on an H100
"""
import argparse
import dataclasses
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from engine.gemv import Tiles, attention_inputs, project, tiles_for  # noqa: E402  (the repository root first)

LAYERS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 16, 2048, 8192, 32, 8, 64
MATRICES = {"qkv": ((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), "o_proj": (HIDDEN, HIDDEN),
            "gate_up": (2 * INTERMEDIATE, HIDDEN), "down": (HIDDEN, INTERMEDIATE)}
TILE_GRID = dict(block_n=(1, 2, 4, 8, 16), block_k=(256, 512, 1024, 2048, 4096), num_warps=(1, 2, 4, 8, 16))


class Buffers:
    """Seeded random bf16 weights, LAYERS of each matrix, and one token's inputs."""

    def __init__(self, layers: int):
        g = torch.Generator(device="cuda").manual_seed(0)

        def rnd(*shape: int, scale: float = 0.02) -> torch.Tensor:
            return (torch.randn(*shape, generator=g, device="cuda") * scale).to(torch.bfloat16)

        self.weights = {name: [rnd(n, k) for _ in range(layers)] for name, (n, k) in MATRICES.items()}
        self.x, self.gate_up_row = rnd(1, HIDDEN, scale=1.0), rnd(1, 2 * INTERMEDIATE, scale=1.0)
        self.norm, self.residual = 1 + rnd(HIDDEN, scale=0.1), rnd(1, HIDDEN, scale=1.0)
        angles = torch.rand(HEAD_DIM, device="cuda")
        self.cos, self.sin = angles.cos(), angles.sin()
        self.caches = [torch.zeros(2, 64, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
                       for _ in range(layers)]
        self.slot = torch.tensor([5], device="cuda")


def launch(b: Buffers, name: str, layer: int, tiles: Tiles) -> None:
    """The engine's kernel for `name` on layer `layer`'s weight, with `tiles`, its neighbours fused in
    as FusedForward calls it."""
    weight = b.weights[name][layer]
    if name == "qkv":
        attention_inputs(b.x, b.norm, 1e-5, weight, b.cos, b.sin, HEADS, KV_HEADS, HEAD_DIM, b.caches[layer],
                         b.slot, tiles=tiles)
    elif name == "o_proj":
        project(b.x, weight, residual=b.residual, tiles=tiles)
    elif name == "gate_up":
        project(b.x, weight, norm=b.norm, eps=1e-5, tiles=tiles)
    else:
        project(b.gate_up_row, weight, silu_mul=True, residual=b.residual, tiles=tiles)


def settings(name: str) -> list[Tiles]:
    """TILE_GRID's settings that fit: a chunk no longer than K, whole output tiles (attention_inputs:
    pairs, so at least 2), and between 8 and 128 weight values a thread."""
    n, k = MATRICES[name]
    return [Tiles(bn, bk, w) for bn, bk, w in itertools.product(*TILE_GRID.values())
            if bk <= k and n % bn == 0 and not (name == "qkv" and bn < 2) and 256 * w <= bn * bk <= 4096 * w]


def compile_settings(jobs: list[tuple[str, Tiles]]) -> int:
    """Launch each (matrix, setting) once: Triton compiles it into its disk cache. The failures."""
    b, failed = Buffers(1), 0
    for name, setting in jobs:
        try:
            launch(b, name, 0, setting)
        except Exception:  # a setting the GPU cannot run (registers, shared memory): left out of the timing
            failed += 1
    torch.cuda.synchronize()
    return failed


def compile_in_parallel(jobs: list[tuple[str, Tiles]], processes: int = 14) -> None:
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        failed = sum(pool.map(compile_settings, [jobs[i::processes] for i in range(processes)]))
    print(f"compiled {len(jobs)} settings in {time.time() - t0:.0f} s ({failed} failed)", flush=True)


def graph_us(fn: Callable[[], object], replays: int = 20) -> float:
    """Median µs of one CUDA-graph replay of fn (captured after two eager warm-up calls)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def per_layer_us(b: Buffers, name: str, tiles: Tiles) -> float:
    return graph_us(lambda: [launch(b, name, layer, tiles) for layer in range(LAYERS)]) / LAYERS


def engine_setting(name: str) -> Tiles:
    return tiles_for(*MATRICES[name])


def timed(b: Buffers, name: str, candidates: list[Tiles]) -> list[tuple[float, Tiles]]:
    rows = []
    for setting in candidates:
        try:
            rows.append((per_layer_us(b, name, setting), setting))
        except Exception as e:  # noqa: BLE001  (named and left out)
            print(f"  left out {name} {setting}: {type(e).__name__}", flush=True)
    return sorted(rows)


def sweep_matrix(b: Buffers, name: str) -> dict:
    n, k = MATRICES[name]
    megabytes = n * k * 2 / 1e6
    cublas = graph_us(lambda: [F.linear(b.x if k == HIDDEN else b.gate_up_row[:, :k], w)
                               for w in b.weights[name]]) / LAYERS
    rows = timed(b, name, settings(name))
    finalists = list(dict.fromkeys([s for _, s in rows[:8]] + [engine_setting(name)]))
    again: dict[Tiles, list[float]] = {s: [] for s in finalists}
    for _ in range(3):  # interleaved, so a drift in the clock touches every finalist alike
        for s in finalists:
            again[s].append(per_layer_us(b, name, s))
    final = sorted((statistics.median(v), s) for s, v in again.items())
    engine = statistics.median(again[engine_setting(name)])

    def entry(us: float, t: Tiles) -> dict:
        return {"tiles": dataclasses.asdict(t), "us": round(us, 2), "GB_per_s": round(megabytes * 1e3 / us)}

    print(f"{name} [{n} x {k}]: cuBLAS {cublas:.2f} µs; tiles_for {engine_setting(name)} {engine:.2f} µs "
          f"({megabytes * 1e3 / engine:.0f} GB/s); best {final[0][1]} {final[0][0]:.2f} µs "
          f"({megabytes * 1e3 / final[0][0]:.0f} GB/s)", flush=True)
    return {"megabytes": round(megabytes, 1), "cublas_us": round(cublas, 2), "tiles_for": entry(engine,
            engine_setting(name)), "best": [entry(us, s) for us, s in final[:5]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the sweep here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gemv_tile_sweep: needs a CUDA GPU (it times CUDA-graph replays)")
    t0 = time.time()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, Triton {triton.__version__}", flush=True)
    compile_in_parallel([(name, s) for name in MATRICES for s in settings(name)])
    b = Buffers(LAYERS)
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
              "matrices": {name: sweep_matrix(b, name) for name in MATRICES}}
    best = {name: Tiles(**report["matrices"][name]["best"][0]["tiles"]) for name in MATRICES}
    gigabytes = sum(n * k * 2 for n, k in MATRICES.values()) * LAYERS / 1e9
    report["step_us"] = {"tiles_for": [], "best": []}
    for label, pick in [("tiles_for", engine_setting), ("best", best.get)] * 2:
        us = graph_us(lambda: [launch(b, name, layer, pick(name)) for layer in range(LAYERS) for name in MATRICES])
        report["step_us"][label].append(round(us, 1))
        print(f"a step's {4 * LAYERS} kernels, {label} tiles: {us:.1f} µs ({gigabytes * 1e6 / us:.0f} GB/s)",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
