"""Staging a mutation run: the suite copied into build/mutmut/, with the configuration mutmut reads.

mutmut writes its working copy into a folder named `mutants/` wherever it runs, and ours holds
the seeded defects, so it runs in a git-ignored staging folder holding only what the suite needs.
Its cache lives there too: a rerun retests only mutants of functions that changed.
"""
import hashlib
import json
import shutil
import tomllib
from pathlib import Path

from gates.registry import GATES

REPO = Path(__file__).resolve().parents[2]
STAGING = REPO / "build" / "mutmut"
SOURCE = "engine"  # the engine, mutated whole
# The harness's own checking code, mutated too and judged by the same suite: the comparisons,
# invariants, statistics and folding checks the gates rely on. (mutants/proof/matrix.py, the proof's
# judging, cannot be: mutmut's working copy is a folder named `mutants/`, so our package of that
# name cannot be staged; tests/proof/test_matrix.py judges it.)
MUTATED_GATES = ("gates/compare.py", "gates/invariants.py", "gates/distribution.py", "gates/measure.py",
                 "gates/acceptance.py")
SOURCES = (SOURCE, "gates")  # mutmut's source_paths: only SOURCE/ and MUTATED_GATES are mutated there
# What a run mutates, as mutmut's only_mutate patterns: the scope a baseline's test strength is of.
SCOPE = (f"{SOURCE}/*", *MUTATED_GATES)


def is_mutated(path: str) -> bool:
    """Whether a file (relative to the repo) is under mutation."""
    return path.endswith(".py") and (path.startswith(f"{SOURCE}/") or path in MUTATED_GATES)

# What the mutation suite needs, copied into the staging folder. A folder rule picks the tests
# (tests/README.md): tests/engine, tests/bench and tests/gates are staged, with tests/helpers;
# tests/proof and tests/mutation are not (in mutmut's working copy `mutants` is mutmut's folder, so
# our mutants/ package cannot be imported there), nor tests/project (the layout, the README, the
# `specgate` command, which imports mutants/ for its parser, the reports in a browser, the GPU
# script: no engine code). tests/project/test_architecture.py checks that no staged test imports mutants/.
STAGED = ("engine", "gates", "fixtures", "tests", "conftest.py")
UNSTAGED_TEST_DIRS = ("proof", "mutation", "project")


def is_staged(path: str) -> bool:
    """Whether a file (relative to the repo) of a STAGED folder is copied into the staging folder."""
    parts = Path(path).parts
    return not (len(parts) > 2 and parts[0] == "tests" and parts[1] in UNSTAGED_TEST_DIRS)


def _ignored(folder: str, names: list[str]) -> set[str]:
    """shutil.copytree's ignore: caches, and the unstaged test folders."""
    rel = Path(folder).resolve().relative_to(REPO).as_posix() if Path(folder).resolve().is_relative_to(REPO) else ""
    return {n for n in names if n in ("__pycache__", ".hypothesis") or n.endswith(".pyc")
            or (rel == "tests" and n in UNSTAGED_TEST_DIRS)}


PLUGIN = Path(__file__).with_name("plugin.py")
STAGED_PLUGIN = "mutation_plugin.py"  # its name in the staging folder, where pytest loads it by name
# The suite: the tests, and the gates the registry marks `mutation_suite` (those that judge one run
# exactly; speed-ab, busy and no-sync measure time or need CUDA), under the Hypothesis `mutation`
# profile (2 examples a test). A surviving mutant runs every test that covers its function, so the
# slow ones stay out: `slow` tests (whole gate sessions in subprocesses), the end-to-end statistical
# and bench checks (tests/engine/test_verify.py's chi-square tests judge the sampler in a fraction of the
# time), and tests a gate repeats.
SUITE = ("tests", *(g.file.relative_to(REPO).as_posix() for g in GATES if g.mutation_suite))
# A --cuda-only run (on the GPU machine) tests mutants the CPU suite could not kill because their
# code runs on CUDA only; of the suite, only the CUDA test modules and the gates (on cuda) run that
# code differently there, with the no-sync gate, which on CUDA judges exactly (torch's sync debug
# mode raises on a blocking copy). It stages into its own folder, so its stats and verdicts never
# mix with a CPU run's, and a run stopped part way resumes where it stopped.
CUDA_STAGING = REPO / "build" / "mutmut-cuda"
CUDA_SUITE = ("tests/engine/test_cuda_path.py", "tests/bench/test_cuda_bench.py", "gates/no_sync.py", *SUITE[1:])
# mutmut's default isolation runs the clean tests in its own process and forks each mutant's
# child from it: after CUDA tests ran there, no child can start CUDA. A CUDA run takes mutmut's
# fork server instead, a process that imports the suite but runs no test, and runs the stats and
# clean tests in children of its own.
DESELECTED = ("gates/lossless.py::test_sampled_runs_emit_the_target_distribution",
              "gates/lossless.py::test_negative_control_lossy_engine_fails_the_distribution_test",
              "gates/predicate_split.py::test_mixed_batches_async_equals_sync",
              "tests/engine/test_spec_decode.py::test_greedy_spec_equals_plain_under_preemption")
# pytest's unraisableexception plugin runs gc.collect() five times as each session ends: in a child
# forked from a process holding torch, that is 0.2-0.3 s a mutant (a third of a typical kill), and
# an unraisable exception only ever makes a warning, never a verdict.
PYTEST_ARGS = ("-p", "gates.plugin", "--gates-per-test", "-p", "mutation_plugin", "-p", "no:unraisableexception",
               "-m", "not slow", *(a for test in DESELECTED for a in ("--deselect", test)))
# mutmut ends a mutant's run after (the covering tests' time + constant) x multiplier seconds of
# wall time (twice that of CPU time). A tight limit reads a busy machine as a hang; a loose one
# lets a real hang hold a core. The engine raises on a stalled scheduler, so hangs are rare.
TIMEOUT_MULTIPLIER, TIMEOUT_CONSTANT = 8.0, 30.0
KILLED_EXIT_CODES = (1, 3)  # pytest's exit status for failed tests, and for an internal error
NO_TESTS_EXIT_CODES = (5, 33)  # pytest's "no tests collected", and mutmut's "no test covers this function"
STATS_FUNCTIONS = "stats-functions.json"  # in the staging folder: the functions mutmut's stats map


def stage(staging: Path = STAGING, suite: tuple[str, ...] = SUITE) -> int:
    """Copy the suite into `staging`, keeping mutmut's cache (staging/mutants/*.meta, stats).
    mutmut retests a mutant when its function changes, not when the suite does; so when the
    suite changed, every cached verdict but a kill is reset (a stronger suite cannot revive a
    killed mutant; a fresh clone, as in CI, has no cache at all). Returns how many were reset."""
    staging.mkdir(parents=True, exist_ok=True)
    fingerprint, stamp = suite_fingerprint(suite), staging / "suite.sha256"
    reset = 0
    if stamp.exists() and stamp.read_text() != fingerprint:
        reset = forget_suite(staging)
    for name in STAGED:
        for root in (staging, staging / "mutants"):
            target = root / name
            if target.is_dir() and not (root.name == "mutants" and name in SOURCES):
                shutil.rmtree(target)  # a removed test must not linger in either copy
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, staging / name, ignore=_ignored, dirs_exist_ok=True)
        else:
            shutil.copy2(src, staging / name)
    shutil.copy2(PLUGIN, staging / STAGED_PLUGIN)
    (staging / "pyproject.toml").write_text(staging_config(suite))
    stamp.write_text(fingerprint)
    return reset


def forget_suite(staging: Path) -> int:
    """The suite changed: reset every cached verdict but a kill, and keep mutmut from resetting the
    kills too. mutmut 3.8 resets every verdict (and its stats) when its test selection or pytest
    arguments change, which it tells by a fingerprint of its config in its stats: a suite that
    gained a file would re-run every kill, hours on a GPU. With the fingerprint dropped, mutmut
    keeps the verdicts, maps the suite's new tests and drops its removed ones. Returns how many
    verdicts were reset."""
    stats = staging / "mutants" / "mutmut-stats.json"
    if stats.exists():
        data = json.loads(stats.read_text())
        data.pop("config_fingerprint", None)
        stats.write_text(json.dumps(data))
    return reset_verdicts(staging, keep=KILLED_EXIT_CODES)


def suite_fingerprint(suite: tuple[str, ...] = SUITE) -> str:
    """A hash of everything staged but the code under mutation: tests, gates, fixtures, config."""
    h = hashlib.sha256(staging_config(suite).encode() + PLUGIN.read_bytes())
    for name in STAGED:
        if name == SOURCE:
            continue
        src = REPO / name
        files = sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if src.is_dir() else [src]
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            if is_staged(rel) and not is_mutated(rel):
                h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def drop_stale_stats(staging: Path, functions: set[str]) -> int:
    """mutmut maps each function to the tests that call it once, when it collects its stats, and
    later only adds new tests: a function added to the sources since has no tests in that map, so
    its mutants read `no tests` although tests call it. When functions appeared since the stats
    were collected (STATS_FUNCTIONS, written after each run), the stats are dropped and mutmut
    collects them again. Returns how many functions are new (0: the stats stand)."""
    stats, seen = staging / "mutants" / "mutmut-stats.json", staging / STATS_FUNCTIONS
    if not (stats.exists() and seen.exists()):
        return 0
    new = functions - set(json.loads(seen.read_text()))
    if new:
        stats.unlink()
        reset_verdicts(staging, keep=(), only=NO_TESTS_EXIT_CODES)  # their `no tests` came from the old map
    return len(new)


def record_stats_functions(staging: Path, functions: set[str]) -> None:
    """After a run: the functions mutmut's stats now map."""
    (staging / STATS_FUNCTIONS).write_text(json.dumps(sorted(functions)))


def reset_verdicts(staging: Path, keep: tuple[int, ...], only: tuple[int, ...] | None = None) -> int:
    """Forget mutmut's cached verdicts (exit codes) except those in `keep` (of those in `only`, if given)."""
    reset = 0
    for meta_path in (m for source in SOURCES for m in (staging / "mutants" / source).rglob("*.meta")):
        meta = json.loads(meta_path.read_text())
        codes = meta["exit_code_by_key"]
        for name, code in codes.items():
            if code is not None and code not in keep and (only is None or code in only):
                codes[name] = None
                reset += 1
        meta_path.write_text(json.dumps(meta, indent=4))
    return reset


def staging_config(suite: tuple[str, ...] = SUITE) -> str:
    pytest_ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    also_copy = [n for n in STAGED if n not in (*SOURCES, "tests")] + [STAGED_PLUGIN]
    return "\n".join([
        "# Generated by `specgate mutate` (mutants/mutation/mutate.py); edits are overwritten.",
        "[tool.pytest.ini_options]",
        'addopts = "-p no:cacheprovider"',
        f"pythonpath = {json.dumps(pytest_ini['pythonpath'])}",
        f"markers = {json.dumps(pytest_ini['markers'])}",
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps(list(SOURCES))}",
        f"only_mutate = {json.dumps(list(SCOPE))}",
        f"also_copy = {json.dumps(also_copy)}",
        f"pytest_add_cli_args = {json.dumps(list(PYTEST_ARGS))}",
        f"pytest_add_cli_args_test_selection = {json.dumps(list(suite))}",
        f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
        f"timeout_constant = {TIMEOUT_CONSTANT}",
        f'process_isolation = "{"forkserver" if suite == CUDA_SUITE else "fork"}"',
        "",
    ])
