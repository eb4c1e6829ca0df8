"""The mutation run's summary where a reviewer looks (mutants/mutation/job_summary.py): the score,
the ratchet's decision and each problem, a row per module, and every unexplained survivor, in
the Markdown the CI merge job appends to its job summary, written by every run."""
from mutants.mutation.job_summary import markdown, module_rows
from mutants.mutation.record import MutantRecord
from mutants.mutation.report import summarise, write_reports

DIFF = "--- engine/a.py\n+++ engine/a.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"


def rec(path: str, i: int, status: str, equivalent: str | None = None) -> MutantRecord:
    module = path.removesuffix(".py").replace("/", ".")
    return MutantRecord(f"{module}.x_f__mutmut_{i}", path, "f", status, DIFF, equivalent=equivalent)


RECORDS = [rec("engine/a.py", 1, "killed"), rec("engine/a.py", 2, "survived"), rec("engine/a.py", 3, "no tests"),
           rec("gates/compare.py", 1, "killed"), rec("gates/compare.py", 2, "survived", "same value"),
           rec("gates/compare.py", 3, "timeout")]


def test_a_row_per_module_counts_each_verdict_and_its_test_strength():
    assert module_rows(RECORDS) == [
        {"module": "engine/a.py", "mutants": 3, "killed": 1, "unexplained": 1, "equivalent": 0, "no tests": 1,
         "run failures": 0, "strength": 0.5},
        {"module": "gates/compare.py", "mutants": 3, "killed": 1, "unexplained": 0, "equivalent": 1, "no tests": 0,
         "run failures": 1, "strength": 1 / 3}]


def test_a_failing_run_says_fail_with_each_problem_and_names_each_unexplained_survivor():
    extra = {"problems": ["1 timeout", "test strength 33.3% is under the baseline 97.00%"], "complete": True,
             "baseline": {"test_strength": 0.97, "commit": "ccdcb6d"}, "command": "specgate mutate merge a b",
             "commit": "abc1234", "shards": "16 of 16"}
    md = markdown(RECORDS, summarise(RECORDS), extra)
    assert md.startswith("## Mutation testing: FAIL (2 problems)\n")
    assert "`specgate mutate merge a b` at abc1234, 16 of 16 shards\n" in md
    assert "| test strength | 40.0% (2 killed) |" in md and "| baseline test strength | 97.0% (commit ccdcb6d) |" in md
    assert "- 1 timeout\n- test strength 33.3% is under the baseline 97.00%\n" in md
    assert "| `engine/a.py` | 3 | 1 | 1 | 0 | 1 | 0 | 50.0% |" in md
    assert "### Unexplained survivors: 1\n\n- `engine.a.x_f__mutmut_2` (`engine/a.py`, `f`)" in md
    assert "gates.compare.x_f__mutmut_2" not in md  # a reviewed equivalent is not unexplained


def test_a_passing_run_says_pass_and_every_run_writes_the_page(tmp_path):
    records = [r for r in RECORDS if r.status == "killed"]
    paths = write_reports(tmp_path, records, {}, {"problems": [], "complete": True, "command": "specgate mutate"})
    md = paths["job_summary"].read_text()
    assert md.startswith("## Mutation testing: PASS\n") and "### Unexplained survivors: 0\n\nNone." in md
    assert "Passed: nothing under the baseline" in md
    assert '<section id="job-summary"><h2>Mutation testing: PASS</h2>' in paths["html"].read_text()
