"""Run gates: one pytest process over the selected gate modules with the gates plugin, then the
report (JSON, JUnit, a table) and an exit status that is non-zero when any gate is red or errored.

pytest runs in a child process so each run starts clean (torch threads, Hypothesis profile,
imported engine code), the way a seeded-defect run needs it.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from gates import report
from gates.registry import Gate

REPO = Path(__file__).resolve().parent.parent


def run_gates(gates: list[Gate], json_path: str | None = None, junit_path: str | None = None,
              deep: bool = False, model: str | None = None, drafter: str | None = None,
              device: str | None = None, pytest_args: tuple[str, ...] = (), quiet: bool = False,
              proven_against: Mapping[str, tuple[str, ...]] | None = None,
              coverage_dir: str | None = None) -> dict:
    """Run the gates in one pytest process; `proven_against` (gate -> defect names, from the
    defect catalogue a layer above) goes into each gate's result. With `coverage_dir`, under
    coverage.py: each gate's reach goes into its result, the HTML report into coverage_dir, and
    the unreached request-path branches into the report's "reach" (gates/reach.py)."""
    started, t0 = time.time(), time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="specgate-gates-") as tmp:
        raw_path, spec_path = Path(tmp) / "report.json", Path(tmp) / "gates.json"
        spec_path.write_text(json.dumps([{**asdict(g), "path": str(g.file)} for g in gates]))
        data_file = Path(tmp) / ".coverage"
        measure = (["-m", "coverage", "run", "--branch", f"--source={REPO / 'engine'}", f"--data-file={data_file}"]
                   if coverage_dir else [])
        cmd = [sys.executable, *measure, "-m", "pytest", "-p", "gates.plugin", f"--rootdir={REPO}",
               "-c", str(REPO / "pyproject.toml"), "--gates-report", str(raw_path),
               "--gates-spec", str(spec_path), "--gates-no-table", *(str(g.file) for g in gates), *pytest_args]
        for flag, value in (("--model", model), ("--drafter", drafter), ("--device", device)):
            if value:
                cmd += [flag, str(value)]
        env = dict(os.environ, HYPOTHESIS_PROFILE="deep" if deep else os.environ.get("HYPOTHESIS_PROFILE", "ci"))
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if coverage_dir:
            env["SPECGATE_COVERAGE"] = "1"
        out = subprocess.DEVNULL if quiet else sys.stderr
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=out)
        raw = json.loads(raw_path.read_text()) if raw_path.exists() else {"gates": [], "environment": {}}
        reach_result = _reach(data_file, gates, Path(coverage_dir)) if coverage_dir and data_file.exists() else None
    found = {g["name"]: g for g in raw["gates"]}
    proven_against = proven_against or {}
    results = [_with_proof(found.get(g.name) or _not_run(g, proc.returncode), proven_against.get(g.name, ()))
               for g in gates]
    if reach_result is not None:
        for r in results:
            r["coverage"] = reach_result["gates"].get(r["name"])
    result = {"schema": "specgate-gates/1", "command": " ".join(cmd), "started": started,
              "seconds": round(time.perf_counter() - t0, 2), "environment": raw["environment"],
              "pytest_exit_status": proc.returncode, "summary": report.summary(results),
              "exit_status": report.exit_status(results), "gates": results}
    if reach_result is not None:
        result["reach"] = {k: v for k, v in reach_result.items() if k != "gates"}
        if reach_result["judged"] and (reach_result["unreviewed"] or reach_result["stale"]):
            result["exit_status"] = 1
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str))
    if junit_path:
        tree = report.junit(result)
        tree.write(junit_path, encoding="utf-8", xml_declaration=True)
    return result


def _with_proof(result: dict, proven_against: tuple[str, ...]) -> dict:
    """The gate's result with the defects it is proven against, after its needs (the report's order)."""
    out = {}
    for key, value in result.items():
        out[key] = value
        if key == "needs":
            out["proven_against"] = list(proven_against)
    return out


def _not_run(gate: Gate, returncode: int) -> dict:
    """A gate the pytest process never reported on (it crashed, or was interrupted): an error."""
    return {"name": gate.name, "purpose": gate.purpose, "needs": gate.needs, "module": str(gate.file), "status": report.ERROR,
            "reason": f"no result: pytest exited with status {returncode} before reporting this gate",
            "num_cases": 0, "cases": [], "evidence": [], "measurements": [], "claims": {}, "tests": [],
            "seconds": 0.0}


def _reach(data_file: Path, gates: list[Gate], html_dir: Path) -> dict:
    """Per-gate figures, the HTML report, and, when every gate that can run here ran (a subset
    leaves branches unreached that another gate takes), the unreached request-path branches
    judged against the reviewed list."""
    from gates import reach
    from gates.registry import GATES, has_cuda
    runnable = {g.name for g in GATES if g.needs == "cpu" or has_cuda()}
    judged = runnable <= {g.name for g in gates}
    reach.html_report(data_file, REPO, html_dir)
    out = {"gates": reach.gate_figures(data_file, REPO), "html": str(html_dir), "judged": judged,
           "unreached": [], "unreviewed": [], "stale": []}
    if judged:
        unreached = reach.unreached_branches(data_file, REPO)
        unreviewed, stale = reach.judge(unreached, reach.load_reviewed())
        out |= {"unreached": [str(b) for b in unreached], "unreviewed": [str(b) for b in unreviewed],
                "stale": stale}
    return out
