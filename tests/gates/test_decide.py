"""`specgate gates decide` (gates/decide.py) and `make gates`, which runs it: on a machine without
CUDA every gate on the CPU then the verdict, KEEP, last; on one with CUDA (faked: the gates runs
are fakes that write reports) every gate on the GPU, then with --bench1b the 1B shape's gates on
its cached folder, then the verdict over both reports; the exit status is the runs'."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from gates import decide, registry
from gates.cli import main
from gates.report import GateReport, GateResult

REPO = Path(__file__).resolve().parents[2]
TREE = {"engine": "e" * 64, "gates": "g" * 64, "fixtures": "f" * 64}


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    """gates.run.run_gates replaced: each call is recorded and writes a report of green gates (red
    when the gate is named in `red`), on the device asked, both forwards judged on CUDA."""
    calls, red = [], set()

    def run_gates(gates, json_path, junit_path, model=None, device=None, proven_against=None, jobs=1):
        calls.append({"gates": [g.name for g in gates], "json": json_path, "junit": junit_path, "model": model,
                      "device": device, "jobs": jobs})
        cuda = device == "cuda"
        ahead = [{"metric": m, "concurrency": c, "interval": [r - 1.01, r - 0.99], "min_effect": 0.02, "ratio": r,
                  "result": "ahead"} for c in (1, 8) for m, r in (("tpot_ms", 0.8), ("output_tokens_per_s", 1.2))]
        measurements = {"speed-ab": [{"drafter": d, "forward": f, "graph_arm": "graph", "ab": ahead}
                                     for d in ("ngram", "block") for f in ("reference", "compiled")]}
        results = [GateResult(g.name, status="red" if g.name in red else "green", reason="fake",
                              measurements=measurements.get(g.name, []),
                              forwards=["reference", "compiled"] if cuda else ["reference"]) for g in gates]
        result = GateReport(results, {"cuda": cuda, "device": device, "sources": TREE})
        Path(json_path).write_text(json.dumps(result.to_json()))
        return result
    monkeypatch.setattr("gates.run.run_gates", run_gates)
    folder = tmp_path / "llama-1b-seed0"
    monkeypatch.setattr(decide, "bench1b_folder", lambda: folder)
    return calls, red, folder


def run_decide(monkeypatch, tmp_path, cuda: bool, *flags: str) -> int:
    monkeypatch.setattr(decide, "has_cuda", lambda: cuda)
    return main(["gates", "decide", "--jobs", "2", "--reports", str(tmp_path / "reports"), *flags])


def test_without_cuda_every_gate_runs_on_the_cpu_and_the_verdict_is_keep_last(fake_runs, monkeypatch, tmp_path,
                                                                              capsys):
    calls, _, _ = fake_runs
    assert run_decide(monkeypatch, tmp_path, False, "--bench1b") == 0
    reports = tmp_path / "reports"
    assert calls == [{"gates": [g.name for g in registry.GATES], "json": str(reports / "gates.json"),
                      "junit": str(reports / "gates.xml"), "model": None, "device": "cpu", "jobs": 2}]
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("verdict: KEEP the veto") and any("no report ran on CUDA" in line for line in out)
    assert ("specgate: --bench1b: the llama-1b benchmark shape's gates (busy, speed-ab, no-sync) judge a GPU, and "
            "this machine has no CUDA: not run") in out


def test_with_cuda_the_fixtures_then_the_1b_shape_then_one_verdict_over_both(fake_runs, monkeypatch, tmp_path,
                                                                             capsys):
    calls, _, folder = fake_runs
    assert run_decide(monkeypatch, tmp_path, True, "--bench1b") == 0
    reports = tmp_path / "reports"
    assert [(c["gates"], c["device"], c["model"], c["json"]) for c in calls] == [
        ([g.name for g in registry.GATES], "cuda", None, str(reports / "gates.json")),
        (["busy", "speed-ab", "no-sync"], "cuda", str(folder), str(reports / "gates-1b.json"))]
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == ("verdict: LIFT the veto (every gate green on CUDA, reference and compiled forward, sdpa "
                       "attention, speed-ab's graph arm ahead beyond the floor)")


def test_without_bench1b_cuda_runs_the_fixtures_alone(fake_runs, monkeypatch, tmp_path):
    calls, _, _ = fake_runs
    assert run_decide(monkeypatch, tmp_path, True) == 0
    assert [c["device"] for c in calls] == ["cuda"] and calls[0]["model"] is None


def test_a_red_gate_in_any_run_fails_the_decision_and_the_verdict_still_prints(fake_runs, monkeypatch, tmp_path,
                                                                               capsys):
    calls, red, _ = fake_runs
    red.add("busy")
    assert run_decide(monkeypatch, tmp_path, True, "--bench1b") == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("verdict: KEEP") and any(line.startswith("  keep: busy is red on cuda") for line in out)


def test_the_device_can_be_forced(fake_runs, monkeypatch, tmp_path):
    calls, _, _ = fake_runs
    assert run_decide(monkeypatch, tmp_path, True, "--device", "cpu", "--bench1b") == 0
    assert [c["device"] for c in calls] == ["cpu", "cpu"]


def test_the_1b_folder_is_the_cached_seeded_llama_1b(monkeypatch, tmp_path):
    from engine.bench import models
    seen = []
    monkeypatch.setattr(models, "write_bench_model", lambda shape, seed, progress=None: seen.append((shape, seed))
                        or tmp_path)
    assert decide.bench1b_folder() == tmp_path and seen == [("llama-1b", 0)]


@pytest.mark.skipif(not (REPO / "Makefile").exists(),
                    reason="no Makefile in this copy (mutmut's staged tree holds the sources and tests only)")
@pytest.mark.parametrize("env, flag", [({}, ""), ({"BENCH1B": "1"}, " --bench1b"), ({"BENCH1B": "0"}, "")])
def test_make_gates_runs_the_decision_with_the_1b_shape_on_request(env, flag):
    # Under `make test` this runs as a sub-make: without the parent's flags, and without the
    # directory lines a sub-make prints.
    outer = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "--no-print-directory", "-n", "gates", *(f"{k}={v}" for k, v in env.items()),
                          "JOBS=3"], cwd=REPO, env=outer, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    assert out[-1] == f".venv/bin/specgate gates decide --jobs 3 --reports reports{flag}"
