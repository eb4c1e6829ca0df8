"""pytest plugin for mutation runs (`specgate mutate` loads it with -p): the fastest tests run
first. mutmut stops a mutant's run at its first failing test (-x), so a killed mutant pays only
for the tests before the one that kills it."""
import json
from pathlib import Path


def pytest_collection_modifyitems(session, config, items):
    # mutmut runs the tests from its working copy, where it keeps each test's measured duration
    stats = Path("mutmut-stats.json")
    if not stats.exists():
        return
    duration = json.loads(stats.read_text())["duration_by_test"]
    items.sort(key=lambda item: duration.get(item.nodeid, float("inf")))
