"""The matmul bandwidth benchmark (engine/bench/matmul.py, `specgate bench-model matmul`) on the CPU:
the matrices a step multiplies, packed as the fused forward packs them; a report's rows, bytes and
bandwidth from its own timings; the best variant per matrix and row count, and one step's matmul
time summed from them; the report's timing settings; each compiled variant compiled for real, F.linear
at each row count's own shape. The figures themselves are for the GPU (docs/benchmarks.md)."""
import json

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
    """A stand-in timer: eager takes 2 µs x M, inductor 3 µs whatever M."""
    seconds = {"eager": lambda x: 2e-6 * x.shape[0], "inductor": lambda x: 3e-6}
    monkeypatch.setattr(matmul, "matmul_fn", lambda variant: variant)
    monkeypatch.setattr(matmul, "time_call", lambda fn, x, w, reps, repeats: seconds[fn](x))
    cfg = config(tmp_path, "tiny")
    told = []
    got = matmul.matmul_report(cfg, "cpu", dtype=torch.float32, rows=(1, 2), variants=("eager", "inductor"),
                               progress=told.append)
    assert len(got["timings"]) == 5 * 2 * 2 and len(told) == 20
    qkv = [t for t in got["timings"] if t["matrix"] == "qkv" and t["rows"] == 2]
    moved = (128 * 64 + 2 * 64 + 2 * 128) * 4  # weight [64 + 2 x 32, 64], input [2, 64], output [2, 128], float32
    assert qkv == [{"matrix": "qkv", "rows": 2, "variant": "eager", "microseconds": 4.0, "bytes": moved,
                    "gb_per_s": round(moved / 4e-6 / 1e9, 1)},
                   {"matrix": "qkv", "rows": 2, "variant": "inductor", "microseconds": 3.0, "bytes": moved,
                    "gb_per_s": round(moved / 3e-6 / 1e9, 1)}]
    assert got["best"]["qkv M=1"]["variant"] == "eager" and got["best"]["qkv M=2"]["variant"] == "inductor"
    # two layers of four matrices and the head once, each at its best: M=1 2 µs, M=2 3 µs
    assert got["per_step_us"] == {"1": 2 * 4 * 2.0 + 2.0, "2": 2 * 4 * 3.0 + 3.0}


def test_eager_timing_runs_on_the_cpu_and_an_unknown_variant_is_refused(tmp_path):
    got = matmul.matmul_report(config(tmp_path, "tiny"), "cpu", dtype=torch.float32, rows=(1,), variants=("eager",),
                               reps=2, repeats=1)
    # Bandwidth is the bytes over the time, to 0.1 GB/s: a tiny matrix on a busy CPU core can round
    # to 0.0 (the full suite beside a mutation run did), so the relation is checked, not the sign.
    assert all(t["microseconds"] > 0 and t["bytes"] > 0 for t in got["timings"])
    assert all(t["gb_per_s"] == pytest.approx(t["bytes"] / t["microseconds"] / 1e3, abs=0.06) for t in got["timings"])
    with pytest.raises(ValueError, match="unknown matmul variant 'cutlass'"):
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
