"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): tests marked `bounded`
run first, then the fastest. mutmut stops a mutant's run at its first failing test (-x), so a
killed mutant pays only for the tests before the one that kills it, and a mutant that stops
the engine loop from finishing fails a bounded test instead of hanging an unbounded one. Each
child also takes a tqdm lock of its own, and a CUDA run's child refuses to judge where CUDA does
not start (pytest_configure)."""
import json
from pathlib import Path


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
