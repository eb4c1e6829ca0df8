"""One stats pass for many shards: `specgate mutate --stats-only DIR` collects mutmut's test stats once,
and `specgate mutate --shard I/N --stats-from DIR` loads them instead of collecting them again.

Before its first mutant mutmut runs the whole suite once under its trampolines to map every
function to the tests that call it (and times each test): `mutants/mutmut-stats.json` in the
staging folder. On 2 cores that pass is most of a shard's fixed cost, and every CI shard paid it
(docs/mutation-runs.md, "Sizing the CI shards"). mutmut loads a stats file it finds and then only
maps tests that are new to it, so one pass can serve every shard of the same commit.

The pass stages the tree, lists the mutants (the listing gives the functions the stats map:
STATS_FUNCTIONS), runs mutmut with a pattern that matches no mutant (mutmut mutates, collects the
stats, saves them, then stops at its filter before any clean test or mutant) and copies the stats
files into DIR. Always from scratch: stats a cached folder held were collected on an older commit
and only extended since, so they may miss callers an engine change gave an existing function.

A shard's staging folder may hold stats of its own (its cache, restored from an earlier run). The
pass's files win: they were collected on this commit's sources and suite, a complete map, where
the cache's date from an older commit. The shard's cached `no tests` verdicts came from the older
map, so they are reset (each costs nothing to judge again: mutmut gives `no tests` without running
a test). drop_stale_stats (run after the files are put in place) still checks them against the
listing: stats from an older tree, lacking functions the sources now have, are dropped and
collected again, so a wrong artifact costs time, never a wrong verdict.
"""
import json
import shutil
import sys
import time
from pathlib import Path

from mutants.mutation.run import run_mutmut
from mutants.mutation.shard import LISTING, list_mutants
from mutants.mutation.stage import (
    NO_TESTS_EXIT_CODES,
    STAGING,
    STATS_FUNCTIONS,
    SUITE,
    record_stats_functions,
    reset_verdicts,
    stage,
)

MUTMUT_STATS = "mutmut-stats.json"  # in the staging folder's mutants/, mutmut's working copy
STATS_FILES = (MUTMUT_STATS, STATS_FUNCTIONS, LISTING)  # what a pass writes into its folder
NEEDED = (MUTMUT_STATS, STATS_FUNCTIONS)  # the listing only saves a shard its half minute; it is checked by digest
NO_MUTANT = "specgate.stats_only.x_none__mutmut_0"  # a mutant name no mutant has
NOTHING_MATCHES = "Filtered for specific mutants, but nothing matches"  # mutmut's stop after the stats
STATS_LOG = "stats-pass.log"  # mutmut's output of the pass, in the staging folder


def stats_locations(staging: Path) -> dict[str, Path]:
    """Where each of STATS_FILES lives in a staging folder."""
    return {MUTMUT_STATS: staging / "mutants" / MUTMUT_STATS, STATS_FUNCTIONS: staging / STATS_FUNCTIONS,
            LISTING: staging / LISTING}


def collect_stats(out: Path, max_children: int, staging: Path = STAGING, suite: tuple[str, ...] = SUITE) -> dict:
    """The stats pass: stage the tree into `staging`, then stats_pass. Returns stats_pass's figures
    with the seconds of each phase."""
    t0 = time.perf_counter()
    stage(staging, suite)
    return {"stage_s": time.perf_counter() - t0, **stats_pass(staging, out, max_children)}


def stats_pass(staging: Path, out: Path, max_children: int) -> dict:
    """In a staged folder: list the mutants, collect mutmut's stats from scratch, copy STATS_FILES into
    `out`. Tests no mutant. Returns {'list_s', 'mutmut_s': seconds, 'functions', 'mapped_functions',
    'tests': how many}; raises ValueError when mutmut did not get as far as saving its stats."""
    t0 = time.perf_counter()
    functions = {name.rpartition("__mutmut_")[0] for name in list_mutants(staging)}
    t_listed = time.perf_counter()
    where = stats_locations(staging)
    where[MUTMUT_STATS].unlink(missing_ok=True)  # from scratch (see above)
    log = staging / STATS_LOG
    rc, _ = run_mutmut([NO_MUTANT], max_children, log, staging)
    text = log.read_text()
    # mutmut ends its run at the filter (an assertion, exit status 1) once the stats are saved
    if rc == 0 or NOTHING_MATCHES not in text or not where[MUTMUT_STATS].exists():
        tail = "\n".join(text.splitlines()[-30:])
        raise ValueError(f"mutmut did not collect its test stats (exit status {rc}); its output ({log}):\n{tail}")
    record_stats_functions(staging, functions)
    out.mkdir(parents=True, exist_ok=True)
    for name, path in where.items():
        shutil.copy2(path, out / name)
    data = json.loads(where[MUTMUT_STATS].read_text())
    return {"list_s": t_listed - t0, "mutmut_s": time.perf_counter() - t_listed,
            "functions": len(functions), "tests": len(data["duration_by_test"]),
            "mapped_functions": sum(1 for tests in data["tests_by_mangled_function_name"].values() if tests)}


def install_stats(source: Path, staging: Path = STAGING) -> int:
    """Put a stats pass's files (from `source`) into a staged folder, over the ones it holds, and
    reset the cached `no tests` verdicts the folder's older map gave. Returns how many were reset.
    Raises ValueError when `source` lacks a needed file."""
    missing = [name for name in NEEDED if not (source / name).is_file()]
    if missing:
        raise ValueError(f"--stats-from {source}: no {' or '.join(missing)} there (written by "
                         f"`specgate mutate --stats-only DIR`)")
    for name, path in stats_locations(staging).items():
        if (source / name).is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / name, path)
    return reset_verdicts(staging, keep=(), only=NO_TESTS_EXIT_CODES)


def stats_only(args) -> int:
    """`--stats-only DIR`: the stats pass alone; it takes no option that picks or tests mutants."""
    given = [flag for flag, on in (("--since", args.since), ("--only", args.only), ("--shard", args.shard),
                                   ("--cuda-only", args.cuda_only), ("--update-baseline", args.update_baseline),
                                   ("--budget", args.budget is not None), ("--stats-from", args.stats_from),
                                   ("--time-limit", args.time_limit is not None)) if on]
    if given or args.merge:
        print(f"specgate: error: --stats-only tests no mutant and takes no {', '.join(given or ['merge'])}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        got = collect_stats(args.stats_only, args.max_children)
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 1
    print(f"mutate: mutmut's test stats of {got['functions']} functions ({got['mapped_functions']} mapped to tests, "
          f"{got['tests']} tests) in {time.perf_counter() - t0:.0f} s (staging {got['stage_s']:.0f} s, listing "
          f"{got['list_s']:.0f} s, mutmut {got['mutmut_s']:.0f} s), written to {args.stats_only}; "
          f"shards load them with --stats-from {args.stats_only}")
    return 0
