"""`specgate mutate [--since REV [--budget N] | --only PATTERN ... | --shard I/N [--stats-from DIR] | --cuda-only]
[--max-children N] [--time-limit S] [--report DIR] [--update-baseline]`, `specgate mutate --stats-only DIR` and
`specgate mutate merge DIR ...` (also `make mutate`): mutmut over engine/, with the fast tests and gates as the suite.

One pass, a module per step:

    stage the suite in build/mutmut/ (stage) -> mutmut run there, over the functions
    changed since REV or all (run) -> read mutmut's results, with the reviewed
    equivalents (results) -> reports (report, job_summary) -> ratchet against the baseline
    (ratchet) -> score line; `--stats-only` and `--stats-from`: one stats pass for many shards (stats)
"""
import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from gates.argtypes import int_at_least
from mutants.mutation.ratchet import (
    baseline_commit,
    baseline_record,
    load_baseline,
    ratchet,
    stale_equivalents,
    update_baseline,
)
from mutants.mutation.record import MutantRecord
from mutants.mutation.report import score_line, summarise, write_reports
from mutants.mutation.results import cached_verdicts, load_equivalents, matches, read_results
from mutants.mutation.run import CUDA_RUN_ENV, changed_functions, git, run_mutmut
from mutants.mutation.shard import bounded, list_mutants, listing_digest, mutated_lines, parse_shard, plan_run
from mutants.mutation.stage import (
    CUDA_STAGING,
    CUDA_SUITE,
    MUTATED_GATES,
    REPO,
    SOURCE,
    STAGING,
    SUITE,
    drop_stale_stats,
    record_stats_functions,
    stage,
    suite_fingerprint,
)
from mutants.mutation.stats import install_stats, stats_only


def mutate(since: str | None, max_children: int, report_dir: Path, raise_baseline: bool,
           only: tuple[str, ...] = (), shard: tuple[int, int] | None = None, cuda: bool = False,
           time_limit: float | None = None, budget: int | None = None, stats_from: Path | None = None) -> int:
    t0 = time.perf_counter()
    equivalents = load_equivalents()
    patterns = list(only) or (changed_functions(since) if since else [])
    commit = git(["rev-parse", "--short", "HEAD"], REPO).strip()
    report_dir.mkdir(parents=True, exist_ok=True)
    if since and not patterns:
        print(f"mutate: no mutated function ({SOURCE}/, the gates' checks) changed since {since}; nothing to mutate")
        baseline = load_baseline()
        print(f"mutation: 0 mutants (no mutated function changed since {since}); "
              f"baseline test strength {baseline.describe() if baseline else 'none'}")
        return 0
    staging, suite = (CUDA_STAGING, CUDA_SUITE) if cuda else (STAGING, SUITE)
    reset = stage(staging, suite)
    if reset:
        print(f"mutate: the suite changed since the cached run: {reset} verdicts other than kills reset")
    if stats_from:  # over the folder's own (stats.py says why they win); drop_stale_stats below checks them
        print(f"mutate: mutmut's test stats from {stats_from}; {install_stats(stats_from, staging)} cached "
              f"`no tests` verdicts of older stats reset")
    sampled = None
    if since and budget is not None:
        # A bounded --since run: every mutant of the changed functions is listed, and when there are
        # more than the budget, that many are drawn uniformly with a fixed seed (the score says so).
        hashes = list_mutants(staging)
        in_run, sampled = bounded([n for n in hashes if matches(n, patterns)], budget)
        not_rerun, cached_now, to_test, functions = set(), set(), in_run, set()
    elif since:
        # Every function in a --since run changed, so its mutmut hash did and no reviewed mutant
        # of it can be skipped: the run names the patterns and needs no listing of every mutant.
        hashes, in_run, not_rerun, cached_now, to_test, functions = None, None, set(), set(), patterns, set()
    else:
        hashes = list_mutants(staging)
        functions = {name.rpartition("__mutmut_")[0] for name in hashes}
        if new := drop_stale_stats(staging, functions):
            print(f"mutate: {new} functions are new since mutmut collected its test stats: it collects them again, "
                  f"and the mutants its old stats left with no tests are tested again")
        in_run, not_rerun, cached_now, to_test = plan_run(hashes, equivalents, staging, patterns, shard, cuda)
    complete = not (patterns or shard or cuda)
    if sampled:
        counts = f"sampled {sampled}, {len(to_test)} to test"
    elif hashes is not None:
        counts = (f"{len(in_run)} of {len(hashes)} mutants, {len(to_test)} to test, {len(not_rerun)} reviewed "
                  f"and not re-run (function unchanged), {len(cached_now)} from the cache")
    else:
        counts = "every mutant of them tested"
    scope = ("the CUDA-only reviewed mutants" if cuda else f"shard {shard[0]}/{shard[1]}" if shard else
             f"mutants matching {', '.join(only)}" if only else
             f"{len(patterns)} functions changed since {since}" if since else "every function")
    print(f"mutate: mutmut over {SOURCE}/ and the gates' checks in {staging.relative_to(REPO)}, "
          f"{max_children} children, {scope}: {counts}", flush=True)
    cached = cached_verdicts([], staging)
    stopped = False
    if to_test and time_limit == 0:
        stopped, to_test = True, []  # the report of the cached verdicts; nothing is tested
    elif to_test:
        rc, stopped = run_mutmut(to_test, max_children, report_dir / "mutmut.log", staging,
                                 env=CUDA_RUN_ENV if cuda else None, time_limit=time_limit)
        if rc != 0 and not stopped:
            return _failed_run(rc, patterns, report_dir / "mutmut.log")
        if functions and not stopped:
            record_stats_functions(staging, functions)
    complete = complete and not stopped
    records = [_reviewed(r, equivalents) if r.name in not_rerun else r
               for r in read_results(patterns if in_run is None else [], equivalents, staging,
                                     names=None if in_run is None else set(in_run))]
    tested = set(to_test) if hashes is not None else {r.name for r in records}
    if stopped:
        unchecked = sum(1 for r in records if r.status == "not checked")
        print(f"mutate: stopped at the time limit ({time_limit:g} s): {unchecked} of {len(records)} mutants not "
              f"checked; the verdicts reached stay cached, and the same command resumes", file=sys.stderr)
    run = {"command": " ".join(["specgate mutate", *(f"--only {p}" for p in only),
                                *([f"--since {since}"] if since and not only else []),
                                *([f"--shard {shard[0]}/{shard[1]}"] if shard else []),
                                *(["--cuda-only"] if cuda else [])]),
           "commit": commit, "complete": complete, "wall_s": time.perf_counter() - t0,
           "max_children": max_children, "mode": "cuda-only" if cuda else "shard" if shard else "run",
           "time_limit_s": time_limit, "stopped_at_time_limit": stopped, "sampled": sampled,
           "shard": f"{shard[0]}/{shard[1]}" if shard else None,
           "mutants_in_scope": len(hashes) if hashes is not None and not since else None,
           "listing_digest": listing_digest(hashes) if hashes is not None and not since else None,
           "suite_digest": suite_fingerprint(suite)[:16],
           # a cached verdict counts only while it stands (a stop can find it reset)
           "from_cache": sum(1 for r in records if r.name not in tested and r.name not in not_rerun
                             and r.name in cached and r.status != "not checked")}
    # A listed run checks every reviewed entry against the listing, not only those it tested.
    lines = mutated_lines(staging) if hashes is not None and not since else None
    summary, problems = _report(records, equivalents, run, report_dir, lines, rescoping=raise_baseline)
    if raise_baseline:
        if not run["complete"] or problems:
            print("mutate: --update-baseline needs a full run without problems", file=sys.stderr)
            return 1
        if git(["status", "--porcelain", "--", SOURCE, *MUTATED_GATES], REPO).strip():
            print(f"mutate: --update-baseline needs {SOURCE}/ committed, so the baseline names the code it "
                  f"measured", file=sys.stderr)
            return 1
        print(update_baseline(summary, commit))
    print(score_line(summary) + (f"; sampled {sampled}" if sampled else ""))
    return 1 if problems else 0


def _reviewed(record: MutantRecord, equivalents) -> MutantRecord:
    """A reviewed mutant of an unchanged function: the review's verdict, marked not re-run."""
    return replace(record, status="survived", equivalent=equivalents[record.name].reason, not_rerun=True,
                   seconds=None)


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


def _report(records, equivalents, run: dict, report_dir: Path, lines: dict[str, str] | None = None,
            rescoping: bool = False) -> tuple[dict, list[str]]:
    """Score the run, ratchet it, write the reports and say what failed: (summary, problems).
    `lines`: every mutant's changed line, when the run listed them all; `rescoping`: the run
    updates the baseline, so a baseline of another scope is re-set rather than a failure."""
    wall, from_cache, complete = run["wall_s"], run["from_cache"], run["complete"]
    judged_on_cuda = frozenset(r.name for r in records) if run.get("mode") == "cuda-only" else frozenset()
    stale = stale_equivalents(records, equivalents, complete, judged_on_cuda, lines)
    sources = {p: (REPO / p).read_text() for p in sorted({r.path for r in records})}
    tested = len(records) - from_cache - sum(1 for r in records if r.not_rerun or r.status == "not checked")
    extra = {**run, "wall_s": round(wall, 1), "tested": tested,
             "mutants_per_minute": round(tested / wall * 60, 1) if wall else None,
             "baseline": baseline_record(), "stale_equivalents": stale}
    summary = summarise(records)
    problems = ratchet(summary, load_baseline(), complete, stale, defer=run.get("mode") != "run",
                       rescoping=rescoping)
    paths = write_reports(report_dir, records, sources, {**extra, "problems": problems})
    print(f"mutate: {len(records)} mutants, {extra['tested']} tested in {wall:.0f} s "
          f"({extra['mutants_per_minute']} per minute), {from_cache} from the cache and "
          f"{sum(1 for r in records if r.not_rerun)} reviewed, not re-run; "
          f"reports: " + ", ".join(str(p) for p in paths.values()))
    for p in problems:
        print(f"mutate: FAIL: {p}")
    return summary, problems


def add_mutate_parser(sub) -> None:
    p = sub.add_parser("mutate", help="mutation run: mutmut over engine/ with the tests and gates as the suite")
    p.add_argument("--since", metavar="REV", help="mutate only the functions changed since this git revision "
                   "('baseline': the commit of the last full run, from the baseline file)")
    p.add_argument("--only", action="append", default=[], metavar="PATTERN",
                   help="mutate only mutants whose mutmut name matches (repeatable), e.g. 'engine.verify.*'")
    p.add_argument("--max-children", type=int_at_least(1), default=os.cpu_count() or 2, metavar="N",
                   help="mutants tested at once (default: the CPU count)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop testing after S seconds and report what was judged (the rest: not checked, a run "
                   "failure); the verdicts stay cached and the same command resumes. 0 tests nothing: the report "
                   "of the cached verdicts, e.g. after a run its machine stopped")
    p.add_argument("--report", type=Path, default=REPO / "reports" / "mutation", metavar="DIR",
                   help="write summary.json, mutation-report.json (Stryker schema), survivors.md here")
    p.add_argument("--update-baseline", action="store_true",
                   help="after a full run without problems, raise the committed baseline to its test strength")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="test only shard I of N (every N-th mutant, each function spread evenly over the shards); "
                   "combine the shards' report folders with `specgate mutate merge DIR ...`")
    p.add_argument("--budget", type=int_at_least(1), default=None, metavar="N",
                   help="with --since: test at most N mutants of the changed functions, drawn uniformly with a fixed "
                   "seed when there are more (the score line says so), so a commit that changes many functions "
                   "keeps the run bounded")
    p.add_argument("--stats-only", type=Path, default=None, metavar="DIR",
                   help="collect mutmut's test stats (the suite once, mapping each function to its tests) and write "
                   "them to DIR, testing no mutant: one pass for every shard to load with --stats-from DIR")
    p.add_argument("--stats-from", type=Path, default=None, metavar="DIR",
                   help="load the test stats a --stats-only pass wrote to DIR instead of collecting them (over any "
                   "the staging folder holds); stats older than the sources are dropped and collected again")
    p.add_argument("--cuda-only", action="store_true",
                   help="test only the mutants equivalent-mutants.toml lists as CUDA-only, with the gates on cuda "
                   "(the GPU machine); merge its report with a CPU run's to replace their verdicts")
    p.add_argument("merge", nargs="*", metavar="merge DIR",
                   help="`merge DIR ...`: combine shard (and --cuda-only) report folders into one report in --report, "
                   "one score and one ratchet decision")
    p.set_defaults(func=cmd_mutate)


def cmd_mutate(args) -> int:
    if args.stats_only is not None:
        return stats_only(args)
    if args.merge:
        if args.merge[0] != "merge" or len(args.merge) < 2:
            print("specgate: error: usage: specgate mutate merge DIR [DIR ...] [--report DIR]", file=sys.stderr)
            return 2
        from mutants.mutation.merge import merge
        try:
            return merge([Path(d) for d in args.merge[1:]], args.report, args.update_baseline)
        except ValueError as e:
            print(f"specgate: error: {e}", file=sys.stderr)
            return 2
    if args.stats_from is not None and (args.since or args.cuda_only):
        print("specgate: error: --stats-from takes no --since or --cuda-only", file=sys.stderr)
        return 2
    shard = None
    if args.shard or args.cuda_only:
        if args.since or args.only or args.update_baseline or (args.shard and args.cuda_only):
            print("specgate: error: --shard and --cuda-only take no --since, --only, --update-baseline or each "
                  "other", file=sys.stderr)
            return 2
    if args.time_limit is not None and not args.time_limit >= 0:
        print("specgate: error: --time-limit must be a number of seconds, 0 or more", file=sys.stderr)
        return 2
    if args.max_children < 1:
        print("specgate: error: --max-children must be at least 1", file=sys.stderr)
        return 2
    if (args.since or args.only) and args.update_baseline:
        print("specgate: error: --update-baseline needs a full run, not --since or --only", file=sys.stderr)
        return 2
    if args.budget is not None and not args.since:
        print("specgate: error: --budget bounds a --since run; give it with --since REV", file=sys.stderr)
        return 2
    if args.since and args.only:
        print("specgate: error: give --since or --only, not both", file=sys.stderr)
        return 2
    try:
        if args.since == "baseline":
            args.since = baseline_commit()
        if args.since:
            git(["rev-parse", "--verify", "--quiet", args.since + "^{commit}"], REPO)
        if args.shard:
            shard = parse_shard(args.shard)
        return mutate(args.since, args.max_children, args.report, args.update_baseline, tuple(args.only),
                      shard=shard, cuda=args.cuda_only, time_limit=args.time_limit, budget=args.budget,
                      stats_from=args.stats_from)
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
