"""Reports of a mutmut run: counts and honest scores, a mutation-testing-elements ("Stryker", schema
v2) report with its viewer page, and a Markdown list of survivors and run failures. mutants/mutate.py
builds the MutantRecords from mutmut's cache and calls write_reports().

test strength = killed / (total - skipped - no tests); mutation score = killed / total. A timeout,
a suspicious run, a segfault, a mutant not checked or a check interrupted is a run failure to
investigate, never a kill. A survivor reviewed as equivalent still counts as a survivor.
"""
import json
import keyword
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

STATUSES = ("killed", "survived", "no tests", "skipped", "timeout", "suspicious", "segfault",
            "caught by type check", "not checked", "check was interrupted by user")
RUN_FAILURES = ("timeout", "suspicious", "segfault", "not checked", "check was interrupted by user")
STRYKER_STATUS = {"killed": "Killed", "survived": "Survived", "no tests": "NoCoverage", "timeout": "Timeout",
                  "suspicious": "RuntimeError", "segfault": "RuntimeError", "caught by type check": "CompileError",
                  "skipped": "Ignored", "not checked": "Pending", "check was interrupted by user": "Pending"}
REASONS = {"no tests": "no test exercises this function", "skipped": "skipped by mutmut",
           "caught by type check": "rejected by the type checker; no test ran",
           "timeout": "run failure: the tests ran past mutmut's timeout (not a kill)",
           "suspicious": "run failure: mutmut found the test run suspicious (not a kill)",
           "segfault": "run failure: the test process died on a signal (SIGSEGV, or SIGKILL e.g. out of memory)",
           "not checked": "run failure: the run ended before this mutant was checked",
           "check was interrupted by user": "run failure: the check was interrupted"}
VIEWER = "https://www.unpkg.com/mutation-testing-elements@3"  # any 3.x viewer reads schema v2
REPO = Path(__file__).resolve().parent.parent  # record paths are relative to it


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


def _checked(records: Iterable[MutantRecord]) -> list[MutantRecord]:
    records = list(records)
    if unknown := sorted({r.status for r in records} - set(STATUSES)):
        raise ValueError(f"unknown mutmut status {unknown}; expected one of {STATUSES}")
    return records


def summarise(records: Iterable[MutantRecord]) -> dict:
    records = _checked(records)
    counts = Counter(r.status for r in records)
    total, killed = len(records), counts["killed"]
    reachable = total - counts["skipped"] - counts["no tests"]
    equivalent = sum(1 for r in records if r.status == "survived" and r.equivalent)
    return {**{s.replace(" ", "_"): counts[s] for s in STATUSES}, "total": total,
            "test_strength": killed / reachable if reachable else None,
            "mutation_score": killed / total if total else None,
            "run_failures": sum(counts[s] for s in RUN_FAILURES),
            "survivors_equivalent": equivalent, "survivors_unexplained": counts["survived"] - equivalent}


_TOKEN = re.compile(r"""[rRbBuUfF]{0,2}('''|\"\"\"|'|")(?:\\.|(?!\1).)*?\1   # a string literal
    | \d[\w.]* | \w+ | \*\*=? | //=? | <<=? | >>=? | -> | := | [-+*/%@&|^<>=!]= | \S""", re.X | re.S)


@dataclass(frozen=True)
class _Edit:
    """A mutmut diff's change: its lines, and the tokens that differ between them."""
    lines: tuple[str, ...]      # the first run of '-' lines as the diff renders them (a method dedented)
    added: tuple[str, ...]      # the '+' lines right after them
    before: str | None          # the context line just before the change
    at: int                     # the change's line in mutmut's function text, 1-based
    old: list[str]              # the tokens that differ, before and after
    new: list[str]
    start: int                  # their span in "\n".join(lines), end exclusive
    end: int
    replacement: str            # the mutant's text for that span
    prev: str | None            # the unchanged tokens either side
    next: str | None
    depth: int                  # bracket depth where the change starts


def _edit(diff: str) -> _Edit | None:
    at, before, lines, added = None, None, [], []
    for line in diff.splitlines():
        if at is None:
            if m := re.match(r"@@ -(\d+)", line):
                at = int(m.group(1))
        elif line.startswith("-") and not added:
            lines.append(line[1:])
        elif line.startswith("+"):
            added.append(line[1:])
        elif lines or added:
            break
        elif not line.startswith("\\"):
            before, at = line[1:], at + 1
    if at is None or not (lines or added):
        return None
    a, b = "\n".join(lines), "\n".join(added)
    ta, tb = ([(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(t)] for t in (a, b))
    n, p, s = min(len(ta), len(tb)), 0, 0
    while p < n and ta[p][0] == tb[p][0]:
        p += 1
    while s < n - p and ta[-1 - s][0] == tb[-1 - s][0]:
        s += 1
    oa, ob = ta[p:len(ta) - s], tb[p:len(tb) - s]

    def span(toks: list, mid: list, text: str, extend: bool) -> tuple[int, int]:
        after = toks[len(toks) - s][1] if s else len(text)
        # An insertion or a deletion takes the blank up to the next token: "f(a, b)" -> "f(b)".
        return (mid[0][1], after if extend else mid[-1][2]) if mid else (after, after)
    (start, end), (new_start, new_end) = span(ta, oa, a, not ob), span(tb, ob, b, not oa)
    return _Edit(tuple(lines), tuple(added), before, at, [t for t, _, _ in oa], [t for t, _, _ in ob],
                 start, end, b[new_start:new_end], ta[p - 1][0] if p else None, ta[len(ta) - s][0] if s else None,
                 sum((t in "([{") - (t in ")]}") for t, _, _ in ta[:p]))


_COMPARE = {"==", "!=", "<", "<=", ">", ">="}
_ARITH = {"+", "-", "*", "/", "//", "%", "**", "@", "<<", ">>", "&", "|", "^"}


def _operand(token: str | None) -> bool:
    """Whether token can end an operand, so that an operator after it is binary."""
    return bool(token) and (token[-1] in ")]}'\"_" or token[-1].isalnum()) \
        and (not keyword.iskeyword(token) or token in ("True", "False", "None"))


def mutator_name(diff: str) -> str:
    """A short name for the kind of change, from the tokens that differ; the first rule that matches:

    | tokens that differ (old -> new)                                    | name                  |
    |--------------------------------------------------------------------|-----------------------|
    | == != < <= > >= for another; `not` added or removed at `is`/`in`   | EqualityOperator      |
    | `and` <-> `or`                                                     | LogicalOperator       |
    | an augmented assignment (`+=`, ...) -> another one or `=`          | AssignmentOperator    |
    | + - * / // % ** @ << >> & | ^ for another, after an operand       | ArithmeticOperator    |
    | the same with no operand before (unary); `not` or `~` removed      | UnaryOperator         |
    | `True` <-> `False`                                                 | BooleanLiteral        |
    | `and False` / `or True` appended to a condition                    | ConditionalExpression |
    | anything -> `None` right after a statement's `=`                   | AssignmentToNone      |
    | anything -> `None` after `(`, `,`, a keyword's `=`, or a line start| ArgumentToNone        |
    | tokens removed with a `,` or after `(`/`,`/a line start (no `case`)| ArgumentRemoved       |
    | a number for a number                                              | NumericLiteral        |
    | a string literal on either side                                    | StringLiteral         |
    | a called name for another (`.lower(` -> `.upper(`)                 | MethodExpression      |
    | break / continue / return for another                              | ControlFlowKeyword    |
    | anything else                                                      | Mutation              |
    """
    if (e := _edit(diff)) is None:
        return "Mutation"
    old, new = e.old, e.new
    pair = {*old, *new} if len(old) == len(new) == 1 else set()
    rules = (
        ("EqualityOperator", (pair and pair <= _COMPARE)
         or (sorted((old, new)) == [[], ["not"]] and (e.prev == "is" or e.next == "in"))),
        ("LogicalOperator", pair == {"and", "or"}),
        ("AssignmentOperator", pair and old[0] != "=" and all(t[-1] == "=" and t[:-1] in _ARITH | {""} for t in pair)),
        ("ArithmeticOperator", pair and pair <= _ARITH and _operand(e.prev)),
        ("UnaryOperator", (pair and pair <= _ARITH) or (old in (["not"], ["~"]) and not new)),
        ("BooleanLiteral", pair == {"True", "False"}),
        ("ConditionalExpression", new[-2:] in (["and", "False"], ["or", "True"])),
        ("AssignmentToNone", new == ["None"] and e.prev in ("=", ":=") and e.depth == 0),
        ("ArgumentToNone", new == ["None"] and e.prev in ("(", ",", "=", None)),
        ("ArgumentRemoved", old and not new and old[0] != "case" and ("," in old or e.prev in ("(", ",", None))),
        ("NumericLiteral", pair and all(t[0].isdigit() for t in pair)),
        ("StringLiteral", any(re.match(r"[rRbBuUfF]{0,2}['\"]", t) for t in old + new)),
        ("MethodExpression", pair and all(t.isidentifier() for t in pair) and e.next == "("),
        ("ControlFlowKeyword", pair and pair <= {"break", "continue", "return"}),
    )
    return next((name for name, hit in rules if hit), "Mutation")


def _def_line(function: str, lines: list[str]) -> int:
    """1-based line of the function's def (a method's after its class), 1 if there is none."""
    *owner, name = function.split(".")
    pattern = re.compile(rf"\s*(async\s+)?def\s+{re.escape(name)}\s*\(")
    owner_line = re.compile(rf"\s*class\s+{re.escape(owner[-1])}\b") if owner else None
    start = next((i for i, line in enumerate(lines) if owner_line and owner_line.match(line)), 0)
    found = (i + 1 for first in (start, 0) for i in range(first, len(lines)) if pattern.match(lines[i]))
    return next(found, 1)


def _place(record: MutantRecord, source: str) -> tuple[tuple[int, int, int, int], str | None]:
    """locate(), and the mutant's text for the located span."""
    lines = source.splitlines()
    def_line = _def_line(record.function, lines)
    fallback = (def_line, 1, def_line, len(lines[def_line - 1]) + 1 if lines else 1)
    indent = lambda line: len(line) - len(line.lstrip())  # noqa: E731
    try:
        e = _edit(record.diff)
        block = (e.lines or ((e.before,) if e.before is not None else ())) if e else ()
        want = [line.strip() for line in block]
        starts = [i for i in range(def_line, len(lines) - len(block) + 2)
                  if want and [lines[i - 1 + k].strip() for k in range(len(block))] == want]
        if not starts:
            return fallback, None
        # The @@ header counts from the function text's first line (its def, unless decorated),
        # so among repeated lines the one nearest that hint is meant.
        first = min(starts, key=lambda i: (abs(i - (def_line + e.at - 1 - (not e.lines))), i))
        if not e.lines:  # a pure insertion: point at the line it follows
            line = lines[first - 1]
            return (first, indent(line) + 1, first, len(line.rstrip()) + 1), "\n".join(s.strip() for s in e.added)
        text = "\n".join(e.lines)

        def position(offset: int) -> tuple[int, int]:
            k, column = text.count("\n", 0, offset), offset - text.rfind("\n", 0, offset) - 1
            # mutmut renders a method dedented; the file's own indentation decides the column.
            return first + k, max(1, column + indent(lines[first - 1 + k]) - indent(e.lines[k]) + 1)
        return (*position(e.start), *position(e.end)), e.replacement
    except Exception:  # one odd diff must not cost the whole report; the def line still points the way
        return fallback, None


def locate(record: MutantRecord, source: str) -> tuple[int, int, int, int]:
    """(start_line, start_column, end_line, end_column) of the mutated text in the original file:
    1-based, end exclusive as in the Stryker schema. The def line, column 1, when the diff cannot be
    placed. Never raises."""
    return _place(record, source)[0]


def _order(record: MutantRecord) -> tuple:
    number = re.search(r"(\d+)$", record.name)
    return record.path, record.function, int(number.group(1)) if number else -1, record.name


def stryker_report(records: Iterable[MutantRecord], sources: dict[str, str],
                   thresholds: tuple[int, int] = (80, 60)) -> dict:
    """The run as a mutation-testing-elements report (mutants/mutation-testing-report.schema.json)."""
    high, low = thresholds
    if not 0 <= low <= high <= 100:
        raise ValueError(f"thresholds must be 0 <= low <= high <= 100, got high={high}, low={low}")
    files: dict[str, dict] = {}
    checked = sorted(_checked(records), key=_order)
    # Short test ids, which testFiles resolves to names: a full run's mutants cover hundreds of
    # tests each, and their node ids spelled out on every mutant made a 30 MB report.
    test_ids = {node: str(i) for i, node in enumerate(sorted({n for r in checked for n in r.covered_by}))}
    for r in checked:
        source = sources.get(r.path, "")
        (l1, c1, l2, c2), replacement = _place(r, source)
        mutant = {"id": r.name, "mutatorName": mutator_name(r.diff), "status": STRYKER_STATUS[r.status],
                  "location": {"start": {"line": l1, "column": c1}, "end": {"line": l2, "column": c2}}}
        if replacement is not None:
            mutant["replacement"] = replacement
        equivalent = r.status == "survived" and r.equivalent
        if reason := f"reviewed equivalent: {r.equivalent}" if equivalent else REASONS.get(r.status):
            mutant["statusReason"] = reason
        if r.covered_by:  # no killedBy: mutmut does not record which test killed a mutant
            mutant["coveredBy"] = [test_ids[node] for node in r.covered_by]
        if r.seconds is not None:
            mutant["duration"] = round(r.seconds * 1000, 3)
        files.setdefault(r.path, {"language": "python", "source": source, "mutants": []})["mutants"].append(mutant)
    try:
        framework = {"name": "mutmut", "version": metadata.version("mutmut")}
    except metadata.PackageNotFoundError:
        framework = {"name": "mutmut"}
    report = {"schemaVersion": "2", "thresholds": {"high": high, "low": low}, "projectRoot": str(REPO),
              "framework": framework, "files": files}
    test_files: dict[str, dict] = {}
    for node, test_id in test_ids.items():
        path, _, name = node.partition("::")
        test_files.setdefault(path, {"tests": []})["tests"].append({"id": test_id, "name": name or node})
    if test_files:
        report["testFiles"] = test_files
    return report


def _pct(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"


def score_line(summary: dict) -> str:
    reachable = summary["total"] - summary["skipped"] - summary["no_tests"]
    return (f"mutation: test strength {_pct(summary['test_strength'])} ({summary['killed']} killed / {reachable}), "
            f"mutation score {_pct(summary['mutation_score'])} of {summary['total']}; "
            f"{summary['run_failures']} run failures; {summary['survivors_unexplained']} unexplained survivors")


def _entry(r: MutantRecord, note: str | None) -> list[str]:
    fence = "`" * max(3, 1 + max(map(len, re.findall(r"`+", r.diff)), default=0))
    more = len(r.covered_by) - 5
    tests = ", ".join(f"`{t}`" for t in r.covered_by[:5]) + (f" and {more} more" if more > 0 else "")
    return [f"### `{r.name}`", "", f"`{r.path}`, `{r.function}`: {mutator_name(r.diff)}", "",
            *([note, ""] if note else []), *([f"Covered by {tests}.", ""] if tests else []),
            f"{fence}diff", r.diff.rstrip("\n"), fence, ""]


def markdown(records: Iterable[MutantRecord], summary: dict) -> str:
    records = sorted(_checked(records), key=_order)
    unexplained = [r for r in records if r.status == "survived" and not r.equivalent]
    equivalent = [r for r in records if r.status == "survived" and r.equivalent]
    failures = [r for r in records if r.status in RUN_FAILURES]
    out = ["# Mutation testing", "", f"**{score_line(summary)}**", "", "| status | mutants |", "|---|---:|",
           *(f"| {s} | {summary[s.replace(' ', '_')]} |" for s in STATUSES), f"| **total** | {summary['total']} |", "",
           f"## Survivors: {len(unexplained)} unexplained, {len(equivalent)} reviewed equivalent", ""]
    out += [line for r in unexplained for line in _entry(r, None)]
    out += [line for r in equivalent for line in _entry(r, f"Reviewed equivalent: {r.equivalent}")]
    out += [f"## Run failures: {len(failures)}", "", *([] if failures else ["None.", ""])]
    out += [line for r in failures for line in _entry(r, f"**{r.status}**: {REASONS[r.status]}")]
    return "\n".join(out).rstrip("\n") + "\n"


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specgate mutation report</title>
<!-- The viewer is loaded from a CDN: open this page with network access. The report is embedded below. -->
<script defer src="{viewer}"></script></head>
<body><mutation-test-report-app title-postfix="specgate"></mutation-test-report-app>
<script>
document.querySelector("mutation-test-report-app").report = {report};
</script>
</body></html>
"""


def write_reports(report_dir: Path | str, records: Iterable[MutantRecord], sources: dict[str, str],
                  extra: dict, *, thresholds: tuple[int, int] = (80, 60)) -> dict[str, Path]:
    """Write summary.json, mutation-report.json, survivors.md and mutation-report.html; their paths by kind."""
    records = _checked(records)
    summary = summarise(records)
    if clash := sorted(set(extra) & set(summary)):
        raise ValueError(f"extra would overwrite summary fields {clash}")
    report = stryker_report(records, sources, thresholds)
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out / "summary.json", "stryker": out / "mutation-report.json",
             "markdown": out / "survivors.md", "html": out / "mutation-report.html"}
    paths["summary"].write_text(json.dumps({**summary, **extra}, indent=2) + "\n", encoding="utf-8")
    paths["stryker"].write_text(json.dumps(report, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(records, summary), encoding="utf-8")
    embedded = json.dumps(report).replace("<", "\\u003c")  # no source text can close the <script> early
    paths["html"].write_text(_HTML.format(viewer=VIEWER, report=embedded), encoding="utf-8")
    return paths
