"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): tests marked `bounded`
run first, then the fastest. mutmut stops a mutant's run at its first failing test (-x), so a
killed mutant pays only for the tests before the one that kills it, and a mutant that stops
the engine loop from finishing fails a bounded test instead of hanging an unbounded one. Each
child also takes a tqdm lock of its own, and a CUDA run's child refuses to judge where CUDA does
not start (pytest_configure). A test that runs past HANG_LIMIT_S fails (pytest_runtest_call).

Why the limit: mutmut ends a hanging child only at its CPU limit, 16 x (the covering tests'
seconds + 30), and a function every engine test covers has 224 s of covering tests: a mutant
that loops for ever there held a core for over an hour (StepResult.unpack's `while` mutant in the
from-scratch shard of 2026-12-04), longer than the rest of its shard. The suite's slowest test
takes 20 s alone (mutmut's stats, 1,615 tests); a test still running at six times that is a hang,
which the suite has then observed: it fails, and mutmut reads the failure as a kill, as it reads
any failing test. The alarm repeats every HANG_REPEAT_S, in case code catches even a
BaseException once. CPU runs only: a `--cuda-only` run's tests include whole gates compiling
inductor's kernels on the GPU, and its few mutants keep mutmut's own limit.
"""
import json
import signal
from pathlib import Path

import pytest

HANG_LIMIT_S = 120.0
HANG_REPEAT_S = 5.0


class TestHang(BaseException):
    """Raised into a test that ran past HANG_LIMIT_S: pytest reports it as the test's failure. A
    BaseException, so engine code's `except Exception` cannot swallow it."""
    __test__ = False  # not a test class, whatever its name


def pytest_collection_modifyitems(session, config, items):
    # mutmut runs the tests from its working copy, where it keeps each test's measured duration
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    duration = json.loads(stats.read_text())["duration_by_test"]
    items.sort(key=lambda item: (item.get_closest_marker("bounded") is None,
                                 duration.get(item.nodeid, float("inf"))))


def pytest_configure(config):
    # A CUDA run's mutant child that cannot use CUDA fails every CUDA test, and each mutant would
    # read as killed: it happens when the process it was forked from started CUDA (torch's lazy
    # init, or only the driver, which torch.cuda.is_available() starts unless
    # PYTORCH_NVML_BASED_CUDA_CHECK=1, set for CUDA runs: mutants.mutation.run.CUDA_RUN_ENV). So the child
    # starts CUDA first and, when it cannot (a bad fork raises here too), stops with a usage error
    # (exit 4: mutmut's `suspicious`, a failed run for specgate): never a verdict.
    import os

    import pytest
    if os.environ.get("SPECGATE_DEVICE") == "cuda" and "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", ""):
        import torch
        try:
            torch.cuda.init()
        except Exception as e:  # the driver's own error, e.g. "CUDA error: initialization error"
            raise pytest.UsageError(f"CUDA does not start in this mutant's child ({e}), so every CUDA test would "
                                    f"fail: no verdict can be taken") from e

    # tqdm's default write lock holds a multiprocessing semaphore, created once and shared by every
    # child mutmut forks; a mutant that breaks a progress bar dies holding it and every later child
    # then hangs in tqdm() until its timeout. Each child gets a lock of its own.
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    import os
    if os.environ.get("SPECGATE_DEVICE") == "cuda":  # the GPU's gate tests compile for minutes: not timed here
        yield
        return

    def hang(signum, frame):
        raise TestHang(f"{item.nodeid} still running after {HANG_LIMIT_S:g} s: a hang (mutants/mutation/plugin.py)")

    previous = signal.signal(signal.SIGALRM, hang)
    signal.setitimer(signal.ITIMER_REAL, HANG_LIMIT_S, HANG_REPEAT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
