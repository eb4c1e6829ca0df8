"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): tests marked `bounded`
run first, then the fastest. mutmut stops a mutant's run at its first failing test (-x), so a
killed mutant pays only for the tests before the one that kills it, and a mutant that stops
the engine loop from finishing fails a bounded test instead of hanging an unbounded one."""
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
