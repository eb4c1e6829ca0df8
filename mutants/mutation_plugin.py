"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): tests marked `bounded`
run first, then the fastest. mutmut stops a mutant's run at its first failing test (-x), so a
killed mutant pays only for the tests before the one that kills it, and a mutant that stops
the engine loop from finishing fails a bounded test instead of hanging an unbounded one. Each
child also takes a tqdm lock of its own (pytest_configure)."""
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
    # tqdm's default write lock holds a multiprocessing semaphore, created once and shared by every
    # child mutmut forks; a mutant that breaks a progress bar dies holding it and every later child
    # then hangs in tqdm() until its timeout. Each child gets a lock of its own.
    import threading

    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())
