"""Scoring a mutation run against what was reviewed and measured before: reviewed equivalents that
went stale, the committed baseline of test strength (mutants/mutation/baseline.json), which only
rises within the scope it measured, and the ratchet that decides whether a run fails.
"""
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from mutants.mutation.record import RUN_FAILURES, MutantRecord
from mutants.mutation.results import EQUIVALENTS, Equivalent, mutated_line
from mutants.mutation.stage import REPO, SCOPE

CUDA_ONLY = "CUDA-only"  # how an equivalents entry's reason starts when only a GPU can reach the mutant

BASELINE = REPO / "mutants" / "mutation" / "baseline.json"


def stale_equivalents(records: list[MutantRecord], equivalents: dict[str, Equivalent], complete: bool,
                      judged_on_cuda: frozenset[str] = frozenset(), lines: dict[str, str] | None = None) -> list[str]:
    """Reviewed entries that no longer describe a surviving mutant: it is killed now (so it was
    not equivalent), mutmut renumbered it, or it no longer exists. With `lines` (each mutant's
    changed line, from the listing of every mutant) every entry is checked, tested or not; without,
    only the tested ones (and, on a full run, their existence). A CUDA-only entry explains a CPU
    run's survivor, or its `no tests` where no CPU test reaches the function at all (CUDA graph
    capture): its kill on CUDA (`judged_on_cuda`) is the verdict it waits for. A mutant a stopped
    run did not check is a run failure, not a verdict on its entry."""
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
        elif r is not None and r.status not in ("survived", "not checked") and not _awaits_cuda(r, eq, judged_on_cuda):
            problems.append(f"{name}: listed as equivalent, but it was {r.status}")
    return problems


def _awaits_cuda(record: MutantRecord, eq: Equivalent, judged_on_cuda: frozenset[str]) -> bool:
    """A CUDA-only entry's mutant, unreached on the CPU or killed on CUDA."""
    return eq.reason.startswith(CUDA_ONLY) and (
        record.status == "no tests" or record.status == "killed" and record.name in judged_on_cuda)


@dataclass(frozen=True)
class Baseline:
    """The last full run's test strength, of the scope it mutated (mutmut's only_mutate patterns)."""
    test_strength: float
    killed: int
    total: int
    commit: str
    date: str
    scope: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.test_strength:.2%} of {self.total:,} mutants of {', '.join(self.scope)} (commit {self.commit})"


def load_baseline(path: Path = BASELINE) -> Baseline | None:
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    if "scope" not in raw:
        raise ValueError(f"{path.name} names no scope: a baseline is the test strength of one scope")
    return Baseline(**{**raw, "scope": tuple(raw["scope"])})


def baseline_record(path: Path = BASELINE) -> dict | None:
    """The baseline as the reports record it (summary.json's `baseline`)."""
    baseline = load_baseline(path)
    return None if baseline is None else {**asdict(baseline), "scope": list(baseline.scope)}


def baseline_commit(path: Path = BASELINE) -> str:
    """The commit the baseline's full run measured: `--since baseline` retests what changed after it."""
    baseline = load_baseline(path)
    if baseline is None:
        raise ValueError(f"--since baseline: there is no {path.name} yet; run a full `specgate mutate "
                         f"--update-baseline` first")
    return baseline.commit


def ratchet(summary: dict, baseline: Baseline | None, complete: bool, stale: list[str],
            defer: bool = False, scope: tuple[str, ...] = SCOPE, rescoping: bool = False) -> list[str]:
    """Why this run fails, if it does: run failures, a wrong reviewed list, a full run's test
    strength under the baseline, or (on a --since run) a survivor nobody has explained. A shard
    (`defer`) fails only on the first two: its merge decides the rest. A baseline of another scope
    measured other mutants and cannot judge this run: a full run fails until the baseline is re-set
    for this scope (`rescoping`: this run re-sets it, with --update-baseline)."""
    problems = [f"{summary[s.replace(' ', '_')]} {s}" for s in RUN_FAILURES if summary[s.replace(" ", "_")]]
    problems += stale
    if defer:
        return problems
    strength = summary["test_strength"]
    if complete and baseline is not None and baseline.scope != tuple(scope):
        if not rescoping:
            problems.append(f"the baseline is of another scope ({baseline.describe()}); this run mutates "
                            f"{', '.join(scope)}: re-set it with --update-baseline on a full run of this scope")
    elif complete and baseline is not None and strength is not None and strength < baseline.test_strength - 1e-9:
        problems.append(f"test strength {strength:.2%} is under the baseline {baseline.test_strength:.2%}")
    if not complete and summary["survivors_unexplained"]:
        problems.append(f"{summary['survivors_unexplained']} survivors in the mutated functions are neither "
                        f"killed nor listed in {EQUIVALENTS.name}")
    return problems


def update_baseline(summary: dict, commit: str, path: Path = BASELINE, scope: tuple[str, ...] = SCOPE) -> str:
    """Raise the baseline to this full run's test strength; it never goes down within a scope. A
    run of another scope (one widened by new modules) re-sets it: a reviewed change, since the
    file is committed and names the scope it measured."""
    old = load_baseline(path)
    new = summary["test_strength"]
    same_scope = old is not None and old.scope == tuple(scope)
    if same_scope and new < old.test_strength - 1e-9:
        raise ValueError(f"test strength {new:.2%} is under the baseline {old.test_strength:.2%}; "
                         f"the baseline only rises")
    path.write_text(json.dumps({"test_strength": round(new, 6), "killed": summary["killed"],
                                "total": summary["total"], "commit": commit,
                                "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                                "scope": list(scope)}, indent=2) + "\n")
    if old is None:
        return f"baseline: test strength {new:.2%} (was none)"
    if same_scope:
        return f"baseline: test strength {new:.2%} (was {old.test_strength:.2%})"
    return f"baseline: re-set for scope {', '.join(scope)}: test strength {new:.2%} (was {old.describe()})"
