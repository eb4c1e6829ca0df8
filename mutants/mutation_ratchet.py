"""Scoring a mutation run against what was reviewed and measured before: reviewed equivalents that
went stale, the committed baseline of test strength (mutants/mutation-baseline.json), which only
rises, and the ratchet that decides whether a run fails.
"""
import json
from datetime import datetime, timezone
from pathlib import Path

from mutants.mutation_report import RUN_FAILURES, MutantRecord
from mutants.mutation_results import EQUIVALENTS, Equivalent, mutated_line
from mutants.mutation_stage import REPO

CUDA_ONLY = "CUDA-only"  # how an equivalents entry's reason starts when only a GPU can reach the mutant

BASELINE = REPO / "mutants" / "mutation-baseline.json"


def stale_equivalents(records: list[MutantRecord], equivalents: dict[str, Equivalent], complete: bool,
                      judged_on_cuda: frozenset[str] = frozenset(), lines: dict[str, str] | None = None) -> list[str]:
    """Reviewed entries that no longer describe a surviving mutant: it is killed now (so it was
    not equivalent), mutmut renumbered it, or it no longer exists. With `lines` (each mutant's
    changed line, from the listing of every mutant) every entry is checked, tested or not; without,
    only the tested ones (and, on a full run, their existence). A CUDA-only entry explains a CPU
    run's survivor: its kill on CUDA (`judged_on_cuda`) is the verdict it waits for."""
    by_name = {r.name: r for r in records}
    problems = []
    for name, eq in sorted(equivalents.items()):
        r = by_name.get(name)
        now = lines.get(name) if lines is not None else mutated_line(r.diff) if r else None
        if now is None:
            if complete or lines is not None:
                problems.append(f"{name}: listed as equivalent, but no such mutant")
        elif now != eq.mutated:
            problems.append(f"{name}: listed as equivalent for `{eq.mutated}`, but it now mutates `{now}`")
        elif r is not None and r.status != "survived" and not (
                r.status == "killed" and name in judged_on_cuda and eq.reason.startswith(CUDA_ONLY)):
            problems.append(f"{name}: listed as equivalent, but it was {r.status}")
    return problems


def load_baseline(path: Path = BASELINE) -> float | None:
    return json.loads(path.read_text())["test_strength"] if path.exists() else None


def baseline_commit(path: Path = BASELINE) -> str:
    """The commit the baseline's full run measured: `--since baseline` retests what changed after it."""
    if not path.exists():
        raise ValueError(f"--since baseline: there is no {path.name} yet; run a full `specgate mutate "
                         f"--update-baseline` first")
    return json.loads(path.read_text())["commit"]


def ratchet(summary: dict, baseline: float | None, complete: bool, stale: list[str],
            defer: bool = False) -> list[str]:
    """Why this run fails, if it does: run failures, a wrong reviewed list, a full run's test
    strength under the baseline, or (on a --since run) a survivor nobody has explained. A shard
    (`defer`) fails only on the first two: its merge decides the rest."""
    problems = [f"{summary[s.replace(' ', '_')]} {s}" for s in RUN_FAILURES if summary[s.replace(" ", "_")]]
    problems += stale
    if defer:
        return problems
    strength = summary["test_strength"]
    if complete and baseline is not None and strength is not None and strength < baseline - 1e-9:
        problems.append(f"test strength {strength:.2%} is under the baseline {baseline:.2%}")
    if not complete and summary["survivors_unexplained"]:
        problems.append(f"{summary['survivors_unexplained']} survivors in the mutated functions are neither "
                        f"killed nor listed in {EQUIVALENTS.name}")
    return problems


def update_baseline(summary: dict, commit: str, path: Path = BASELINE) -> str:
    """Raise the baseline to this full run's test strength; it never goes down."""
    old = load_baseline(path)
    new = summary["test_strength"]
    if old is not None and new < old - 1e-9:
        raise ValueError(f"test strength {new:.2%} is under the baseline {old:.2%}; the baseline only rises")
    path.write_text(json.dumps({"test_strength": round(new, 6), "killed": summary["killed"],
                                "total": summary["total"], "commit": commit,
                                "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}, indent=2) + "\n")
    return f"baseline: test strength {new:.2%} (was {'none' if old is None else f'{old:.2%}'})"
