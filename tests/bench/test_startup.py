"""The start-up measurement (engine/bench/startup.py, `specgate bench --measure-startup`) on the CPU,
with the reference forward (inductor's CPU compile takes a minute; tests/bench/test_cuda_bench.py
measures the compiled forward on a GPU): a cold and a warm child, each in a fresh process on one
new inductor cache folder, what each phase is timed as, and the refusals."""
import json
import os
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from engine.bench import startup
from engine.errors import SpecgateError


def test_startup_is_the_engine_and_its_first_request_less_the_steady_request():
    m = startup.StartupMeasurement(2.5, 4.0, 0.75, 3.0, 6, 5, 1, "/c")
    assert m.startup_s == 5.75
    assert m.as_dict() == {"engine_s": 2.5, "first_request_s": 4.0, "steady_request_s": 0.75, "compile_s": 3.0,
                           "graphs": 6, "cache_hits": 5, "cache_misses": 1, "cache_dir": "/c", "startup_s": 5.75}
    rounded = startup.StartupMeasurement(1.23456, 0.0, 0.0, 0.0, 0, 0, 0, None).as_dict()
    assert (rounded["engine_s"], rounded["startup_s"]) == (1.235, 1.235)


def test_compile_seconds_sum_dynamo_s_outermost_compiles_only():
    assert startup.compile_seconds({"_compile.compile_inner": [1.5, 2.25], "bytecode_tracing": [9.0]}) == 3.75
    assert startup.compile_seconds({"bytecode_tracing": [9.0]}) == 0.0
    assert startup.compile_seconds({}) == 0.0


class Ticks:
    """time.perf_counter for startup(): each call returns the next of `values`."""

    def __init__(self, *values: float):
        self.values = iter(values)

    def perf_counter(self) -> float:
        return next(self.values)


def test_one_start_up_times_the_engine_then_the_same_request_twice(monkeypatch, target_dir):
    import torch._dynamo.utils as dynamo_utils

    from engine import LLM
    calls = []
    real = LLM.generate

    def generate(self, prompts, params):
        calls.append((len(prompts), {len(p) for p in prompts}, params.max_tokens, params.ignore_eos,
                      params.temperature, self.config.spec, self.config.num_spec_tokens))
        return real(self, prompts, params)
    monkeypatch.setattr(LLM, "generate", generate)
    monkeypatch.setattr(startup, "time", Ticks(10.0, 12.5, 20.0, 24.0, 30.0, 30.75))
    monkeypatch.setattr(dynamo_utils, "counters", defaultdict(Counter, inductor=Counter(
        fxgraph_cache_hit=3, fxgraph_cache_miss=2)))
    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics", {"_compile.compile_inner": [1.25]})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/some/cache")
    m = startup.startup(str(target_dir), {"spec": "ngram", "num_spec_tokens": 3, "compile": False})
    assert m == startup.StartupMeasurement(2.5, 4.0, 0.75, 1.25, 0, 3, 2, "/some/cache")
    # greedy requests, on the engine the options asked for
    assert calls == [(startup.NUM_PROMPTS, {startup.PROMPT_LEN}, startup.MAX_TOKENS, True, 0, "ngram", 3)] * 2


def test_cold_and_warm_run_in_fresh_children_on_one_new_cache_folder(target_dir, tmp_path, monkeypatch):
    """Both children use the folder given (empty for the cold run); the reference forward compiles
    nothing, so neither touches inductor's cache; the child's own TRITON_CACHE_DIR is dropped."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "elsewhere"))
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        # From any working directory; but not in mutmut's stats pass: the child imports the staged engine,
        # whose trampolines then record their calls and look for mutmut's configuration in the working
        # folder, failing the pass (a child's calls are never in mutmut's map anyway: another process).
        monkeypatch.chdir(tmp_path)
    folder = tmp_path / "inductor"
    folder.mkdir()
    engine = {"spec": "ngram", "num_spec_tokens": 2, "compile": False, "max_num_seqs": 2}
    got = startup.measure_startup(target_dir, engine, cache_dir=folder)
    assert got["engine"] == engine and got["model"] == str(target_dir) and got["torch"] == torch.__version__
    assert got["inductor_cache"] == "a new folder for the cold run, filled by it for the warm run"
    for state in startup.CACHE_STATES:
        m = got[state]
        assert m["cache_dir"] == str(folder) and (m["graphs"], m["cache_hits"], m["cache_misses"]) == (0, 0, 0)
        assert m["compile_s"] == 0.0 and m["engine_s"] > 0 and m["first_request_s"] > 0 and m["steady_request_s"] > 0
        assert m["startup_s"] == pytest.approx(m["engine_s"] + m["first_request_s"] - m["steady_request_s"], abs=2e-3)
    assert json.loads(json.dumps(got)) == got


def test_the_child_imports_the_engine_of_this_tree_first(monkeypatch, tmp_path):
    """An editable install points `engine` at the checkout it was made from; a copy of the tree
    (mutmut's staging, a worktree) must time its own engine: the child's PYTHONPATH starts here.
    The rest of the environment is the parent's, but for TRITON_CACHE_DIR (Triton's kernels go
    inside inductor's cache folder)."""
    seen = {}

    def fake_run(cmd, env, **kwargs):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"startup_s": 1.0}) + "\n", stderr="")
    monkeypatch.setattr(startup.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("SPECGATE_PROBE", "kept")
    monkeypatch.setenv("TRITON_CACHE_DIR", "/dropped")
    assert startup.run_child("m", {}, tmp_path, timeout=5) == {"startup_s": 1.0}
    repo = str(Path(startup.__file__).resolve().parents[2])
    assert seen["PYTHONPATH"].split(os.pathsep) == [repo, "/elsewhere"]
    assert seen[startup.INDUCTOR_CACHE_ENV] == str(tmp_path)
    assert seen["SPECGATE_PROBE"] == "kept" and "TRITON_CACHE_DIR" not in seen


def test_a_child_that_fails_without_a_word_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(startup.subprocess, "run", lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 3, "", ""))
    with pytest.raises(SpecgateError) as failed:
        startup.run_child("m", {}, tmp_path, timeout=5)
    assert str(failed.value) == "the start-up measurement's child process failed (exit 3): no output"


def test_each_child_may_take_half_an_hour_by_default(monkeypatch, tmp_path):
    bounds = []
    monkeypatch.setattr(startup, "run_child", lambda model, engine, folder, timeout: bounds.append(timeout) or {})
    startup.measure_startup("m", {}, cache_dir=tmp_path / "new")
    assert bounds == [1800, 1800]


def test_a_cold_run_needs_an_empty_cache_folder(tmp_path, target_dir):
    (tmp_path / "kernel").write_text("x")
    with pytest.raises(SpecgateError, match=f"needs an empty inductor cache folder, {tmp_path} is not"):
        startup.measure_startup(target_dir, {}, cache_dir=tmp_path)


def test_a_failed_child_says_why(tmp_path):
    """The last line the child wrote to stderr, as text."""
    with pytest.raises(SpecgateError) as failed:
        startup.measure_startup(tmp_path / "missing", {"compile": False})
    assert str(failed.value) == (f"the start-up measurement's child process failed (exit 1): engine.errors."
                                 f"ModelLoadError: model folder {tmp_path / 'missing'} does not exist or is not "
                                 f"a folder")


def test_the_child_prints_its_measurement_as_one_json_line(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(startup, "startup", lambda model, engine: seen.append((model, engine)) or
                        startup.StartupMeasurement(1.0, 2.0, 0.5, 0.0, 0, 0, 0, None))
    startup.child_main(json.dumps({"model": "m", "engine": {"graph": True}}))
    assert seen == [("m", {"graph": True})]
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["startup_s"] == 2.5


def test_a_child_that_outlives_its_timeout_is_stopped(target_dir):
    with pytest.raises(SpecgateError, match=r"did not finish in 0\.01 s; it was stopped"):
        startup.measure_startup(target_dir, {"compile": False}, timeout=0.01)


@pytest.mark.parametrize("flags, device, forward, arm", [
    ([], "cpu", "reference", "eager"), (["--compile"], "cpu", "compiled", "eager"), ([], "cuda", "compiled", "graph"),
    (["--no-graph"], "cuda", "compiled", "eager"), (["--graph"], "cpu", "reference", "graph")])
def test_the_command_hands_the_engine_s_options_and_prints_cold_then_warm(monkeypatch, capsys, tmp_path, flags,
                                                                          device, forward, arm):
    from specgate_cli import main
    seen = []
    measured = startup.StartupMeasurement(1.0, 2.0, 0.5, 1.5, 4, 1, 7, "/c").as_dict()
    monkeypatch.setattr(startup, "measure_startup", lambda model, engine: seen.append(engine) or
                        {"cold": measured, "warm": {**measured, "startup_s": 0.5}})
    out = tmp_path / "s.json"
    assert main(["bench", "--measure-startup", "--spec", "ngram", "--device", device, "--json", str(out), *flags]) == 0
    (engine,) = seen
    assert engine["compile"] == (True if "--compile" in flags else None) and engine["device"] == device
    assert engine["graph"] == {"--graph": True, "--no-graph": False}.get(next(iter(flags), None))
    assert engine["spec"] == "ngram"
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("start-up of ") and f"the {forward} forward, {arm} arm:" in lines[0]
    assert lines[1].startswith("  cold: 2.5 s (engine 1.0 s with 4 graphs captured, first request 2.0 s against "
                               "0.5 s warm; compiling 1.5 s, inductor cache 1 hits, 7 misses)")
    assert lines[2].startswith("  warm: 0.5 s")
    assert json.loads(out.read_text())["cold"] == measured
