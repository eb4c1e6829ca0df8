"""`specgate mutate [--since REV | --only PATTERN ...] [--max-children N] [--report DIR] [--update-baseline]`
(also `make mutate`): mutmut over engine/, with the fast tests and gates as the suite.

One pass:

    stage the suite in build/mutmut/ -> mutmut run there (mutants of the functions changed since
    REV, or all) -> read mutmut's results -> reviewed equivalents -> reports -> ratchet -> score

mutmut writes its working copy into a folder named `mutants/` wherever it runs, and ours holds
the seeded defects, so it runs in a git-ignored staging folder holding only what the suite needs.
Its cache lives there too: a rerun retests only mutants of functions that changed.

mutmut forks one child per mutant. A child forked after torch used its intra-op thread pool
deadlocks, and the hang would read as a timeout, which mutmut's own score counts as a kill. So
the run uses one torch thread, and a timeout, segfault or suspicious result is a failure of the
run, never a kill.
"""
import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from datetime import datetime, timezone
from pathlib import Path

from mutants.mutation_report import RUN_FAILURES, MutantRecord, score_line, summarise, write_reports

REPO = Path(__file__).resolve().parent.parent
STAGING = REPO / "build" / "mutmut"
BASELINE = REPO / "mutants" / "mutation-baseline.json"
EQUIVALENTS = REPO / "mutants" / "equivalent-mutants.toml"
SOURCE = "engine"

# What the mutation suite needs, copied into the staging folder. The test modules of our own
# mutants/ package are left out: in mutmut's working copy `mutants` is mutmut's folder.
STAGED = ("engine", "gates", "fixtures", "tests", "conftest.py")
UNSTAGED_TESTS = ("test_prove.py", "test_mutate.py", "test_mutation_report.py")
PLUGIN = Path(__file__).with_name("mutation_plugin.py")
# The suite: the tests, and the gates that judge one run exactly (speed-ab, busy and no-sync
# measure time or need CUDA), under the Hypothesis `mutation` profile (2 examples a test). A
# surviving mutant runs every test that covers its function, so the slow ones stay out: `slow`
# tests (whole gate sessions in subprocesses), the end-to-end statistical and bench checks
# (tests/test_verify.py's chi-square tests judge the sampler in a fraction of the time), and tests
# a gate repeats.
SUITE = ("tests", "gates/lossless.py", "gates/combine.py", "gates/emit_count.py", "gates/reason_a.py",
         "gates/predicate_split.py")
DESELECTED = ("gates/lossless.py::test_sampled_runs_emit_the_target_distribution",
              "gates/lossless.py::test_negative_control_lossy_engine_fails_the_distribution_test",
              "gates/predicate_split.py::test_mixed_batches_async_equals_sync",
              "tests/test_spec_decode.py::test_greedy_spec_equals_plain_under_preemption")
PYTEST_ARGS = ("-p", "gates.plugin", "--gates-per-test", "-p", "mutation_plugin", "-m", "not slow",
               *(a for test in DESELECTED for a in ("--deselect", test)))
# mutmut ends a mutant's run after (the covering tests' time + constant) x multiplier seconds of
# wall time (twice that of CPU time). A tight limit reads a busy machine as a hang; a loose one
# lets a real hang hold a core. The engine raises on a stalled scheduler, so hangs are rare.
TIMEOUT_MULTIPLIER, TIMEOUT_CONSTANT = 8.0, 30.0
KILLED_EXIT_CODES = (1, 3)  # pytest's exit status for failed tests, and for an internal error
STATUS_LINE = re.compile(r"(\d+)/(\d+)\s+🎉 (\d+) 🫥 (\d+)\s+⏰ (\d+)\s+🤔 (\d+)\s+🙁 (\d+)")


@dataclass(frozen=True)
class Equivalent:
    name: str
    mutated: str  # the mutant's changed line: an entry goes stale when mutmut renumbers
    reason: str


def stage(staging: Path = STAGING) -> int:
    """Copy the suite into `staging`, keeping mutmut's cache (staging/mutants/*.meta, stats).
    mutmut retests a mutant when its function changes, not when the suite does; so when the
    suite changed, every cached verdict but a kill is reset (a stronger suite cannot revive a
    killed mutant; a fresh clone, as in CI, has no cache at all). Returns how many were reset."""
    staging.mkdir(parents=True, exist_ok=True)
    fingerprint, stamp = suite_fingerprint(), staging / "suite.sha256"
    reset = 0
    if stamp.exists() and stamp.read_text() != fingerprint:
        reset = reset_verdicts(staging, keep=KILLED_EXIT_CODES)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", *UNSTAGED_TESTS)
    for name in STAGED:
        for root in (staging, staging / "mutants"):
            target = root / name
            if target.is_dir() and not (root.name == "mutants" and name == SOURCE):
                shutil.rmtree(target)  # a removed test must not linger in either copy
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, staging / name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(src, staging / name)
    shutil.copy2(PLUGIN, staging / PLUGIN.name)
    (staging / "pyproject.toml").write_text(staging_config())
    stamp.write_text(fingerprint)
    return reset


def suite_fingerprint() -> str:
    """A hash of everything staged but the code under mutation: tests, gates, fixtures, config."""
    h = hashlib.sha256(staging_config().encode() + PLUGIN.read_bytes())
    for name in STAGED:
        if name == SOURCE:
            continue
        src = REPO / name
        files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if src.is_dir() else [src]
        for f in files:
            if f.name not in UNSTAGED_TESTS:
                h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def reset_verdicts(staging: Path, keep: tuple[int, ...]) -> int:
    """Forget mutmut's cached verdicts (exit codes) except those in `keep`."""
    reset = 0
    for meta_path in (staging / "mutants" / SOURCE).rglob("*.meta"):
        meta = json.loads(meta_path.read_text())
        codes = meta["exit_code_by_key"]
        for name, code in codes.items():
            if code is not None and code not in keep:
                codes[name] = None
                reset += 1
        meta_path.write_text(json.dumps(meta, indent=4))
    return reset


def staging_config() -> str:
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    also_copy = [n for n in STAGED if n not in (SOURCE, "tests")] + [PLUGIN.name]
    return "\n".join([
        "# Generated by `specgate mutate` (mutants/mutate.py); edits are overwritten.",
        "[tool.pytest.ini_options]",
        'addopts = "-p no:cacheprovider"',
        f"markers = {json.dumps(pytest_ini['markers'])}",
        "",
        "[tool.mutmut]",
        f'source_paths = ["{SOURCE}"]',
        f"also_copy = {json.dumps(also_copy)}",
        f"pytest_add_cli_args = {json.dumps(list(PYTEST_ARGS))}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(SUITE))}",
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
        f"timeout_constant = {TIMEOUT_CONSTANT}",
        "",
    ])


def changed_functions(since: str, repo: Path = REPO) -> list[str]:
    """mutmut name patterns for the engine functions and methods changed since `since`
    (committed or not), so a pull request's run mutates only what it touched."""
    diff = _git(["diff", "--unified=0", since, "--", SOURCE], repo)
    changed: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = None if line == "+++ /dev/null" else line[len("+++ b/"):]
        elif line.startswith("@@") and path and path.endswith(".py"):
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


def _git(args: list[str], repo: Path) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        raise ValueError(f"git {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def run_mutmut(patterns: list[str], max_children: int, log_path: Path, staging: Path = STAGING) -> int:
    """`mutmut run` in the staging folder, its progress line turned into a progress bar; the full
    output goes to log_path."""
    from tqdm import tqdm
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYPOTHESIS_PROFILE="mutation",
               PYTHONHASHSEED="0")
    for name in ("VT_ASYNC_RUNNER", "SPECGATE_MODEL", "SPECGATE_DRAFTER", "SPECGATE_DEVICE", "PYTHONPATH"):
        env.pop(name, None)
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *patterns]
    bar = tqdm(desc="mutants", unit="mutant", mininterval=0.5 if sys.stderr.isatty() else 30,
               dynamic_ncols=True, file=sys.stderr)
    with open(log_path, "w", buffering=1) as log, subprocess.Popen(cmd, cwd=staging, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT) as proc:
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
        bar.close()
        return proc.wait()


def _chunks(stream):
    """mutmut redraws its status line with carriage returns: split on those and on newlines."""
    buffer = b""
    for data in iter(lambda: stream.read1(4096), b""):
        buffer += data
        *parts, buffer = re.split(rb"[\r\n]", buffer)
        yield from (p.decode(errors="replace") for p in parts if p.strip())
    if buffer.strip():
        yield buffer.decode(errors="replace")


def read_results(patterns: list[str], equivalents: dict[str, Equivalent],
                 staging: Path = STAGING) -> list[MutantRecord]:
    """The mutants mutmut knows in the staging folder (only those matching `patterns`, if any)."""
    cwd = os.getcwd()
    os.chdir(staging)  # mutmut reads its config and working copy relative to the folder it ran in
    try:
        from mutmut.mutation.data import SourceFileMutationData
        from mutmut.mutation.diff_apply import get_diff_for_mutant
        from mutmut.stats import status_by_exit_code
        from mutmut.utils.format_utils import mangled_name_from_mutant_name, orig_function_and_class_names_from_key
        stats = json.loads(Path("mutants/mutmut-stats.json").read_text())
        covered = stats["tests_by_mangled_function_name"]
        records = []
        for meta in sorted(Path("mutants", SOURCE).rglob("*.py.meta")):
            path = meta.relative_to("mutants").with_suffix("")
            data = SourceFileMutationData(path=path)
            data.load()
            for name, code in sorted(data.exit_code_by_key.items()):
                if not matches(name, patterns):
                    continue
                function, cls = orig_function_and_class_names_from_key(name)
                diff = get_diff_for_mutant(name, path=path)
                status = status_by_exit_code[code]
                eq = equivalents.get(name)
                reason = eq.reason if eq and status == "survived" and eq.mutated == mutated_line(diff) else None
                records.append(MutantRecord(
                    name=name, path=str(path), function=f"{cls}.{function}" if cls else function,
                    status=status, diff=diff,
                    covered_by=tuple(sorted(covered.get(mangled_name_from_mutant_name(name), ()))),
                    seconds=data.durations_by_key.get(name), equivalent=reason))
        return records
    finally:
        os.chdir(cwd)


def cached_verdicts(patterns: list[str], staging: Path = STAGING) -> dict[str, float | None]:
    """The mutants (matching `patterns`, if any) whose verdict mutmut already holds, with its
    duration: a mutant the run retests gets a new one, so the run's speed counts only those."""
    cached = {}
    for meta_path in (staging / "mutants" / SOURCE).rglob("*.meta"):
        meta = json.loads(meta_path.read_text())
        cached.update({name: meta["durations_by_key"].get(name) for name, code in meta["exit_code_by_key"].items()
                       if code is not None and matches(name, patterns)})
    return cached


def matches(name: str, patterns: list[str]) -> bool:
    """Whether a mutant is in the run: every mutant when there are no patterns."""
    return not patterns or any(fnmatch(name, p) for p in patterns)


def mutated_line(diff: str) -> str:
    """The first line a mutant adds, stripped ('' when it only removes)."""
    return next((l[1:].strip() for l in diff.splitlines() if l.startswith("+") and not l.startswith("+++")), "")


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, Equivalent]:
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("mutant", [])
    bad = [e for e in entries if not (e.get("name") and e.get("mutated") is not None and e.get("reason"))]
    if bad:
        raise ValueError(f"{path.name}: every [[mutant]] needs name, mutated and reason; not {bad[0]}")
    return {e["name"]: Equivalent(e["name"], e["mutated"], e["reason"]) for e in entries}


def stale_equivalents(records: list[MutantRecord], equivalents: dict[str, Equivalent],
                      complete: bool) -> list[str]:
    """Reviewed entries that no longer describe a surviving mutant: it is killed now (so it was
    not equivalent), mutmut renumbered it, or (on a full run) it no longer exists."""
    by_name = {r.name: r for r in records}
    problems = []
    for name, eq in sorted(equivalents.items()):
        r = by_name.get(name)
        if r is None:
            if complete:
                problems.append(f"{name}: listed as equivalent, but no such mutant")
        elif mutated_line(r.diff) != eq.mutated:
            problems.append(f"{name}: listed as equivalent for `{eq.mutated}`, but it now mutates "
                            f"`{mutated_line(r.diff)}`")
        elif r.status != "survived":
            problems.append(f"{name}: listed as equivalent, but it was {r.status}")
    return problems


def load_baseline(path: Path = BASELINE) -> float | None:
    return json.loads(path.read_text())["test_strength"] if path.exists() else None


def baseline_commit(path: Path = BASELINE) -> str:
    """The commit the baseline's full run measured: `--since baseline` retests what changed after it."""
    if not path.exists():
        raise ValueError(f"--since baseline: there is no {path.name} yet; run a full `specgate mutate "
                         f"--update-baseline` first")
    return json.loads(path.read_text())["commit"]


def ratchet(summary: dict, baseline: float | None, complete: bool, stale: list[str]) -> list[str]:
    """Why this run fails, if it does: run failures, a wrong reviewed list, a full run's test
    strength under the baseline, or (on a --since run) a survivor nobody has explained."""
    problems = [f"{summary[s.replace(' ', '_')]} {s}" for s in RUN_FAILURES if summary[s.replace(" ", "_")]]
    problems += stale
    strength = summary["test_strength"]
    if complete and baseline is not None and strength is not None and strength < baseline - 1e-9:
        problems.append(f"test strength {strength:.2%} is under the baseline {baseline:.2%}")
    if not complete and summary["survivors_unexplained"]:
        problems.append(f"{summary['survivors_unexplained']} survivors in the mutated functions are neither "
                        f"killed nor listed in {EQUIVALENTS.name}")
    return problems


def update_baseline(summary: dict, commit: str, path: Path = BASELINE) -> str:
    """Raise the baseline to this full run's test strength; it never goes down."""
    old = load_baseline(path)
    new = summary["test_strength"]
    if old is not None and new < old - 1e-9:
        raise ValueError(f"test strength {new:.2%} is under the baseline {old:.2%}; the baseline only rises")
    path.write_text(json.dumps({"test_strength": round(new, 6), "killed": summary["killed"],
                                "total": summary["total"], "commit": commit,
                                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}, indent=2) + "\n")
    return f"baseline: test strength {new:.2%} (was {'none' if old is None else f'{old:.2%}'})"


def mutate(since: str | None, max_children: int, report_dir: Path, raise_baseline: bool,
           only: tuple[str, ...] = ()) -> int:
    t0 = time.perf_counter()
    equivalents = load_equivalents()
    patterns = list(only) or (changed_functions(since) if since else [])
    commit = _git(["rev-parse", "--short", "HEAD"], REPO).strip()
    report_dir.mkdir(parents=True, exist_ok=True)
    if since and not patterns:
        print(f"mutate: no function in {SOURCE}/ changed since {since}; nothing to mutate")
        print(f"mutation: 0 mutants (no {SOURCE}/ function changed since {since}); "
              f"baseline test strength {_pct(load_baseline())}")
        return 0
    reset = stage()
    if reset:
        print(f"mutate: the suite changed since the cached run: {reset} verdicts other than kills reset")
    scope = (f"mutants matching {', '.join(only)}" if only else
             f"{len(patterns)} functions changed since {since}" if since else "every function")
    print(f"mutate: mutmut over {SOURCE}/ in {STAGING.relative_to(REPO)}, {max_children} children, {scope}",
          flush=True)
    cached = cached_verdicts(patterns)
    rc = run_mutmut(patterns, max_children, report_dir / "mutmut.log")
    log = (report_dir / "mutmut.log").read_text()
    if rc != 0 and "Filtered for specific mutants, but nothing matches" in log:
        print(f"mutation: 0 mutants match {', '.join(patterns)}")
        return 0
    if rc != 0:
        print("\n".join(log.splitlines()[-40:]), file=sys.stderr)
        if "BadTestExecutionCommandsException" in log:
            print("mutate: pytest refused mutmut's test ids (exit status 4): a test id that changes between two "
                  "collections in one process, e.g. an explicit parametrize id with a backslash", file=sys.stderr)
        print(f"mutate: mutmut run failed (exit status {rc}); its output is in {report_dir / 'mutmut.log'}",
              file=sys.stderr)
        return 1
    records = read_results(patterns, equivalents)
    from_cache = sum(1 for r in records if r.name in cached and cached[r.name] == r.seconds)
    wall = time.perf_counter() - t0
    complete = not patterns
    stale = stale_equivalents(records, equivalents, complete)
    sources = {p: (REPO / p).read_text() for p in sorted({r.path for r in records})}
    extra = {"command": " ".join(["specgate mutate", *(f"--only {p}" for p in only),
                                  *([f"--since {since}"] if since and not only else [])]), "commit": commit,
             "complete": complete, "wall_s": round(wall, 1), "max_children": max_children,
             "from_cache": from_cache, "tested": len(records) - from_cache,
             "mutants_per_minute": round((len(records) - from_cache) / wall * 60, 1) if wall else None,
             "baseline_test_strength": load_baseline(), "stale_equivalents": stale}
    summary = summarise(records)
    problems = ratchet(summary, load_baseline(), complete, stale)
    paths = write_reports(report_dir, records, sources, {**extra, "problems": problems})
    print(f"mutate: {len(records)} mutants, {extra['tested']} tested in {wall:.0f} s "
          f"({extra['mutants_per_minute']} per minute) and {from_cache} from the cache; "
          f"reports: " + ", ".join(str(p) for p in paths.values()))
    for p in problems:
        print(f"mutate: FAIL: {p}")
    if raise_baseline:
        if not complete or problems:
            print("mutate: --update-baseline needs a full run without problems", file=sys.stderr)
            return 1
        if _git(["status", "--porcelain", "--", SOURCE], REPO).strip():
            print(f"mutate: --update-baseline needs {SOURCE}/ committed, so the baseline names the code it "
                  f"measured", file=sys.stderr)
            return 1
        print(update_baseline(summary, commit))
    print(score_line(summary))
    return 1 if problems else 0


def _pct(x: float | None) -> str:
    return "none" if x is None else f"{x:.2%}"


def add_mutate_parser(sub) -> None:
    p = sub.add_parser("mutate", help="mutation run: mutmut over engine/ with the tests and gates as the suite")
    p.add_argument("--since", metavar="REV", help="mutate only the functions changed since this git revision "
                   "('baseline': the commit of the last full run, from the baseline file)")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="mutate only mutants whose mutmut name matches (repeatable), e.g. 'engine.verify.*'")
    p.add_argument("--max-children", type=int, default=os.cpu_count() or 2, metavar="N",
                   help="mutants tested at once (default: the CPU count)")
    p.add_argument("--report", type=Path, default=REPO / "reports" / "mutation", metavar="DIR",
                   help="write summary.json, mutation-report.json (Stryker schema), survivors.md here")
    p.add_argument("--update-baseline", action="store_true",
                   help="after a full run without problems, raise the committed baseline to its test strength")
    p.set_defaults(func=cmd_mutate)


def cmd_mutate(args) -> int:
    if args.max_children < 1:
        print("specgate: error: --max-children must be at least 1", file=sys.stderr)
        return 2
    if (args.since or args.only) and args.update_baseline:
        print("specgate: error: --update-baseline needs a full run, not --since or --only", file=sys.stderr)
        return 2
    if args.since and args.only:
        print("specgate: error: give --since or --only, not both", file=sys.stderr)
        return 2
    try:
        if args.since == "baseline":
            args.since = baseline_commit()
        if args.since:
            _git(["rev-parse", "--verify", "--quiet", args.since + "^{commit}"], REPO)
        return mutate(args.since, args.max_children, args.report, args.update_baseline, tuple(args.only))
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specgate: mutate interrupted; mutmut's results so far stay cached in "
              f"{STAGING.relative_to(REPO)}", file=sys.stderr)
        return 130


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="specgate")
    sub = ap.add_subparsers(dest="command", required=True)
    add_mutate_parser(sub)
    args = ap.parse_args(["mutate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
