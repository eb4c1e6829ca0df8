"""Running mutmut: which functions a run mutates (those changed since a revision, or all), and
`mutmut run` in the staging folder with its progress line turned into a progress bar.

mutmut forks one child per mutant. A child forked after torch used its intra-op thread pool
deadlocks, and the hang would read as a timeout, which mutmut's own score counts as a kill. So
the run uses one torch thread, and a timeout, segfault or suspicious result is a failure of the
run, never a kill (mutants/mutation/report.py).
"""
import ast
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from mutants.child_env import child_env
from mutants.mutation.stage import REPO, SOURCES, STAGING, is_mutated

STATUS_LINE = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)")


def changed_functions(since: str, repo: Path = REPO) -> list[str]:
    """mutmut name patterns for the engine functions and methods changed since `since`
    (committed or not), so a pull request's run mutates only what it touched."""
    diff = git(["diff", "--unified=0", since, "--", *SOURCES], repo)
    changed: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = None if line == "+++ /dev/null" else line[len("+++ b/"):]
        elif line.startswith("@@") and path and is_mutated(path):
            start, _, count = re.match(r"@@ -\S+ \+(\d+)(,(\d+))? @@", line).groups()
            start, count = int(start), int(count if count is not None else 1)
            # a pure deletion (count 0) touches the lines on either side of it
            changed.setdefault(path, set()).update(range(start, start + count) if count else (start, start + 1))
    patterns = []
    for path, lines in sorted(changed.items()):
        module = path[:-3].replace("/", ".")
        for name, first, last in function_spans((repo / path).read_text()):
            if lines & set(range(first, last + 1)):
                patterns.append(f"{module}.{name}__mutmut_*")
    return patterns


def function_spans(source: str) -> list[tuple[str, int, int]]:
    """(mutmut's mangled name, first line, last line) of every top-level function and method of
    a top-level class: the units mutmut mutates."""
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    units = []
    for node in ast.parse(source).body:
        if isinstance(node, functions):
            units.append((f"x_{node.name}", node))
        elif isinstance(node, ast.ClassDef):
            units += [(f"xǁ{node.name}ǁ{m.name}", m) for m in node.body if isinstance(m, functions)]
    spans = []
    for name, fn in units:
        first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
        spans.append((name, first, fn.end_lineno))
    return spans


def git(args: list[str], repo: Path) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        raise ValueError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


LINE_EVERY = 100


def run_mutmut(patterns: list[str], max_children: int, log_path: Path, staging: Path = STAGING,
               env: dict[str, str] | None = None, time_limit: float | None = None) -> tuple[int, bool]:
    """`mutmut run` in the staging folder, its progress line turned into a progress bar; the full
    output goes to log_path. `patterns`: mutmut names or patterns (each named mutant is re-tested).
    Returns (mutmut's exit status, whether `time_limit` seconds stopped it): mutmut saves each
    verdict as it comes, so a stopped run keeps the verdicts it reached and the next run resumes."""
    from tqdm import tqdm
    drop_unfinished_mutant_files(staging)
    env = mutmut_env(env)
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *patterns]
    terminal = sys.stderr.isatty()
    bar = tqdm(desc="mutants", unit="mutant", mininterval=0.5, dynamic_ncols=True, file=sys.stderr,
               disable=not terminal)
    next_line = LINE_EVERY  # not on a terminal: one line per LINE_EVERY mutants instead of the bar
    with open(log_path, "w", buffering=1) as log, subprocess.Popen(cmd, cwd=staging, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, start_new_session=True) as proc:
        stopped = threading.Event()
        timer = threading.Timer(time_limit, _stop, (proc, stopped)) if time_limit is not None else None
        if timer:
            timer.start()
        first_done = None
        for chunk in _chunks(proc.stdout):
            log.write(chunk + "\n")
            m = STATUS_LINE.search(chunk)
            if not m:
                continue
            done, total, killed, no_tests, timeout, suspicious, survived = map(int, m.groups())
            first_done = done if first_done is None else first_done
            if not patterns:
                bar.total = total - first_done
            bar.update(done - first_done - bar.n)
            bar.set_postfix(killed=killed, survived=survived, timeout=timeout, suspicious=suspicious,
                            refresh=False)
            if not terminal and next_line is not None and (done - first_done >= next_line or done == total):
                print(f"mutate: {done}/{total} mutants checked: {killed} killed, {survived} survived, "
                      f"{no_tests} no tests, {timeout} timeout, {suspicious} suspicious", file=sys.stderr, flush=True)
                next_line = None if done == total else done - first_done + LINE_EVERY
        bar.close()
        rc = proc.wait()
        if timer:
            timer.cancel()
        return rc, stopped.is_set()


def drop_unfinished_mutant_files(staging: Path) -> list[Path]:
    """mutmut writes a source file's mutants, then its .meta, and takes a mutant file newer than its
    source as done: a run stopped (or a machine lost) between the two leaves a truncated file that
    it never writes again, and every later run fails to import it. Each working-copy file of a
    mutated source whose .meta is missing or older is removed, so mutmut writes it again (it merges
    the verdicts of an older .meta back by function hash). Returns the files removed."""
    dropped = []
    working_copy = staging / "mutants"
    for source in SOURCES:
        for path in (working_copy / source).rglob("*.py"):
            if not is_mutated(path.relative_to(working_copy).as_posix()):
                continue  # a file mutmut only copies, which it copies again every run
            meta = path.with_name(path.name + ".meta")
            if not meta.exists() or meta.stat().st_mtime_ns < path.stat().st_mtime_ns:
                path.unlink()
                dropped.append(path)
    return dropped


def _stop(proc: subprocess.Popen, stopped: threading.Event) -> None:
    """The time limit: end mutmut and the children it forked (its own process group), unless it
    has just finished on its own (then the run is complete, not stopped)."""
    if proc.poll() is not None:
        return
    stopped.set()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def mutmut_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A mutmut run's environment: one torch thread (see above), the mutation Hypothesis profile."""
    return child_env(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYPOTHESIS_PROFILE="mutation", PYTHONHASHSEED="0",
                     **(extra or {}))


# A CUDA run's environment: torch.cuda.is_available() (run as the test modules are imported, in
# mutmut's fork server, which forks each mutant's child) asks NVML rather than start the CUDA
# driver, which no forked child could then use (mutants/mutation/plugin.py checks each child).
CUDA_RUN_ENV = {"SPECGATE_DEVICE": "cuda", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def _chunks(stream):
    """mutmut redraws its status line with carriage returns: split on those and on newlines."""
    buffer = b""
    for data in iter(lambda: stream.read1(4096), b""):
        buffer += data
        *parts, buffer = re.split(rb"[\r\n]", buffer)
        yield from (p.decode(errors="replace") for p in parts if p.strip())
    if buffer.strip():
        yield buffer.decode(errors="replace")
