"""A gate's verdict from the outcomes of its tests, and the report's JSON and JUnit forms.

Statuses: green, red, skipped (with the reason), error. A gate is red when a check failed,
when it ran zero cases, or when something it claims to cover never occurred; it is an error
when it could not decide (an exception that is not a failed check, a broken fixture, a module
that does not import); it is skipped only when every test skipped, and a gate that needs CUDA
is never green on a machine without it.
"""
import xml.etree.ElementTree as ET
from collections.abc import Collection

GREEN, RED, SKIPPED, ERROR = "green", "red", "skipped", "error"
# Per test: passed, failed (a check said no), error (it could not run to a decision), skipped.
PASSED, FAILED = "passed", "failed"


def verdict(needs: str, tests: list[dict], claims: tuple[str, ...], seen: set[str],
            collect_error: str | None, has_cuda: bool, waived: Collection[str] = ()) -> tuple[str, str]:
    """(status, reason) of one gate; `tests` as gathered by the plugin (outcome, message, cases);
    `waived`: claims about a drafter the gates skip on this target (the report gives the reason)."""
    failed = [t for t in tests if t["outcome"] == FAILED]
    errors = [t for t in tests if t["outcome"] == ERROR]
    skipped = [t for t in tests if t["outcome"] == SKIPPED]
    num_cases = sum(len(t["cases"]) for t in tests)
    if failed:
        return RED, f"{len(failed)} of {len(tests)} tests failed: {_first_line(failed[0]['message'])}"
    if collect_error:
        return ERROR, f"the gate module did not load: {_first_line(collect_error)}"
    if errors:
        return ERROR, f"{len(errors)} of {len(tests)} tests could not run: {_first_line(errors[0]['message'])}"
    if tests and len(skipped) == len(tests):
        return SKIPPED, _first_line(skipped[0]["message"]) or "skipped"
    if needs == "cuda" and not has_cuda:
        return SKIPPED, "needs CUDA, and this machine has none"
    if num_cases == 0:
        return RED, "ran zero cases"
    missing = [c for c in claims if c not in seen and c not in waived]
    if missing:
        return RED, f"claimed but never occurred: {', '.join(missing)}"
    return GREEN, f"{num_cases} cases"


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def summary(gates: list[dict]) -> dict:
    counts = {s: 0 for s in (GREEN, RED, SKIPPED, ERROR)}
    for g in gates:
        counts[g["status"]] += 1
    return counts


def exit_status(gates: list[dict]) -> int:
    """Non-zero when any gate is red or errored, or when nothing was run."""
    return 1 if not gates or any(g["status"] in (RED, ERROR) for g in gates) else 0


def table(gates: list[dict]) -> str:
    lines = [f"{'gate':<16} {'status':<8} {'cases':>6} {'seconds':>8}  reason"]
    for g in gates:
        lines.append(f"{g['name']:<16} {g['status']:<8} {g['num_cases']:>6} {g['seconds']:>8.1f}  {g['reason']}")
    return "\n".join(lines)


def junit(report: dict) -> ET.ElementTree:
    """One <testsuite> per gate: a <testcase> per test, then one 'verdict' testcase that carries
    the gate's own status, so a gate red for zero cases or an uncovered claim shows as failed."""
    root = ET.Element("testsuites", name="specgate-gates")
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    for g in report["gates"]:
        suite = ET.SubElement(root, "testsuite", name=g["name"])
        props = ET.SubElement(suite, "properties")
        for key in ("purpose", "needs", "status", "num_cases"):
            ET.SubElement(props, "property", name=key, value=str(g[key]))
        ET.SubElement(props, "property", name="proven_against", value=",".join(g["proven_against"]))
        counts = dict(tests=0, failures=0, errors=0, skipped=0)
        for t in g["tests"]:
            _testcase(suite, g["name"], t["nodeid"].split("::", 1)[-1], t["outcome"], t["message"],
                      t["seconds"], counts)
        _testcase(suite, g["name"], "verdict", {GREEN: PASSED, RED: FAILED}.get(g["status"], g["status"]),
                  g["reason"], g["seconds"], counts)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{g['seconds']:.3f}")
    for key, value in totals.items():
        root.set(key, str(value))
    return ET.ElementTree(root)


def _testcase(suite, gate: str, name: str, outcome: str, message: str | None, seconds: float, counts) -> None:
    case = ET.SubElement(suite, "testcase", classname=f"gates.{gate}", name=name, time=f"{seconds:.3f}")
    counts["tests"] += 1
    tag = {FAILED: "failure", ERROR: "error", SKIPPED: "skipped"}.get(outcome)
    if tag:
        counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[tag]] += 1
        node = ET.SubElement(case, tag, message=_first_line(message))
        node.text = message or ""
