"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): tests marked `bounded`
run first, then the fastest. mutmut stops a mutant's run at its first failing test (-x), so a
killed mutant pays only for the tests before the one that kills it, and a mutant that stops
the engine loop from finishing fails a bounded test instead of hanging an unbounded one. Each
child also takes a tqdm lock of its own, and refuses to run in a process forked after CUDA was
initialized (pytest_configure)."""
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
    # A child forked from a process that initialized CUDA cannot use CUDA: every CUDA test would
    # fail and each mutant read as killed. mutmut collects test stats in its own process, so a
    # CUDA run warms them in a process of their own first (mutation_run.warm_stats); this makes
    # any other way it could happen a usage error (exit 4), which mutmut calls suspicious and
    # specgate a failed run, never a kill.
    import pytest
    import torch
    if torch.cuda._is_in_bad_fork():
        raise pytest.UsageError("this process was forked after CUDA was initialized in its parent, so CUDA "
                                "cannot run here and every CUDA test would fail: no verdict can be taken")

    # tqdm's default write lock holds a multiprocessing semaphore, created once and shared by every
    # child mutmut forks; a mutant that breaks a progress bar dies holding it and every later child
    # then hangs in tqdm() until its timeout. Each child gets a lock of its own.
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())
