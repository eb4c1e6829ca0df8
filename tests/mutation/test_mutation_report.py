"""The report side of `specgate mutate` (mutants/mutation/report.py), on hand-built mutmut records:
counts and both scores by their formulas (a timeout is a run failure, never a kill), locating a
mutant in the original file (function and indented method), the Stryker report against our schema
(and a broken one against it: the negative control), the Markdown survivor list, and the files.
No mutmut run: the diffs are rendered the way mutmut renders them.
Over 300 lines because every check shares the sample sources and hand-built records at its top."""
import ast
import difflib
import json
import re
import textwrap
from pathlib import Path

import jsonschema
import pytest

from mutants.mutation.diff import locate, mutator_name
from mutants.mutation.record import STATUSES, MutantRecord
from mutants.mutation.report import markdown, score_line, stryker_report, summarise, write_reports

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "mutants" / "mutation"
                     / "mutation-testing-report.schema.json")
                    .read_text())

VERIFY = '''"""Sample verify."""
import torch


def greedy_verify(draft_ids, target_ids):
    """Longest-prefix match."""
    num_draft = draft_ids.shape[1]
    matches = draft_ids == target_ids[:, :num_draft]
    accepted = matches.cumprod(dim=1).sum(dim=1)
    return accepted
'''

RUNNER = '''class Other:
    def execute(self, plan):
        return "</script>"


class ModelRunner:
    def __init__(self, width):
        self.width = width

    def execute(self, plan):
        total = plan.tokens + self.width
        if plan.done is None:
            return total + 1
        return total + 1
'''
SOURCES = {"engine/verify.py": VERIFY, "engine/runner.py": RUNNER}

# The diff example mutmut prints (function text rendered at top level; @@ lines count from the def).
BRIEF_DIFF = """--- engine/verify.py
+++ engine/verify.py
@@ -3,4 +3,4 @@
     num_draft = draft_ids.shape[1]
-    matches = draft_ids == target_ids[:, :num_draft]
+    matches = draft_ids != target_ids[:, :num_draft]
     accepted = matches.cumprod(dim=1).sum(dim=1)
     return accepted"""


def function_text(source: str, function: str) -> str:
    """The function as mutmut renders it: a method dedented to top level."""
    *owner, name = function.split(".")
    scope = ast.parse(source).body
    if owner:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner[0]).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    return textwrap.dedent("\n".join(source.splitlines()[node.lineno - 1:node.end_lineno]))


def mutmut_diff(path: str, function: str, old: str, new: str, occurrence: int = 1) -> str:
    """mutmut's diff for replacing the occurrence-th line `old` of the function by `new`."""
    lines = function_text(SOURCES[path], function).split("\n")
    index = [i for i, line in enumerate(lines) if line.strip() == old][occurrence - 1]
    mutated = lines[:index] + [lines[index].replace(old, new)] + lines[index + 1:]
    return "\n".join(difflib.unified_diff(lines, mutated, fromfile=path, tofile=path, lineterm=""))


def record(n: int, function: str, status: str, old: str, new: str, occurrence: int = 1, **kw) -> MutantRecord:
    path = "engine/verify.py" if function == "greedy_verify" else "engine/runner.py"
    mangled = f"x_{function}" if "." not in function else "xǁ{}ǁ{}".format(*function.split("."))
    return MutantRecord(name=f"{path[:-3].replace('/', '.')}.{mangled}__mutmut_{n}", path=path, function=function,
                        status=status, diff=mutmut_diff(path, function, old, new, occurrence), **kw)


@pytest.fixture
def records() -> list[MutantRecord]:
    tests = ("tests/engine/test_verify.py::test_greedy", "tests/engine/test_verify.py::test_prefix[3]")
    return [
        MutantRecord("engine.verify.x_greedy_verify__mutmut_1", "engine/verify.py", "greedy_verify", "survived",
                     BRIEF_DIFF, covered_by=tests, seconds=1.5),
        record(2, "greedy_verify", "killed", "accepted = matches.cumprod(dim=1).sum(dim=1)",
               "accepted = matches.cumprod(dim=2).sum(dim=1)", covered_by=tests, seconds=0.25),
        record(3, "greedy_verify", "timeout", "accepted = matches.cumprod(dim=1).sum(dim=1)", "accepted = None",
               covered_by=tests, seconds=30.0),
        record(1, "ModelRunner.execute", "killed", "total = plan.tokens + self.width",
               "total = plan.tokens - self.width", covered_by=("tests/engine/test_engine.py::test_step",)),
        record(2, "ModelRunner.execute", "survived", "if plan.done is None:", "if plan.done is not None:",
               equivalent="both branches return total + 1"),
        record(3, "ModelRunner.execute", "no tests", "return total + 1", "return total - 1", occurrence=2),
        record(4, "ModelRunner.execute", "segfault", "return total + 1", "return total + 2", occurrence=1),
        record(1, "ModelRunner.__init__", "skipped", "self.width = width", "self.width = None"),
        record(1, "Other.execute", "caught by type check", 'return "</script>"', 'return "XX</script>XX"'),
    ]


def test_counts_and_both_scores_follow_their_formulas(records):
    s = summarise(records)
    assert {k: s[k.replace(" ", "_")] for k in STATUSES} == {
        "killed": 2, "survived": 2, "no tests": 1, "skipped": 1, "timeout": 1, "suspicious": 0, "segfault": 1,
        "caught by type check": 1, "not checked": 0, "check was interrupted by user": 0}
    assert s["total"] == 9
    assert s["test_strength"] == pytest.approx(2 / (9 - 1 - 1))
    assert s["mutation_score"] == pytest.approx(2 / 9)
    assert s["run_failures"] == 2  # the timeout and the segfault
    assert (s["survivors_unexplained"], s["survivors_equivalent"]) == (1, 1)


def test_a_timeout_is_a_run_failure_never_a_kill(records):
    timeouts = [r for r in records if r.status == "timeout"] * 3
    s = summarise(timeouts)
    assert (s["killed"], s["timeout"], s["run_failures"], s["test_strength"]) == (0, 3, 3, 0.0)
    report = stryker_report(timeouts, SOURCES)
    assert {m["status"] for f in report["files"].values() for m in f["mutants"]} == {"Timeout"}
    assert "not a kill" in report["files"]["engine/verify.py"]["mutants"][0]["statusReason"]


def test_no_mutants_and_unknown_statuses():
    s = summarise([])
    assert (s["total"], s["test_strength"], s["mutation_score"]) == (0, None, None)
    assert "n/a" in score_line(s)
    with pytest.raises(ValueError, match="unknown mutmut status"):
        summarise([MutantRecord("m", "engine/verify.py", "greedy_verify", "dead", BRIEF_DIFF)])


def line_of(source: str, text: str, occurrence: int = 1) -> int:
    return [i for i, line in enumerate(source.splitlines(), 1) if line.strip() == text][occurrence - 1]


def test_locate_a_function_mutant(records):
    line = line_of(VERIFY, "matches = draft_ids == target_ids[:, :num_draft]")
    column = VERIFY.splitlines()[line - 1].index("==") + 1
    assert locate(records[0], VERIFY) == (line, column, line, column + 2)  # end exclusive: "=="
    line = line_of(VERIFY, "accepted = matches.cumprod(dim=1).sum(dim=1)")
    column = VERIFY.splitlines()[line - 1].index("1") + 1
    assert locate(records[1], VERIFY) == (line, column, line, column + 1)


def test_locate_an_indented_method_mutant_past_a_same_named_method(records):
    line = line_of(RUNNER, "total = plan.tokens + self.width")
    column = RUNNER.splitlines()[line - 1].index("+") + 1
    assert column == 29  # the file's 8 columns of indentation count, not the dedented diff's 4
    assert locate(records[3], RUNNER) == (line, column, line, column + 1)
    # A repeated line: the hunk's position picks the second "return total + 1", not the first.
    second = line_of(RUNNER, "return total + 1", occurrence=2)
    assert locate(records[5], RUNNER)[0] == second
    assert locate(records[6], RUNNER)[0] == line_of(RUNNER, "return total + 1", occurrence=1)


def test_locate_falls_back_to_the_def_line_and_never_raises(records):
    def_line = line_of(RUNNER, "def execute(self, plan):", occurrence=2)  # ModelRunner's, not Other's
    for diff in ("", "garbage", "@@ -1 +1 @@\n-no such line\n+still none", "@@ -x @@\n-"):
        r = MutantRecord("m", "engine/runner.py", "ModelRunner.execute", "survived", diff)
        assert locate(r, RUNNER)[:2] == (def_line, 1)
    assert locate(records[3], "") == (1, 1, 1, 1)
    # No such def: the diff's line is looked for from the top; if it is not there either, line 1.
    assert locate(MutantRecord("m", "p.py", "gone", "killed", BRIEF_DIFF), VERIFY) == locate(records[0], VERIFY)
    assert locate(MutantRecord("m", "p.py", "gone", "killed", BRIEF_DIFF), RUNNER)[:2] == (1, 1)


@pytest.mark.parametrize("old, new, name", [
    ("a = b == c", "a = b != c", "EqualityOperator"),
    ("if a is None:", "if a is not None:", "EqualityOperator"),
    ("if a not in b:", "if a in b:", "EqualityOperator"),
    ("x = a and b", "x = a or b", "LogicalOperator"),
    ("x += 1", "x -= 1", "AssignmentOperator"),
    ("x += 1", "x = 1", "AssignmentOperator"),
    ("x = a + b", "x = a - b", "ArithmeticOperator"),
    ("x = f(a) * 2", "x = f(a) / 2", "ArithmeticOperator"),
    ("x = -a", "x = +a", "UnaryOperator"),
    ("if not a:", "if a:", "UnaryOperator"),
    ("x = f(a=True)", "x = f(a=False)", "BooleanLiteral"),
    ("y = a if c else b", "y = a if (c) and False else b", "ConditionalExpression"),
    ("x = compute(a)", "x = None", "AssignmentToNone"),
    ("x = f(a, b)", "x = f(None, b)", "ArgumentToNone"),
    ("x = f(a, key=b)", "x = f(a, key=None)", "ArgumentToNone"),
    ("x = f(a, b)", "x = f(b)", "ArgumentRemoved"),
    ("x = f(a, b)", "x = f(a)", "ArgumentRemoved"),
    ("x = 1.5", "x = 2.5", "NumericLiteral"),
    ("x = 'ab'", "x = 'XXabXX'", "StringLiteral"),
    ("x = s.lower()", "x = s.upper()", "MethodExpression"),
    ("break", "return", "ControlFlowKeyword"),
    ("x = lambda: a", "x = lambda: None", "Mutation"),
])
def test_mutator_names(old, new, name):
    diff = f"--- f.py\n+++ f.py\n@@ -1,2 +1,2 @@\n def f():\n-    {old}\n+    {new}"
    assert mutator_name(diff) == name


def test_replacement_at_the_location_makes_the_mutant(records):
    report = stryker_report(records, SOURCES)
    for r in records:
        mutant = next(m for m in report["files"][r.path]["mutants"] if m["id"] == r.name)
        start, end = mutant["location"]["start"], mutant["location"]["end"]
        assert start["line"] == end["line"]
        line = SOURCES[r.path].splitlines()[start["line"] - 1]
        mutated = line[:start["column"] - 1] + mutant["replacement"] + line[end["column"] - 1:]
        plus = next(d[1:] for d in r.diff.splitlines() if d.startswith("+") and not d.startswith("+++"))
        assert mutated.strip() == plus.strip(), r.name


def test_stryker_report_validates_and_maps_statuses(records):
    report = stryker_report(records, SOURCES, thresholds=(85, 70))
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft7Validator)
    assert (report["schemaVersion"], report["thresholds"], report["framework"]["name"]) == (
        "2", {"high": 85, "low": 70}, "mutmut")
    mutants = {m["id"]: m for f in report["files"].values() for m in f["mutants"]}
    status = {r.status: mutants[r.name]["status"] for r in records}
    assert status == {"killed": "Killed", "survived": "Survived", "timeout": "Timeout", "no tests": "NoCoverage",
                      "segfault": "RuntimeError", "skipped": "Ignored", "caught by type check": "CompileError"}
    equivalent = mutants["engine.runner.xǁModelRunnerǁexecute__mutmut_2"]
    assert (equivalent["status"], equivalent["statusReason"]) == (
        "Survived", "reviewed equivalent: both branches return total + 1")
    assert not any("killedBy" in m for m in mutants.values())  # mutmut does not say which test killed
    assert mutants["engine.verify.x_greedy_verify__mutmut_2"]["duration"] == 250
    test_ids = {t["id"] for f in report["testFiles"].values() for t in f["tests"]}
    assert {t for m in mutants.values() for t in m.get("coveredBy", [])} == test_ids
    node_of = {t["id"]: f"{path}::{t['name']}" for path, f in report["testFiles"].items() for t in f["tests"]}
    for r in records:  # short ids in coveredBy, resolved through testFiles to each mutant's own tests
        assert sorted(node_of[t] for t in mutants[r.name].get("coveredBy", [])) == sorted(r.covered_by)
    assert report["files"]["engine/runner.py"]["source"] == RUNNER
    assert (Path(report["projectRoot"]) / "mutants" / "mutation" / "report.py").is_file()


@pytest.mark.parametrize("break_it", [
    lambda m: m.update(status="Dead"),
    lambda m: m.pop("location"),
    lambda m: m["location"]["start"].update(column=0),
    lambda m: m.pop("mutatorName"),
])
def test_a_broken_report_fails_the_schema(records, break_it):
    report = stryker_report(records, SOURCES)
    break_it(report["files"]["engine/verify.py"]["mutants"][0])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft7Validator)


def test_a_report_without_thresholds_or_with_bad_ones_fails_the_schema(records):
    report = stryker_report(records, SOURCES)
    for broken in ({**report, "thresholds": {"high": 101, "low": 60}}, {k: v for k, v in report.items()
                                                                        if k != "thresholds"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, SCHEMA, cls=jsonschema.Draft7Validator)
    with pytest.raises(ValueError):
        stryker_report(records, SOURCES, thresholds=(50, 60))


def test_markdown_lists_every_survivor_and_run_failure_with_its_diff(records):
    s = summarise(records)
    md = markdown(records, s)
    assert md.startswith("# Mutation testing") and score_line(s) in md
    survivors = [r for r in records if r.status == "survived"]
    for r in survivors + [r for r in records if r.status in ("timeout", "segfault")]:
        assert f"`{r.name}`" in md and f"`{r.path}`, `{r.function}`" in md
        assert f"```diff\n{r.diff}\n```" in md
    assert "Reviewed equivalent: both branches return total + 1" in md
    unexplained, equivalent = (md.index(f"`{r.name}`") for r in survivors)
    assert unexplained < equivalent < md.index("## Run failures: 2")
    assert md.index("**segfault**") and "not a kill" in md
    assert markdown(list(reversed(records)), s) == md  # deterministic order
    assert "| killed | 2 |" in md and "| **total** | 9 |" in md


def test_write_reports_writes_every_file(records, tmp_path):
    extra = {"wall_seconds": 12.5, "mutants_per_minute": 43.2, "command": "specgate mutate", "commit": "d646cb4"}
    paths = write_reports(tmp_path / "report", records, SOURCES, extra)
    assert set(paths) == {"summary", "stryker", "markdown", "html", "records", "job_summary"} \
        and all(p.is_file() for p in paths.values())
    assert json.loads(paths["summary"].read_text()) == {**summarise(records), **extra}
    report = json.loads(paths["stryker"].read_text(encoding="utf-8"))
    assert report == stryker_report(records, SOURCES)
    jsonschema.validate(report, SCHEMA, cls=jsonschema.Draft7Validator)
    assert paths["markdown"].read_text(encoding="utf-8") == markdown(records, summarise(records))
    page = paths["html"].read_text(encoding="utf-8")
    assert "<mutation-test-report-app" in page and "<script src" not in page  # the viewer is inlined, not fetched
    assert "customElements.define" in page and "9 mutants: 2 killed" in page
    assert page.count("</script>") == 2  # the source's "</script>" string cannot end the inline script
    embedded = re.search(r"\.report = (.*);\n</script>", page).group(1)
    assert json.loads(embedded) == report
    with pytest.raises(ValueError, match="overwrite"):
        write_reports(tmp_path / "again", records, SOURCES, {"killed": 99})


def test_score_line_is_one_line_with_both_scores(records):
    line = score_line(summarise(records))
    assert line == ("mutation: test strength 28.6% (2 killed / 7), mutation score 22.2% of 9; "
                    "2 run failures; 1 unexplained survivors")
    assert "\n" not in line
