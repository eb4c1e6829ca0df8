"""How long each gate took last time, and spreading timed work over workers by it.

`specgate gates run` and `specgate prove` write each gate's measured seconds (the sum of its
tests' durations) to build/gate-seconds.json; the next run reads them to start the slowest work
first and to balance its workers. A gate never measured here gets a static estimate (seconds on
two CPU cores, from a `make gates` run). Only the order and grouping depend on these figures,
never a verdict, so a stale or missing cache costs time, not correctness.
"""
import json
import os
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "build" / "gate-seconds.json"
STATIC_SECONDS = {"lossless": 40.0, "predicate-split": 15.0, "emit-count": 12.0, "combine": 10.0,
                  "no-sync": 8.0, "speed-ab": 8.0, "acceptance": 6.0, "reason-a": 4.0, "busy": 1.0}
UNKNOWN_SECONDS = 10.0


def load(path: Path = CACHE) -> dict[str, float]:
    """gate name -> last measured seconds ({} when there is no readable cache)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))} if isinstance(raw, dict) else {}


def record(seconds: Mapping[str, float], path: Path = CACHE) -> None:
    """Merge measured seconds into the cache (atomically: parallel runs may write it)."""
    if not seconds:
        return
    merged = {**load(path), **{k: round(float(v), 2) for k, v in seconds.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(sorted(merged.items())), indent=2) + "\n")
        tmp.replace(path)
    except OSError:
        pass  # a read-only checkout: the next run falls back to the estimates


def estimate(gate: str, known: Mapping[str, float]) -> float:
    return known.get(gate, STATIC_SECONDS.get(gate, UNKNOWN_SECONDS))


def balance(costs: Iterable[tuple[Hashable, float]], bins: int) -> list[list]:
    """Longest processing time first: items sorted by cost (ties by key, so the grouping is
    deterministic), each into the bin with the least work so far. Empty bins are dropped."""
    groups: list[tuple[float, int, list]] = [(0.0, i, []) for i in range(max(1, bins))]
    for key, cost in sorted(costs, key=lambda kc: (-kc[1], str(kc[0]))):
        total, i, items = min(groups, key=lambda g: (g[0], g[1]))
        items.append(key)
        groups[i] = (total + cost, i, items)
    return [items for _, _, items in groups if items]
