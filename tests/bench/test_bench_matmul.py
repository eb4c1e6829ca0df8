"""The matmul bandwidth benchmark (engine/bench/matmul.py, `specgate bench-model matmul`) on the CPU:
the matrices a step multiplies, packed as the fused forward packs them; a report's rows, bytes and
bandwidth from its own timings; the best variant per matrix and row count, and one step's matmul
time summed from them; the report's timing settings; each compiled variant compiled for real, F.linear
at each row count's own shape, under the inductor settings it is named for; the tensors timed (on the
report's device and dtype, seeded); GB/s's unit; the progress lines; the CPU timer's arithmetic. The
figures themselves are for the GPU (docs/benchmarks.md)."""
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from engine.bench import matmul
from engine.bench.models import SHAPES, config_dict
from engine.config import ModelConfig


def config(tmp_path, shape: str) -> ModelConfig:
    (tmp_path / "config.json").write_text(json.dumps(config_dict(SHAPES[shape])))
    return ModelConfig.from_dir(tmp_path)


def test_the_1b_shape_s_matrices_are_the_fused_forward_s(tmp_path):
    assert matmul.weight_matrices(config(tmp_path, "llama-1b")) == {
        "qkv": (2048 + 2 * 512, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
        "lm_head": (260, 2048)}


def test_the_report_s_figures_follow_from_its_timings(tmp_path, monkeypatch):
    """A stand-in timer: eager takes 1543.2101 µs x M, inductor 2000.0004 µs whatever M (a large
    matrix on a CPU). One call's µs are kept to 0.001 µs, exactly: 1543.210 and 2000.000, neither
    rounded further nor to more places, nor scaled by a part in a million."""
    seconds = {"eager": lambda x: 1.5432101e-3 * x.shape[0], "inductor": lambda x: 2.0000004e-3}
    monkeypatch.setattr(matmul, "matmul_fn", lambda variant: variant)
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seconds[fn](x))
    cfg = config(tmp_path, "tiny")
    told = []
    got = matmul.matmul_report(cfg, "cpu", dtype=torch.float32, rows=(1, 2), variants=("eager", "inductor"),
                               progress=told.append)
    assert len(got["timings"]) == 5 * 2 * 2 and len(told) == 20
    qkv = [t for t in got["timings"] if t["matrix"] == "qkv" and t["rows"] == 2]
    moved = (128 * 64 + 2 * 64 + 2 * 128) * 4  # weight [64 + 2 x 32, 64], input [2, 64], output [2, 128], float32
    assert qkv == [{"matrix": "qkv", "rows": 2, "variant": "eager", "microseconds": 3086.42, "bytes": moved,
                    "gb_per_s": round(moved / 3.0864202e-3 / 1e9, 1)},
                   {"matrix": "qkv", "rows": 2, "variant": "inductor", "microseconds": 2000.0, "bytes": moved,
                    "gb_per_s": round(moved / 2.0000004e-3 / 1e9, 1)}]
    assert got["best"]["qkv M=1"]["variant"] == "eager" and got["best"]["qkv M=2"]["variant"] == "inductor"
    # two layers of four matrices and the head once, each at its best, to 0.001 µs as each is kept
    assert got["per_step_us"] == {"1": 13888.89, "2": 18000.0}


def test_of_two_variants_equally_fast_the_one_listed_first_is_best(tmp_path, monkeypatch):
    """A tie goes to the variant the report lists first (eager: plain cuBLAS, nothing compiled),
    not to whichever was timed last. Stand-in timer: eager 1.5 µs x M, inductor 3 µs."""
    seconds = {"eager": lambda x: 1.5e-6 * x.shape[0], "inductor": lambda x: 3e-6}
    monkeypatch.setattr(matmul, "matmul_fn", lambda variant: variant)
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seconds[fn](x))
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1, 2, 3),
                               variants=("eager", "inductor"))
    assert [got["best"][f"qkv M={m}"]["variant"] for m in (1, 2, 3)] == ["eager", "eager", "inductor"]
    assert got["best"]["qkv M=2"]["microseconds"] == 3.0


def test_eager_timing_runs_on_the_cpu_and_an_unknown_variant_is_refused(tmp_path):
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1,), variants=("eager",),
                               reps=2, repeats=1)
    # Bandwidth is the bytes over the time, to 0.1 GB/s: a tiny matrix on a busy CPU core can round
    # to 0.0 (the full suite beside a mutation run did), so the relation is checked, not the sign.
    assert all(t["microseconds"] > 0 and t["bytes"] > 0 for t in got["timings"])
    assert all(t["gb_per_s"] == pytest.approx(t["bytes"] / t["microseconds"] / 1e3, abs=0.06) for t in got["timings"])
    with pytest.raises(ValueError, match=r"^unknown matmul variant 'cutlass' \(known: eager, inductor, autotune, "
                                         r"coordinate-descent\)$"):
        matmul.matmul_fn("cutlass")


def test_the_command_prints_each_best_figure_and_the_step_sum(capsys, tmp_path):
    from specgate_cli import main
    report = tmp_path / "matmul.json"
    assert main(["bench-model", "matmul", "--shape", "tiny", "--rows", "1", "--variants", "eager",
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "qkv M=1: " in out and "matmuls of one plain step at M=1, each matrix at its best variant: " in out
    assert set(json.loads(report.read_text())["best"]) == {f"{m} M=1" for m in ("qkv", "o_proj", "gate_up", "down",
                                                                               "lm_head")}


def test_the_report_says_how_it_timed_each_figure(tmp_path, monkeypatch):
    """The calls per timing and the timings per median it was asked for, given to every timing and
    kept in the report beside the device, dtype and torch version, so that a figure can be rerun."""
    asked = []
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: asked.append((reps, repeats)) or 1e-6)
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1,), variants=("eager",),
                               reps=7, repeats=3)
    assert asked == [(7, 3)] * 5
    assert {k: got[k] for k in ("device", "gpu", "dtype", "torch", "reps", "repeats")} == {
        "device": "cpu", "gpu": None, "dtype": "float32", "torch": torch.__version__, "reps": 7, "repeats": 3}
    # Unasked, as docs/benchmarks.md's figures were taken: 100 calls a graph, the median of 5.
    asked.clear()
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1,), variants=("eager",))
    assert asked == [(100, 5)] * 5 and (got["reps"], got["repeats"]) == (100, 5)


@pytest.fixture
def dynamo_counters():
    """dynamo's counters from a clean start: every variant compiles F.linear through one code
    object, so what ran before (its cache entries, its recompile count) would count here."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


@pytest.mark.parametrize("variant", [v for v in matmul.VARIANTS if v != "eager"])
def test_each_compiled_variant_multiplies_as_f_linear_with_a_graph_for_each_row_count(variant, dynamo_counters):
    """Compiled for real on the CPU (inductor's matmul there is an extern call: no C++ build): the
    product is F.linear's, and each of the report's row counts gets a graph of its own static shape,
    as a decode step's graph is; not one graph over a symbolic row count, reused from the second
    row count on (dynamo's automatic dynamic shapes), which would time another kernel than a step runs."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 16, generator=g)
    for m in matmul.ROWS:
        x = torch.randn(m, 16, generator=g)
        torch.testing.assert_close(matmul.matmul_fn(variant)(x, w), F.linear(x, w))
    assert dynamo_counters["stats"]["unique_graphs"] == len(matmul.ROWS) == 3


def test_each_compiled_variant_compiles_under_the_settings_it_is_named_for(monkeypatch, dynamo_counters):
    """`inductor` compiles with inductor's defaults, `autotune` with max_autotune on (and coordinate
    descent, which mode max-autotune-no-cudagraphs turns on with it) but no CUDA graphs of inductor's
    own (the benchmark captures its own), `coordinate-descent` with coordinate descent alone: else two
    of the report's variants would time one compilation under two names. Read from inductor's config
    as it stands while it compiles each (on the CPU the kernels come out alike; the settings do not)."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    real, seen = compile_fx.compile_fx, []

    def spy(*args, **kwargs):
        seen.append((inductor_config.max_autotune, inductor_config.coordinate_descent_tuning,
                     inductor_config.triton.cudagraphs))
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx", spy)
    got = {}
    for variant in ("inductor", "autotune", "coordinate-descent"):
        torch._dynamo.reset()
        seen.clear()
        matmul.matmul_fn(variant)(torch.randn(8, 16), torch.randn(24, 16))
        got[variant] = seen[-1]  # the innermost call: the variant's settings applied
    assert got == {"inductor": (False, False, False), "autotune": (True, True, False),
                   "coordinate-descent": (False, True, False)}


def test_each_matmul_is_timed_on_the_report_s_device_in_its_dtype(tmp_path, monkeypatch):
    """Weight and input both moved to the device and dtype asked for (the meta device stands in for
    a GPU here: it is not the CPU the random numbers are drawn on), in the shapes F.linear takes:
    input [M, in_features], weight [out_features, in_features]."""
    seen = []
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seen.append((x, w)) or 1e-6)
    cfg = config(tmp_path, "tiny")
    got = matmul.matmul_report(cfg, "meta", dtype=torch.float16, rows=(1, 8), variants=("eager",))
    assert {(x.device.type, x.dtype, w.device.type, w.dtype) for x, w in seen} == {
        ("meta", torch.float16, "meta", torch.float16)}
    assert [(tuple(x.shape), tuple(w.shape)) for x, w in seen] == [
        ((m, in_f), (out_f, in_f)) for out_f, in_f in matmul.weight_matrices(cfg).values() for m in (1, 8)]
    assert got["device"] == "meta" and got["gpu"] is None


def test_the_timed_matrices_are_seeded_whatever_the_global_random_state(tmp_path, monkeypatch):
    """Two reports multiply the same weights and inputs even when the global generator was seeded
    differently before each: a figure can be rerun on the very numbers it was timed on."""
    cfg = config(tmp_path, "tiny")

    def timed(seed: int) -> list:
        seen = []
        monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seen.append((x, w)) or 1e-6)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            matmul.matmul_report(cfg, "cpu", dtype=torch.float32, rows=(1, 8), variants=("eager",))
        return seen

    first, second = timed(1), timed(2)
    assert len(first) == len(second) == 5 * 2
    assert all(torch.equal(x1, x2) and torch.equal(w1, w2) for (x1, w1), (x2, w2) in zip(first, second))


def test_bandwidth_is_in_units_of_a_billion_bytes_a_second(tmp_path, monkeypatch):
    """GB/s is 10^9 bytes a second, exactly: a stand-in timer at 10^18 bytes a second (no device's
    rate, but one at which a part in 10^9 shows at the report's 0.1 GB/s) reads 10^9 GB/s for every
    matrix and row count, whatever its bytes."""
    def at_an_exabyte_a_second(fn, x: torch.Tensor, w: torch.Tensor, reps: int, repeats: int) -> float:
        return (w.numel() + x.numel() + x.shape[0] * w.shape[0]) * w.element_size() / 1e18

    monkeypatch.setattr(matmul, "time_call", at_an_exabyte_a_second)
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1, 8),
                               variants=("eager",))
    assert len(got["timings"]) == 10 and {t["gb_per_s"] for t in got["timings"]} == {1e9}


def test_each_progress_line_reads_the_timing_it_follows(tmp_path, monkeypatch):
    """One line a timing, as it is taken: the matrix, M, the variant, one call's µs to 0.01 µs and its
    GB/s. A stand-in timer: eager 12.5 ms a call (a large matrix on a CPU), inductor 10 ns."""
    seconds = {"eager": 0.0125, "inductor": 1e-8}
    monkeypatch.setattr(matmul, "matmul_fn", lambda variant: variant)
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seconds[fn])
    told = []
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1,),
                               variants=("eager", "inductor"), progress=told.append)
    assert len(told) == len(got["timings"]) == 5 * 2
    # qkv at M=1 moves (128 x 64 + 64 + 128) float32 = 33536 bytes: 3353.6 GB/s in 10 ns
    assert told[:2] == ["qkv M=1 eager: 12500.00 µs, 0 GB/s", "qkv M=1 inductor: 0.01 µs, 3354 GB/s"]


def test_a_cpu_timing_is_one_call_s_seconds_the_median_over_the_repeats(monkeypatch):
    """On the CPU a timing is the wall clock over `reps` calls divided by reps, the figure the median
    of `repeats` timings, and the three warm-up calls (compilation, autotuning) count in none. A
    stand-in clock that each call moves on: 1 s a warm-up call, then 3, 1 and 2 µs a call."""
    clock = [0.0]
    costs = iter([1.0] * 3 + [3e-6] * 4 + [1e-6] * 4 + [2e-6] * 4)

    def call(x: torch.Tensor, w: torch.Tensor) -> None:
        clock[0] += next(costs)

    monkeypatch.setattr(matmul, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    assert matmul.time_call(call, torch.zeros(1, 2), torch.zeros(3, 2), reps=4, repeats=3) == pytest.approx(
        2e-6, rel=1e-6)
    assert next(costs, None) is None  # 3 warm-up calls and 3 x 4 timed ones, no more


def test_every_compiled_timing_of_a_whole_report_times_a_compiled_graph(tmp_path, dynamo_counters):
    """A report compiles F.linear once per matrix, row count and variant (the 1B shape's: 5 x 3 x 3 = 45
    graphs, all on one code object). Past dynamo's recompile limit (8 by default) torch.compile falls
    back to running F.linear eagerly, silently, and the report would time cuBLAS under an inductor
    variant's name (seen on the CPU: 37 of 45). Every compiled call must have its own graph; a report
    too large for the raised limit must fail, not time eager calls."""
    small = config(tmp_path, "tiny")  # the 1B shape's five matrices, small
    rows, compiled = (1, 2, 3), ("inductor", "autotune", "coordinate-descent")
    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default, whatever ran before
        matmul.matmul_report(small, "cpu", dtype=torch.float32, rows=rows, variants=compiled, reps=1, repeats=1)
    assert dynamo_counters["stats"]["unique_graphs"] == len(matmul.weight_matrices(small)) * len(rows) * len(compiled)


def test_the_weight_copies_a_cuda_timing_cycles_through_hold_twice_the_l2_cache():
    """On the H100 (50 MB of L2) o_proj's 8 MB needs 13 copies, gate/up's 64 MB two: a call never
    finds its weight left in L2 by the calls before it, as a step reads each layer's weight once."""
    mb = 2 ** 20
    assert matmul.copies_past_l2(8 * mb, 50 * mb) == 13
    assert matmul.copies_past_l2(12 * mb, 50 * mb) == 9  # QKV: 108 MB, past 100 MB
    assert matmul.copies_past_l2(64 * mb, 50 * mb) == 2
    assert matmul.copies_past_l2(100 * mb, 50 * mb) == 1
    assert matmul.copies_past_l2(4, 0) == 1


def test_a_timed_call_cycles_through_the_weight_s_copies():
    """Call after call, the next copy in turn, whatever weight the timer passes; each copy holds the
    weight's values in storage of its own. One copy (a CPU, or a weight past twice the L2): the
    function itself, unwrapped."""
    w = torch.arange(6.0).reshape(2, 3)
    weights = matmul.weight_copies(w, l2_bytes=2 * w.numel() * 4)  # 4 copies
    assert len(weights) == 4 and weights[0] is w
    assert all(torch.equal(c, w) for c in weights) and len({c.data_ptr() for c in weights}) == 4
    seen, x = [], torch.zeros(1, 3)
    timed = matmul.cycling(lambda x_in, weight: seen.append((x_in, weight)), weights)
    for _ in range(6):
        timed(x, w)
    assert all(x_in is x for x_in, _ in seen)  # the rows go through untouched
    assert [next(i for i, c in enumerate(weights) if c is s) for _, s in seen] == [0, 1, 2, 3, 0, 1]
    assert matmul.cycling(F.linear, [w]) is F.linear and matmul.weight_copies(w, 0) == [w]
