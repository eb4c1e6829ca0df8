"""scripts/gpu-check.sh's 1B benchmark stage, run on the CPU with the tiny benchmark shape: the
shell is well formed (bash -n; shellcheck where installed), every step of the stage runs, the
summary JSON, PNG and table are written, and the stage says why the parts that need CUDA or an
oracle proposer did not run. The GPU figures themselves come from the lead's device run."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import TARGET_DIR
from helpers.gate_reports import gate, model_report, on_own_folder, report

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"


def run_stage(tmp_path, stage: str, **env) -> subprocess.CompletedProcess:
    """The script's `stage` on the CPU with the tiny benchmark shape, reports under tmp_path/out;
    it must exit 0."""
    env = dict(os.environ, PYTHON=sys.executable, BENCH_DEVICE="cpu", BENCH1B_SHAPE="tiny",
               BENCH1B_DIR=str(tmp_path / "model"), OUT=str(tmp_path / "out"), **env)
    proc = subprocess.run(["bash", str(SCRIPT), stage], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_the_script_is_well_formed_shell():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_pack_leaves_one_archive_of_every_report(tmp_path):
    """The lent machine brings back at most 8 files; the bench1b stage alone writes about 15."""
    import tarfile
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), PACK="1")
    proc = subprocess.run(["bash", str(SCRIPT), "verdict"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert [p.name for p in out.iterdir()] == ["gpu-check.tar.gz"], proc.stdout + proc.stderr
    with tarfile.open(out / "gpu-check.tar.gz") as archive:
        assert "./verdict.log" in archive.getnames()
    assert f"packed: {out}/gpu-check.tar.gz" in proc.stdout


def verdict_log(out: Path, **reports: dict) -> str:
    """The script's verdict stage over out's reports, after writing each given one as out/NAME.json;
    its log."""
    out.mkdir(exist_ok=True)
    for name, content in reports.items():
        (out / f"{name}.json").write_text(json.dumps(content))
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out))
    subprocess.run(["bash", str(SCRIPT), "verdict"], cwd=REPO, env=env, capture_output=True, timeout=120)
    return (out / "verdict.log").read_text()


def keep_reasons(log: str) -> str:
    assert "verdict: KEEP" in log, log
    return log.split("verdict: KEEP", 1)[1]


def test_the_verdict_stage_judges_the_1b_report_beside_the_rounds(tmp_path):
    """One call can run `env gates gates1b verdict`: the verdict must read gates1b.json too, or a
    red 1B gate would not keep the veto."""
    out = tmp_path / "out"
    # the negative control: the fixtures' round alone lifts
    assert "verdict: LIFT" in verdict_log(out, **{"gates-cuda-1": report()})
    log = verdict_log(out, gates1b=model_report("/tmp/llama-1b", busy=gate("busy", "red")))
    assert "busy did not run green" in keep_reasons(log)


def test_the_verdict_stage_judges_the_depth1b_report_beside_the_rounds(tmp_path):
    """One call can run `env gates gates1b depth1b verdict`: the verdict must read depth1b.json too,
    or a red depth gate on CUDA would not keep the veto. depth1b runs `gates run depth` without
    --model: its environment names the fixture target, which the depth gate does not run on; its
    result names the folder it ran on (`models`, the 1B deep shape), and the verdict asks no
    model-size gates (busy, speed-ab, no-sync) of that folder."""
    out = tmp_path / "out"
    fixtures = str(TARGET_DIR)
    round_1 = report()
    round_1["environment"]["model"] = fixtures
    assert "verdict: LIFT" in verdict_log(out, **{"gates-cuda-1": round_1})
    # the negative control: a green depth1b report beside the round still lifts
    depth = on_own_folder(gate("depth"))
    assert "verdict: LIFT" in verdict_log(out, depth1b=model_report(fixtures, names=("depth",), depth=depth))
    red = on_own_folder(gate("depth", "red"))
    log = verdict_log(out, depth1b=model_report(fixtures, names=("depth",), depth=red))
    assert "depth is red on cuda" in keep_reasons(log)


def test_the_matmul1b_stage_times_each_weight_matrix_on_the_cpu_with_the_tiny_shape(tmp_path):
    out = tmp_path / "out"
    proc = run_stage(tmp_path, "matmul1b", MATMUL1B_ARGS="--rows 1,8 --variants eager")
    assert "matmul1b         rc=0" in proc.stdout
    report = json.loads((out / "matmul1b.json").read_text())
    assert {(t["matrix"], t["rows"]) for t in report["timings"]} == {
        (m, r) for m in ("qkv", "o_proj", "gate_up", "down", "lm_head") for r in (1, 8)}
    assert set(report["per_step_us"]) == {"1", "8"}


def test_the_tiles1b_stage_says_it_needs_cuda_on_a_machine_without_one(tmp_path):
    proc = run_stage(tmp_path, "tiles1b")
    assert re.search(r"tiles1b +rc=1 .*needs a CUDA GPU", proc.stdout), proc.stdout


def test_the_tile_sweep_times_the_tiles_the_engine_runs_among_settings_that_fit():
    """scripts/gemv_tile_sweep.py's grid holds tiles_for's choice for each of the 1B shape's matrices (so
    every sweep times the engine's tiles beside the rest), and only settings the kernels take."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import gemv_tile_sweep as sweep
    finally:
        sys.path.remove(str(REPO / "scripts"))
    for name, (n, k) in sweep.MATRICES.items():
        grid = sweep.settings(name)
        assert sweep.engine_setting(name) in grid, name
        assert all(t.block_k <= k and n % t.block_n == 0 and (name != "qkv" or t.block_n % 2 == 0) for t in grid), name


@pytest.mark.slow
def test_the_bench1b_stage_runs_end_to_end_on_the_cpu_with_the_tiny_shape(tmp_path):
    out = tmp_path / "out"
    proc = run_stage(tmp_path, "bench1b", BENCH1B_DECODE_ARGS="--prompt-len 8 --max-tokens 6 --legs 1",
                     BENCH1B_LEG_ARGS="--num-prompts 2 --max-tokens 6 --legs 2")
    for step in ("write", "load", "decode", "peer", "summary"):
        assert f"bench1b-{step:<8} rc=0" in proc.stdout, step
    summary = json.loads((out / "bench1b.json").read_text())
    assert set(summary["rows"]) == {"1", "8"}
    assert {"graph/sync", "graph/async"} <= set(summary["rows"]["8"])
    assert summary["peer"] == {"ran": False, "why": "the peer runs on CUDA only (device cpu): transformers "
                                                    "compiles a static-cache generate only on a GPU",
                               "dense": {"ran": False, "why": "the dense peer runs on CUDA only (device cpu): "
                                                              "its figure is a compiled decode step replayed as "
                                                              "a CUDA graph"}}
    assert summary["load"]["num_shards"] == 2
    assert (out / "bench1b.png").read_bytes()[:4] == b"\x89PNG"
    table = proc.stdout.split("bench1b-summary", 2)[-1]
    assert "ms per plain decode step" in table and "HBM floor" in table and "transformers peer: not run" in table
    oracle = subprocess.run([sys.executable, "-m", "specgate_cli", "bench", "--help"], cwd=REPO,
                            capture_output=True, text=True).stdout
    if "--oracle-tau" in oracle:
        assert summary["spec_rows"] and "bench oracle-4.3 c=1" in table
    else:
        assert "bench1b-spec     skipped: this tree has no oracle proposer" in proc.stdout


@pytest.mark.slow
def test_the_startup_stage_measures_cold_and_warm_on_the_fixtures_and_the_1b_folder(tmp_path):
    """On the CPU with the reference forward (a CPU compile takes minutes) and the tiny shape: both
    steps run and write their reports; on the GPU the stage times the compiled forward."""
    out = tmp_path / "out"
    proc = run_stage(tmp_path, "startup", STARTUP_ARGS="--no-compile")
    for step in ("startup", "startup1b-write", "startup1b"):
        assert re.search(rf"^== {step}\s+rc=0 ", proc.stdout, re.M), step
    for name in ("startup.json", "startup1b.json"):
        report = json.loads((out / name).read_text())
        assert set(report) >= {"cold", "warm"} and report["engine"]["graph"] is True
        assert report["engine"]["compile"] is False and report["cold"]["engine_s"] > 0
    assert json.loads((out / "startup1b.json").read_text())["model"] == str(tmp_path / "model")


@pytest.mark.slow
def test_a_round_runs_in_parts_each_with_its_own_reports(tmp_path):
    """With both forwards a round outgrows one device call: PART and GATES run some gates of it,
    and the later rounds repeat only the REPEAT_GATES among them."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(out), GATE_DEVICE="cpu", PART="x", GATES="oracle",
               ROUNDS="2", REPEAT_GATES="lossless oracle", GATES_TIMEOUT="300")
    proc = subprocess.run(["bash", str(SCRIPT), "gates"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for i in (1, 2):
        report = json.loads((out / f"gates-cuda-x-{i}.json").read_text())
        assert [g["name"] for g in report["gates"]] == ["oracle"], i
        assert f"gates-cuda-x-{i}" in proc.stdout


@pytest.mark.slow
def test_timed_arms_reaches_the_1b_stage_and_its_report_names_the_arm(tmp_path):
    """TIMED_ARMS=graph: the 1B stage's timed gates measure the arm the verdict judges alone, and
    the report says so (the eager arm's claim waived with the reason)."""
    run_stage(tmp_path, "gates1b", TIMED_ARMS="graph")
    report = json.loads((tmp_path / "out" / "gates1b.json").read_text())
    assert report["environment"]["timed_arms"] == ["graph"]
    speed = next(g for g in report["gates"] if g["name"] == "speed-ab")
    assert speed["status"] == "green" and speed["num_cases"] > 0
    assert speed["waived_claims"]["eager arm"] == "not measured: --timed-arms graph"
