"""One tree of a proof: copy the snapshot, plant a defect, run the gates there in a child process
(a session of its own, ended with its whole group on a timeout or an interrupt), read what they
reported. mutants/proof/prove.py runs the trees in parallel and judges them.

Gates run as `python -m gates.cli gates run NAMES --json FILE` inside the copy, under the
Hypothesis 'ci' profile, with the copy first on PYTHONPATH and checked to be what imports.
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from gates.report import GateReport, GateResult
from mutants.child_env import child_env
from mutants.proof.apply import StalePatch, apply_patch
from mutants.proof.catalogue import Defect
from mutants.proof.matrix import FAILED_TO_RUN, RAN, STALE, TIMEOUT, TreeRun

PACKAGES = ("engine", "gates", "mutants", "fixtures")


def gate_command(names: list[str], json_path: Path, device: str, stop_at_red: bool = False,
                 forwards: tuple[str, ...] = ()) -> list[str]:
    # One pytest process a tree: prove already runs its trees in parallel (--jobs). A defect's
    # tree stops each gate at its first failed check: red is all the proof reads from it.
    # `forwards`: the forwards the gates judge when not their default (a compiled-forward defect).
    cmd = [sys.executable, "-m", "gates.cli", "gates", "run", *names, "--json", str(json_path), "--jobs", "1"]
    return (cmd + (["--device", device] if device != "cpu" else []) + (["--stop-at-red"] if stop_at_red else [])
            + (["--forwards", ",".join(forwards)] if forwards else []))


class Prover:
    """Runs trees in parallel; kills what it started (by process group) when stopped."""

    def __init__(self, jobs: int, timeout_s: float, command=gate_command):
        self.jobs, self.timeout_s, self.command = jobs, timeout_s, command
        self._procs: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def run_tree(self, base: Path, work: Path, label: str, defect: Defect | None, names: list[str],
                 device: str, forwards: tuple[str, ...] = ()) -> TreeRun:
        if self._stopping.is_set():
            return TreeRun(label, FAILED_TO_RUN, detail="interrupted")
        t0 = time.perf_counter()
        slug = label.replace(" ", "-")
        tree, json_path, log_path = work / slug, work / f"{slug}.json", work / f"{slug}.log"
        try:
            shutil.copytree(base, tree, symlinks=True)
            if defect is not None:
                apply_patch(defect.patch.read_text(), tree)
            elsewhere = imports_elsewhere(tree)
            if elsewhere:
                return TreeRun(label, FAILED_TO_RUN, detail=f"imports resolve outside the copy: {elsewhere}")
            status = self._gates(tree, self.command(names, json_path, device, defect is not None, forwards),
                                 log_path, work)
            gates = read_gate_results(json_path) if status == RAN else {}
            detail = ""
            if status != RAN or not gates:
                status = status if status != RAN else FAILED_TO_RUN
                detail = log_tail(log_path)
            return TreeRun(label, status, gates, round(time.perf_counter() - t0, 1), detail)
        except StalePatch as e:
            return TreeRun(label, STALE, detail=str(e))
        finally:
            shutil.rmtree(tree, ignore_errors=True)

    def _gates(self, tree: Path, cmd: list[str], log_path: Path, work: Path) -> str:
        # TMPDIR: whatever the gate run leaves behind when it is ended goes with our folder.
        env = child_env(PYTHONPATH=str(tree), HYPOTHESIS_PROFILE="ci", PYTHONUNBUFFERED="1", TMPDIR=str(work))
        env.setdefault("OMP_NUM_THREADS", "1")
        with open(log_path, "wb") as log:
            # A session of its own: a terminal's Ctrl-C reaches prove, which ends the group itself.
            proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            with self._lock:
                self._procs[proc.pid] = proc
            try:
                proc.wait(timeout=self.timeout_s)
                return RAN
            except subprocess.TimeoutExpired:
                self._end(proc)
                return TIMEOUT
            finally:
                with self._lock:
                    self._procs.pop(proc.pid, None)

    @staticmethod
    def _end(proc: subprocess.Popen) -> None:
        """End the process group this prover started for one gate run (its pytest child included):
        SIGTERM, a few seconds' grace, then SIGKILL for whatever of the group is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            self._end(proc)


def imports_elsewhere(tree: Path) -> list[str]:
    """The project's packages must import from the copy, not from an editable install of the
    working tree: checked without importing them."""
    env = child_env(PYTHONPATH=str(tree))
    code = ("import importlib.util, json, sys; "
            f"print(json.dumps([getattr(importlib.util.find_spec(p), 'origin', None) for p in {PACKAGES!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        return [out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "could not check"]
    root = tree.resolve()
    return [o for o in json.loads(out.stdout) if o and not Path(o).resolve().is_relative_to(root)]


def read_gate_results(json_path: Path) -> dict[str, GateResult]:
    if not json_path.is_file():
        return {}
    report = GateReport.from_json(json.loads(json_path.read_text()))
    # The first pieces of evidence go along, for the proof's HTML page to link each cell to.
    return {g.name: replace(g, evidence=g.evidence[:3]) for g in report.gates}


def log_tail(path: Path, lines: int = 30) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def ending_on_signals():
    """SIGTERM and SIGHUP end prove like Ctrl-C does: the gate runs it started are ended and its
    temporary folder removed (the default action would leave both behind)."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
