"""`specgate mutate [--since REV | --only PATTERN ...] [--max-children N] [--report DIR] [--update-baseline]`
(also `make mutate`): mutmut over engine/, with the fast tests and gates as the suite.

One pass, a module per step:

    stage the suite in build/mutmut/ (mutation_stage) -> mutmut run there, over the functions
    changed since REV or all (mutation_run) -> read mutmut's results, with the reviewed
    equivalents (mutation_results) -> reports (mutation_report) -> ratchet against the baseline
    (mutation_ratchet) -> score line
"""
import argparse
import os
import sys
import time
from pathlib import Path

from gates.argtypes import int_at_least
from mutants.mutation_ratchet import baseline_commit, load_baseline, ratchet, stale_equivalents, update_baseline
from mutants.mutation_report import score_line, summarise, write_reports
from mutants.mutation_results import cached_verdicts, load_equivalents, read_results
from mutants.mutation_run import changed_functions, git, run_mutmut
from mutants.mutation_stage import REPO, SOURCE, STAGING, stage


def mutate(since: str | None, max_children: int, report_dir: Path, raise_baseline: bool,
           only: tuple[str, ...] = ()) -> int:
    t0 = time.perf_counter()
    equivalents = load_equivalents()
    patterns = list(only) or (changed_functions(since) if since else [])
    commit = git(["rev-parse", "--short", "HEAD"], REPO).strip()
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
    if rc != 0:
        return _failed_run(rc, patterns, report_dir / "mutmut.log")
    records = read_results(patterns, equivalents)
    run = {"command": " ".join(["specgate mutate", *(f"--only {p}" for p in only),
                                *([f"--since {since}"] if since and not only else [])]),
           "commit": commit, "complete": not patterns, "wall_s": time.perf_counter() - t0,
           "max_children": max_children,
           "from_cache": sum(1 for r in records if r.name in cached and cached[r.name] == r.seconds)}
    summary, problems = _report(records, equivalents, run, report_dir)
    if raise_baseline:
        if not run["complete"] or problems:
            print("mutate: --update-baseline needs a full run without problems", file=sys.stderr)
            return 1
        if git(["status", "--porcelain", "--", SOURCE], REPO).strip():
            print(f"mutate: --update-baseline needs {SOURCE}/ committed, so the baseline names the code it "
                  f"measured", file=sys.stderr)
            return 1
        print(update_baseline(summary, commit))
    print(score_line(summary))
    return 1 if problems else 0


def _failed_run(rc: int, patterns: list[str], log_path: Path) -> int:
    """mutmut exited non-zero: nothing matched (exit 0, no mutants), or the run failed (exit 1)."""
    log = log_path.read_text()
    if "Filtered for specific mutants, but nothing matches" in log:
        print(f"mutation: 0 mutants match {', '.join(patterns)}")
        return 0
    print("\n".join(log.splitlines()[-40:]), file=sys.stderr)
    if "BadTestExecutionCommandsException" in log:
        print("mutate: pytest refused mutmut's test ids (exit status 4): a test id that changes between two "
              "collections in one process, e.g. an explicit parametrize id with a backslash", file=sys.stderr)
    print(f"mutate: mutmut run failed (exit status {rc}); its output is in {log_path}", file=sys.stderr)
    return 1


def _report(records, equivalents, run: dict, report_dir: Path) -> tuple[dict, list[str]]:
    """Score the run, ratchet it, write the reports and say what failed: (summary, problems)."""
    wall, from_cache, complete = run["wall_s"], run["from_cache"], run["complete"]
    stale = stale_equivalents(records, equivalents, complete)
    sources = {p: (REPO / p).read_text() for p in sorted({r.path for r in records})}
    extra = {**run, "wall_s": round(wall, 1), "tested": len(records) - from_cache,
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
    return summary, problems


def _pct(x: float | None) -> str:
    return "none" if x is None else f"{x:.2%}"


def add_mutate_parser(sub) -> None:
    p = sub.add_parser("mutate", help="mutation run: mutmut over engine/ with the tests and gates as the suite")
    p.add_argument("--since", metavar="REV", help="mutate only the functions changed since this git revision "
                   "('baseline': the commit of the last full run, from the baseline file)")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="mutate only mutants whose mutmut name matches (repeatable), e.g. 'engine.verify.*'")
    p.add_argument("--max-children", type=int_at_least(1), default=os.cpu_count() or 2, metavar="N",
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
            git(["rev-parse", "--verify", "--quiet", args.since + "^{commit}"], REPO)
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
