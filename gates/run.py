"""Run gates: pytest processes over the selected gate modules with the gates plugin (one, or with
--jobs N several at once, each gate whole in one of them), then the merged report (JSON, JUnit, a
table) and an exit status that is non-zero when any gate is red or errored.

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from gates import hostload, report, timings
from gates.registry import Gate

REPO = Path(__file__).resolve().parent.parent


@dataclass
class _Process:
    """One pytest process over some of the gates: what it ran and what it reported."""
    gates: list[Gate]
    cmd: list[str]
    returncode: int = 0
    raw: report.GateReport | None = None
    log: str = ""


def plan(gates: list[Gate], jobs: int, known: Mapping[str, float] | None = None,
         device: str | None = None) -> list[list[list[Gate]]]:
    """Phases of pytest processes: each phase's processes run at once, the phases one after the
    other. One job: one process over every gate, in the order given. More: the untimed gates
    spread over at most `jobs` processes, balanced by their last measured seconds (slowest first);
    then, on CUDA, the timed gates (speed-ab, busy) in one process of their own, with nothing
    beside them, started once the host is quiet (run_gates, gates/hostload.py). On the CPU
    (`device` None or cpu) speed decides nothing (speed-ab is a smoke run there, busy needs CUDA),
    so the timed gates are balanced with the rest."""
    if jobs <= 1 or len(gates) <= 1:
        return [[list(gates)]]
    known = timings.load() if known is None else known
    order = {g.name: i for i, g in enumerate(gates)}
    alone = on_cuda(device)
    untimed = [g for g in gates if not (g.timed and alone)]
    groups = timings.balance(((g, timings.estimate(g.name, known)) for g in untimed), jobs)
    phases = [[sorted(group, key=lambda g: order[g.name]) for group in groups]] if untimed else []
    timed = [g for g in gates if g.timed and alone]
    return phases + ([[timed]] if timed else [])


def on_cuda(device: str | None) -> bool:
    """Speed decides only on CUDA: there the timed gates run alone, on a quiet host."""
    return str(device or "cpu").startswith("cuda")


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` with this repository first on PYTHONPATH and the caller's entries after it (packages
    installed with `pip install --target`, as mutmut is on the GPU machine)."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))}


def run_gates(gates: list[Gate], json_path: str | None = None, junit_path: str | None = None,
              deep: bool = False, model: str | None = None, drafter: str | None = None,
              device: str | None = None, pytest_args: tuple[str, ...] = (), quiet: bool = False,
              proven_against: Mapping[str, tuple[str, ...]] | None = None, jobs: int = 1,
              coverage_dir: str | None = None) -> report.GateReport:
    """Run the gates in pytest processes (one, or with `jobs` > 1 several at once: see plan());
    `proven_against` (gate -> defect names, from the defect catalogue a layer above) goes into each
    gate's result. Every gate is judged in one process, so the report is the same whatever `jobs`.
    With `coverage_dir`, one process under coverage.py: each gate's reach goes into its result, the
    HTML report into coverage_dir, and the unreached request-path branches into the report's
    "reach" (gates/reach.py)."""
    if coverage_dir:
        jobs = 1  # one process: coverage's per-gate contexts land in one data file
    started, t0 = time.time(), time.perf_counter()
    phases = plan(gates, jobs, device=device)
    env = dict(os.environ, HYPOTHESIS_PROFILE="deep" if deep else os.environ.get("HYPOTHESIS_PROFILE", "ci"))
    env.setdefault("OMP_NUM_THREADS", "1")
    env = with_repo_on_path(env)
    parallel = any(len(phase) > 1 for phase in phases) or len(phases) > 1
    processes: list[_Process] = []
    host_wait: hostload.QuietWait | None = None
    with tempfile.TemporaryDirectory(prefix="specgate-gates-") as tmp:
        data_file = Path(tmp) / ".coverage"
        measure = (["-m", "coverage", "run", "--branch", f"--source={REPO / 'engine'}", f"--data-file={data_file}"]
                   if coverage_dir else [])
        if coverage_dir:
            env["SPECGATE_COVERAGE"] = "1"
        for p, phase in enumerate(phases):
            if parallel and not quiet:
                print("gates: " + " | ".join(", ".join(g.name for g in group) for group in phase)
                      + (" (at once)" if len(phase) > 1 else " (alone)"), file=sys.stderr, flush=True)
            if on_cuda(device) and all(g.timed for group in phase for g in group):
                host_wait = hostload.wait_for_quiet_host()
                if not quiet:
                    print("gates: " + host_wait.line(), file=sys.stderr, flush=True)
            batch = [_Process(group, _command(group, Path(tmp) / f"{p}-{i}", model, drafter, device, pytest_args,
                                              measure)) for i, group in enumerate(phase)]
            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                list(pool.map(lambda proc: _run(proc, env, quiet, capture=parallel), batch))
            processes += batch
        reach_result = _reach(data_file, gates, Path(coverage_dir)) if coverage_dir and data_file.exists() else None
    found = {g.name: g for proc in processes if proc.raw for g in proc.raw.gates}
    returncode = {g.name: proc.returncode for proc in processes for g in proc.gates}
    proven_against = proven_against or {}
    results = [found.get(g.name) or _not_run(g, returncode[g.name]) for g in gates]
    for r in results:
        r.proven_against = list(proven_against.get(r.name, ()))
        if reach_result is not None:
            r.coverage = reach_result["gates"].get(r.name)
    environment = dict(next((proc.raw.environment for proc in processes if proc.raw), {}))
    if host_wait is not None:
        environment["host_before_timed"] = asdict(host_wait)
    result = report.GateReport(
        results, environment=environment,
        command=" ; ".join(" ".join(proc.cmd) for proc in processes), started=started,
        seconds=round(time.perf_counter() - t0, 2), jobs=max(1, jobs),
        pytest_exit_status=next((proc.returncode for proc in processes if proc.returncode), 0),
        reach={k: v for k, v in reach_result.items() if k != "gates"} if reach_result is not None else None)
    # the registry's own gates only: a harness test's fake gates must not land in the cache
    timings.record({g.name: r.seconds for g, r in zip(gates, results)
                    if g.path is None and r.status in (report.GREEN, report.RED)})
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=2, default=str))
    if junit_path:
        tree = report.junit(result)
        tree.write(junit_path, encoding="utf-8", xml_declaration=True)
    return result


def _command(gates: list[Gate], stem: Path, model, drafter, device, pytest_args, measure=()) -> list[str]:
    """One pytest process over `gates`; `measure`: the coverage.py prefix, when it runs under it."""
    raw_path, spec_path = stem.with_suffix(".report.json"), stem.with_suffix(".gates.json")
    spec_path.write_text(json.dumps([{**asdict(g), "path": str(g.file)} for g in gates]))
    cmd = [sys.executable, *measure, "-m", "pytest", "-p", "gates.plugin", f"--rootdir={REPO}",
           "-c", str(REPO / "pyproject.toml"), "--gates-report", str(raw_path),
           "--gates-spec", str(spec_path), "--gates-no-table", *(str(g.file) for g in gates), *pytest_args]
    for flag, value in (("--model", model), ("--drafter", drafter), ("--device", device)):
        if value:
            cmd += [flag, str(value)]
    return cmd


def _run(proc: _Process, env: dict, quiet: bool, capture: bool) -> None:
    """Run one pytest process. Several at once write to a log each, shown whole when it ends."""
    raw_path = Path(proc.cmd[proc.cmd.index("--gates-report") + 1])
    if capture:
        done = subprocess.run(proc.cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace")
        proc.log = done.stdout
        if not quiet:
            names = ", ".join(g.name for g in proc.gates)
            sys.stderr.write(f"---- gates {names} (exit status {done.returncode})\n{done.stdout}")
            sys.stderr.flush()
    else:
        out = subprocess.DEVNULL if quiet else sys.stderr
        done = subprocess.run(proc.cmd, cwd=REPO, env=env, stdout=out, stderr=out)
    proc.returncode = done.returncode
    proc.raw = report.GateReport.from_json(json.loads(raw_path.read_text())) if raw_path.exists() else None


def _not_run(gate: Gate, returncode: int) -> report.GateResult:
    """A gate the pytest process never reported on (it crashed, or was interrupted): an error."""
    return report.GateResult(gate.name, gate.purpose, gate.needs, module=str(gate.file), status=report.ERROR,
                             reason=f"no result: pytest exited with status {returncode} before reporting this gate")


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
