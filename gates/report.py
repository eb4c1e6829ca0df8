"""A gate's status from the outcomes of its tests; the report's types (`GateReport`, one
`GateResult` per gate, one `TestRecord` per test) with their JSON form, and its JUnit form.
The plugin writes a GateReport per pytest process, `gates run` joins them into one, and the veto's
verdict (gates/verdict.py) and the proof (mutants/proof/) read it back with `GateReport.from_json`.

Statuses: green, red, skipped (with the reason), error. A gate is red when a check failed,
when it ran zero cases, or when something it claims to cover never occurred; it is an error
when it could not decide (an exception that is not a failed check, a broken fixture, a module
that does not import); it is skipped only when every test skipped, and a gate that needs CUDA
is never green on a machine without it.
"""
import xml.etree.ElementTree as ET
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, fields

GREEN, RED, SKIPPED, ERROR = "green", "red", "skipped", "error"
# Per test: passed, failed (a check said no), error (it could not run to a decision), skipped.
PASSED, FAILED = "passed", "failed"
SCHEMA = "specgate-gates/1"


@dataclass
class TestRecord:
    """One pytest test of a gate, as the report keeps it."""
    nodeid: str
    outcome: str                # PASSED, FAILED, ERROR or SKIPPED
    message: str | None = None
    seconds: float = 0.0
    cases: int = 0              # cases it recorded


@dataclass
class GateResult:
    """One gate's result: its status and why, what it ran (cases, tests, claims), what it found."""
    name: str
    purpose: str = ""
    needs: str = "cpu"          # "cpu" or "cuda"
    proven_against: list[str] = field(default_factory=list)   # defects the proof turns it red on
    module: str = ""
    status: str = ERROR
    reason: str = ""
    num_cases: int = 0
    cases: list[dict] = field(default_factory=list)           # each case's parameters, by test
    evidence: list[dict] = field(default_factory=list)        # a red or errored test's differences
    measurements: list[dict] = field(default_factory=list)    # figures a timing gate recorded
    claims: dict[str, bool] = field(default_factory=dict)     # claim -> whether it occurred
    waived_claims: dict[str, str] = field(default_factory=dict)  # claim -> why it is not demanded here
    forwards: list[str] = field(default_factory=list)         # forwards its engines ran: reference, compiled
    attention_backends: list[str] = field(default_factory=list)  # EngineConfig.attention_backend its engines ran
    # Model folders of its own its engines ran on, not the session's target (the environment's
    # `model`): each one's name, folder and shape keys (gates/provenance.py's model_shape), as the
    # depth gate records its deep folder. Empty: it ran the session's target.
    models: list[dict] = field(default_factory=list)
    tests: list[TestRecord] = field(default_factory=list)
    seconds: float = 0.0
    coverage: dict | None = None  # `gates run --coverage`: this gate's reach (gates/reach.py)

    @classmethod
    def from_json(cls, data: dict) -> "GateResult":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"gate result {data.get('name')!r}: unknown keys {unknown}")
        return cls(**{**data, "tests": [TestRecord(**t) for t in data.get("tests", [])]})

    def to_json(self) -> dict:
        out = asdict(self)
        if out["coverage"] is None:
            del out["coverage"]
        return out


@dataclass
class GateReport:
    """What `gates run` (or one of its pytest processes) reports."""
    gates: list[GateResult]
    environment: dict = field(default_factory=dict)  # device, torch, CUDA, model folders (gates/plugin.py)
    schema: str = SCHEMA
    command: str = ""
    started: float = 0.0
    seconds: float = 0.0
    jobs: int = 1
    pytest_exit_status: int = 0
    reach: dict | None = None   # `gates run --coverage`: the request-path branches no gate takes

    @property
    def summary(self) -> dict[str, int]:
        return summary(self.gates)

    @property
    def judged_target(self) -> bool:
        """Whether one of its gates ran on the session's target (the environment's `model`): a gate
        whose result names model folders of its own (`models`: depth's deep folder) judged those
        instead, no model the verdict's per-model rule speaks for (gates/verdict.py)."""
        return any(not g.models for g in self.gates)

    @property
    def gate_models(self) -> dict[str, list[dict]]:
        """Gate -> the model folders of its own it ran on, for each gate that names some."""
        return {g.name: g.models for g in self.gates if g.models}

    @property
    def exit_status(self) -> int:
        """Non-zero when a gate is red or errored, nothing ran, or (with --coverage) a request-path
        branch no gate takes is neither reviewed nor gone."""
        unreached = bool(self.reach and self.reach.get("judged")
                         and (self.reach.get("unreviewed") or self.reach.get("stale")))
        return 1 if unreached else exit_status(self.gates)

    def to_json(self) -> dict:
        out = {"schema": self.schema, "command": self.command, "started": self.started, "seconds": self.seconds,
               "jobs": self.jobs, "environment": self.environment, "pytest_exit_status": self.pytest_exit_status,
               "summary": self.summary, "exit_status": self.exit_status,
               "gates": [g.to_json() for g in self.gates]}
        if self.reach is not None:
            out["reach"] = self.reach
        return out

    @classmethod
    def from_json(cls, data: dict) -> "GateReport":
        """A report's JSON (summary and exit_status are derived, and checked against the gates)."""
        if data.get("schema", SCHEMA) != SCHEMA:
            raise ValueError(f"not a specgate gate report (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        gates = [GateResult.from_json(g) for g in data.get("gates", [])]
        report = cls(gates, **{k: data[k] for k in ("environment", "command", "started", "seconds", "jobs",
                                                     "pytest_exit_status", "reach") if k in data})
        for derived in ("summary", "exit_status"):
            if derived in data and data[derived] != getattr(report, derived):
                raise ValueError(f"gate report: its {derived} {data[derived]!r} disagrees with its gates "
                                 f"({getattr(report, derived)!r}); was it edited by hand?")
        return report


def gate_status(needs: str, tests: list[dict], claims: tuple[str, ...], seen: set[str],
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


def summary(gates: list[GateResult]) -> dict[str, int]:
    counts = {s: 0 for s in (GREEN, RED, SKIPPED, ERROR)}
    for g in gates:
        counts[g.status] += 1
    return counts


def exit_status(gates: list[GateResult]) -> int:
    """Non-zero when any gate is red or errored, or when nothing was run."""
    return 1 if not gates or any(g.status in (RED, ERROR) for g in gates) else 0


def table(gates: list[GateResult]) -> str:
    lines = [f"{'gate':<16} {'status':<8} {'cases':>6} {'seconds':>8}  reason"]
    for g in gates:
        lines.append(f"{g.name:<16} {g.status:<8} {g.num_cases:>6} {g.seconds:>8.1f}  {g.reason}")
    return "\n".join(lines)


def junit(report: GateReport) -> ET.ElementTree:
    """One <testsuite> per gate: a <testcase> per test, then one 'verdict' testcase that carries
    the gate's own status, so a gate red for zero cases or an uncovered claim shows as failed."""
    root = ET.Element("testsuites", name="specgate-gates")
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    for g in report.gates:
        suite = ET.SubElement(root, "testsuite", name=g.name)
        props = ET.SubElement(suite, "properties")
        for key in ("purpose", "needs", "status", "num_cases"):
            ET.SubElement(props, "property", name=key, value=str(getattr(g, key)))
        ET.SubElement(props, "property", name="proven_against", value=",".join(g.proven_against))
        counts = dict(tests=0, failures=0, errors=0, skipped=0)
        for t in g.tests:
            _testcase(suite, g.name, t.nodeid.split("::", 1)[-1], t.outcome, t.message, t.seconds, counts)
        _testcase(suite, g.name, "verdict", {GREEN: PASSED, RED: FAILED}.get(g.status, g.status),
                  g.reason, g.seconds, counts)
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        suite.set("time", f"{g.seconds:.3f}")
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
