"""`specgate prove [DEFECT ...] [--json FILE] [--markdown FILE] [--full] [--jobs N]`
(also `python -m mutants.prove`): every gate shown red on a planted defect, and green on the
clean tree.

One pass:

    snapshot the tree -> check every patch applies -> per tree (clean, each defect), in parallel:
    copy the snapshot, plant the defect, run the gates there -> matrix -> verdict

Each defect's copy runs the gates it names, plus lossless when the defect claims to leave every
token unchanged (so that claim is checked, not assumed); --full runs every gate there. The clean
copy runs every gate. Gates run as `python -m gates.cli gates run NAMES --json FILE` inside the copy, under the
Hypothesis 'ci' profile. Everything is written under one temporary folder, removed at the end
even when interrupted; the working tree is only read.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from mutants import matrix
from mutants.apply import StalePatch, apply_patch, copy_tree, patched_files
from mutants.catalogue import Defect, by_name
from mutants.matrix import CLEAN, FAILED_TO_RUN, NEEDS_CUDA, RAN, STALE, TIMEOUT, TreeRun

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "gates", "mutants", "fixtures")
DROPPED_ENV = ("VT_ASYNC_RUNNER", "SPECGATE_MODEL", "SPECGATE_DRAFTER", "SPECGATE_DEVICE", "PYTHONPATH")
DEFAULT_TIMEOUT_S = 900


def gate_command(names: list[str], json_path: Path, device: str) -> list[str]:
    cmd = [sys.executable, "-m", "gates.cli", "gates", "run", *names, "--json", str(json_path)]
    return cmd + (["--device", device] if device != "cpu" else [])


class Prover:
    """Runs trees in parallel; kills what it started (by process group) when stopped."""

    def __init__(self, jobs: int, timeout_s: float, command=gate_command):
        self.jobs, self.timeout_s, self.command = jobs, timeout_s, command
        self._procs: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def run_tree(self, base: Path, work: Path, label: str, defect: Defect | None, names: list[str],
                 device: str) -> TreeRun:
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
            status = self._gates(tree, self.command(names, json_path, device), log_path, work)
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
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        # TMPDIR: whatever the gate run leaves behind when it is ended goes with our folder.
        env.update(PYTHONPATH=str(tree), HYPOTHESIS_PROFILE="ci", PYTHONUNBUFFERED="1", TMPDIR=str(work))
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
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env["PYTHONPATH"] = str(tree)
    code = ("import importlib.util, json, sys; "
            f"print(json.dumps([getattr(importlib.util.find_spec(p), 'origin', None) for p in {PACKAGES!r}]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        return [out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "could not check"]
    root = tree.resolve()
    return [o for o in json.loads(out.stdout) if o and not Path(o).resolve().is_relative_to(root)]


def gates_for(defect: Defect, all_gates: list[str], full: bool) -> list[str]:
    """The gates a defect's copy runs, in registry order: those it names, and lossless when it
    claims every token unchanged; every gate with --full."""
    if full:
        return list(all_gates)
    return [g for g in all_gates if g in defect.gates or (g == "lossless" and defect.token_invisible)]


def read_gate_results(json_path: Path) -> dict[str, dict]:
    if not json_path.is_file():
        return {}
    raw = json.loads(json_path.read_text())
    return {g["name"]: {"status": g["status"], "reason": g.get("reason", ""), "seconds": g.get("seconds", 0.0)}
            for g in raw.get("gates", [])}


def log_tail(path: Path, lines: int = 30) -> str:
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stale_check(defects: list[Defect], base: Path) -> dict[str, str]:
    """defect name -> why it no longer applies to the snapshot, for each stale defect."""
    def read(rel):
        path = base / rel
        return path.read_text() if path.is_file() else None
    stale = {}
    for d in defects:
        try:
            if not d.patch.is_file():
                raise StalePatch(f"no patch file {d.patch.relative_to(REPO)}")
            patched_files(d.patch.read_text(), read)
        except (StalePatch, ValueError) as e:
            stale[d.name] = str(e)
    return stale


def has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def prove(defects: list[Defect], jobs: int = 2, full: bool = False, device: str = "cpu",
          timeout_s: float = DEFAULT_TIMEOUT_S, progress: bool = True, repo: Path = REPO,
          cuda: bool | None = None, command=gate_command, complete: bool = True,
          gate_needs: dict[str, str] | None = None):
    """Run the proof; returns (verdict, runs by defect name, clean run, gate needs, has_cuda, wall s).
    `gate_needs` (gate -> 'cpu'/'cuda', registry order) defaults to the registry's."""
    if gate_needs is None:
        from gates.registry import GATES
        gate_needs = {g.name: g.needs for g in GATES}
    cuda = has_cuda() if cuda is None else cuda
    all_gates = list(gate_needs)
    t0 = time.perf_counter()
    prover = Prover(jobs, timeout_s, command)
    runs: dict[str, TreeRun] = {}
    clean = None
    with tempfile.TemporaryDirectory(prefix="specgate-prove-") as tmp:
        work = Path(tmp)
        base = copy_tree(repo, work / "snapshot")
        stale = stale_check(defects, base)
        tasks = [(CLEAN, None, all_gates, device)]
        for d in defects:
            if d.name in stale:
                runs[d.name] = TreeRun(d.name, STALE, detail=stale[d.name])
            elif d.needs == "cuda" and not cuda:
                runs[d.name] = TreeRun(d.name, NEEDS_CUDA, detail="needs CUDA; this machine has none")
            else:
                tasks.append((d.name, d, gates_for(d, all_gates, full), "cuda" if d.needs == "cuda" else device))
        tasks.sort(key=lambda t: t[0] != CLEAN)  # the longest first: the clean tree runs every gate
        bar = _progress(len(tasks), progress)
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        try:
            futures = {pool.submit(prover.run_tree, base, work, *task): task[0] for task in tasks}
            for future in as_completed(futures):
                run = future.result()
                if run.tree == CLEAN:
                    clean = run
                else:
                    runs[run.tree] = run
                if bar is not None:
                    bar.set_postfix_str(f"{run.tree}: {_summary(run)}")
                    bar.update(1)
        except BaseException:
            prover.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
            if bar is not None:
                bar.close()
    v = matrix.verdict(defects, runs, clean, gate_needs, cuda, complete)
    return v, runs, clean, gate_needs, cuda, time.perf_counter() - t0


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="tree", desc="prove", disable=not (enabled and sys.stderr.isatty()))


def _summary(run: TreeRun) -> str:
    if run.status != RAN:
        return run.status
    reds = [g for g, r in run.gates.items() if r["status"] == matrix.RED]
    return f"red: {', '.join(reds) or 'none'}"


# ---- command line ---------------------------------------------------------------------------------
def add_prove_parser(subparsers) -> None:
    p = subparsers.add_parser("prove", help="plant each seeded defect in a copy of the tree and show "
                              "the gates it names go red, and every gate green on the clean tree")
    p.add_argument("defects", nargs="*", metavar="DEFECT", help="defects to plant (default: all)")
    p.add_argument("--json", default=None, metavar="FILE", help="write the matrix and verdict as JSON")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write the matrix as Markdown")
    p.add_argument("--full", action="store_true", help="run every gate on every defect, not only the "
                   "ones it names plus lossless")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="trees proven in parallel (default 2)")
    p.add_argument("--device", default="cpu", help="device the CPU gates run the engine on (default cpu); "
                   "defects that need CUDA always run on cuda")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds one tree's gate run may take; a timeout fails (default {DEFAULT_TIMEOUT_S})")
    p.set_defaults(func=cmd_prove)


def cmd_prove(args) -> int:
    try:
        defects = by_name(args.defects)
    except KeyError as e:
        print(f"specgate: error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("specgate: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        with ending_on_signals():
            v, runs, clean, gate_needs, cuda, wall = prove(defects, args.jobs, args.full, args.device,
                                                           args.timeout, complete=not args.defects)
    except KeyboardInterrupt:
        print("specgate: prove interrupted; its gate runs were ended and its temporary folder removed",
              file=sys.stderr)
        return 130
    flags = "".join(f" {f}" for f in (" ".join(args.defects), "--full" if args.full else "") if f)
    meta = {"args": flags, "wall_s": round(wall, 1), "jobs": args.jobs, "full": args.full,
            "device": args.device, "complete": not args.defects}
    print(matrix.text_table(defects, runs, clean, gate_needs, cuda, v))
    print("\n" + matrix.LEGEND)
    for title, items in (("problems", v.problems), ("notes", v.notes)):
        if items:
            print(f"\n{title}:\n" + "\n".join(f"  - {p}" for p in items))
    print("\ngate time over all trees: " + ", ".join(
        f"{g} {t['seconds']:.0f} s in {t['runs']} runs" for g, t in matrix.gate_seconds(runs, clean).items()))
    print(f"\nprove: {'PASS' if v.exit_status == 0 else 'FAIL'} ({len(v.problems)} problems) in {wall:.0f} s "
          f"with {args.jobs} jobs")
    if args.json:
        Path(args.json).write_text(json.dumps(matrix.report(defects, runs, clean, gate_needs, cuda, v, meta),
                                              indent=2))
    if args.markdown:
        Path(args.markdown).write_text(matrix.markdown(defects, runs, clean, gate_needs, cuda, v, meta))
    return v.exit_status


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="specgate")
    sub = ap.add_subparsers(dest="command", required=True)
    add_prove_parser(sub)
    args = ap.parse_args(["prove", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
