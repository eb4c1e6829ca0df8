"""One mutant's verdict, as every part of a mutation run passes it on: mutants/mutation/results.py
reads them from mutmut's cache, report.py scores and renders them, diff.py locates their change."""
from dataclasses import dataclass

STATUSES = ("killed", "survived", "no tests", "skipped", "timeout", "suspicious", "segfault",
            "caught by type check", "not checked", "check was interrupted by user")
RUN_FAILURES = ("timeout", "suspicious", "segfault", "not checked", "check was interrupted by user")


@dataclass(frozen=True)
class MutantRecord:
    name: str          # mutmut's mutant name, e.g. "engine.verify.x_greedy_verify__mutmut_3"
    path: str          # source file relative to the repo root, e.g. "engine/verify.py"
    function: str      # "greedy_verify" or "ModelRunner.execute"
    status: str        # one of STATUSES
    diff: str          # mutmut's unified diff of the function, original -> mutant
    covered_by: tuple[str, ...] = ()   # pytest node ids that exercise the function
    seconds: float | None = None       # how long its test run took
    equivalent: str | None = None      # one-line reason when a reviewed list marks this survivor equivalent
    not_rerun: bool = False            # reviewed on this very function: its verdict is the review's, not re-run
