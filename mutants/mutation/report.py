"""Reports of a mutmut run: counts and honest scores, a mutation-testing-elements ("Stryker", schema
v2) report with its viewer page, and a Markdown list of survivors and run failures.
mutants/mutation/results.py builds the MutantRecords from mutmut's cache, mutants/mutation/mutate.py calls
write_reports(), and mutants/mutation/diff.py reads each mutant's diff (its mutator, its place).

test strength = killed / (total - skipped - no tests); mutation score = killed / total. A timeout,
a suspicious run, a segfault, a mutant not checked or a check interrupted is a run failure to
investigate, never a kill. A survivor reviewed as equivalent still counts as a survivor.
"""
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from mutants.mutation import job_summary, viewer
from mutants.mutation.diff import mutator_name, place
from mutants.mutation.record import RUN_FAILURES, STATUSES, MutantRecord

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
REPO = Path(__file__).resolve().parents[2]  # record paths are relative to it


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
            "survivors_equivalent": equivalent, "survivors_unexplained": counts["survived"] - equivalent,
            "reviewed_not_rerun": sum(1 for r in records if r.not_rerun)}


def _order(record: MutantRecord) -> tuple:
    number = re.search(r"(\d+)$", record.name)
    return record.path, record.function, int(number.group(1)) if number else -1, record.name


def stryker_report(records: Iterable[MutantRecord], sources: dict[str, str],
                   thresholds: tuple[int, int] = (80, 60)) -> dict:
    """The run as a mutation-testing-elements report (mutants/mutation/mutation-testing-report.schema.json)."""
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
        (l1, c1, l2, c2), replacement = place(r, source)
        mutant = {"id": r.name, "mutatorName": mutator_name(r.diff), "status": STRYKER_STATUS[r.status],
                  "location": {"start": {"line": l1, "column": c1}, "end": {"line": l2, "column": c2}}}
        if replacement is not None:
            mutant["replacement"] = replacement
        equivalent = r.status == "survived" and r.equivalent
        not_rerun = " (reviewed, not re-run: its function is unchanged since the review)" if r.not_rerun else ""
        if reason := f"reviewed equivalent{not_rerun}: {r.equivalent}" if equivalent else REASONS.get(r.status):
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
            f"{summary['run_failures']} run failures; {summary['survivors_unexplained']} unexplained survivors"
            + (f"; {summary['reviewed_not_rerun']} reviewed, not re-run" if summary.get("reviewed_not_rerun") else ""))


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
    for r in equivalent:
        note = ("Reviewed, not re-run (function unchanged). " if r.not_rerun else "") + \
            f"Reviewed equivalent: {r.equivalent}"
        out += _entry(r, note)
    out += [f"## Run failures: {len(failures)}", "", *([] if failures else ["None.", ""])]
    out += [line for r in failures for line in _entry(r, f"**{r.status}**: {REASONS[r.status]}")]
    return "\n".join(out).rstrip("\n") + "\n"


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specgate mutation report</title>
<!-- Self-contained: the viewer ({package}) is inlined below and the report embedded; no network. -->
<style>#specgate-summary {{ font: 14px system-ui, sans-serif; margin: 8px 16px; }}</style></head>
<body><p id="specgate-summary">{summary}</p>
{job_summary}
<mutation-test-report-app title-postfix="specgate"></mutation-test-report-app>
<script>{viewer}</script>
<script>
document.querySelector("mutation-test-report-app").report = {report};
</script>
</body></html>
"""


def html(report: dict, summary: dict, job_summary_html: str = "") -> str:
    """The viewer page: the pinned viewer inlined (mutants/mutation/viewer.py), the report embedded, the
    job summary's block above it. Without npm the page still opens, with the counts, the summary and a
    line saying why the viewer is missing."""
    import html as escape
    line = (f"{summary['total']} mutants: " + ", ".join(f"{summary[s.replace(' ', '_')]} {s}" for s in STATUSES
                                                        if summary[s.replace(' ', '_')]) + f". {score_line(summary)}")
    try:
        script = viewer.inline_script()
    except viewer.ViewerUnavailable as e:
        script, line = "", line + f" (The viewer could not be vendored: {e}; mutation-report.json holds every mutant.)"
    embedded = json.dumps(report).replace("<", "\\u003c")  # no source text can close the <script> early
    return _HTML.format(package=f"{viewer.PACKAGE}@{viewer.VERSION}", summary=escape.escape(line),
                        job_summary=job_summary_html, viewer=script, report=embedded)


def write_reports(report_dir: Path | str, records: Iterable[MutantRecord], sources: dict[str, str],
                  extra: dict, *, thresholds: tuple[int, int] = (80, 60)) -> dict[str, Path]:
    """Write summary.json, mutation-report.json, survivors.md, job-summary.md and mutation-report.html;
    their paths by kind."""
    records = _checked(records)
    summary = summarise(records)
    if clash := sorted(set(extra) & set(summary)):
        raise ValueError(f"extra would overwrite summary fields {clash}")
    report = stryker_report(records, sources, thresholds)
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"summary": out / "summary.json", "stryker": out / "mutation-report.json",
             "markdown": out / "survivors.md", "html": out / "mutation-report.html", "records": out / "records.json",
             "job_summary": out / "job-summary.md"}
    # every record as read, for `specgate mutate merge`
    paths["records"].write_text(json.dumps([asdict(r) for r in records], ensure_ascii=False) + "\n",
                                encoding="utf-8")
    paths["summary"].write_text(json.dumps({**summary, **extra}, indent=2) + "\n", encoding="utf-8")
    paths["stryker"].write_text(json.dumps(report, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(records, summary), encoding="utf-8")
    paths["job_summary"].write_text(job_summary.markdown(records, summary, extra), encoding="utf-8")
    paths["html"].write_text(html(report, summary, job_summary.html(records, summary, extra)), encoding="utf-8")
    return paths
