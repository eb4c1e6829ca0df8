"""The veto's verdict from gate reports: LIFT or KEEP, with its reasons.

`specgate gates verdict [REPORT.json ...]` (default reports/gates.json) reads the JSON reports of
`specgate gates run`, one or several (say, a CPU run and a CUDA run), and says LIFT only when:
- every gate in the registry ran and was green on CUDA (the report's environment says CUDA was
  available and the engine ran on a cuda device), with none of its tests skipped: the veto
  governs GPU runs, and busy, no-sync's sync debug mode and real graph replay exist only there;
- no report has a red or errored gate, on any device;
- speed-ab's graph arm on CUDA shows async ahead of sync beyond the floor on every A/B (both
  drafters, c=1 and c=8, TPOT and throughput): a delta under the floor is not a gain.
Otherwise it says KEEP and names each reason. On a machine without CUDA it is always KEEP.
"""
import json
from dataclasses import dataclass, field
from pathlib import Path

from gates.measure import UNDER_THE_FLOOR
from gates.registry import GATES
from gates.report import GateReport, GateResult

LIFT, KEEP = "LIFT", "KEEP"
SPEED_GATE, DECIDING_ARM = "speed-ab", "graph"


@dataclass
class Verdict:
    decision: str
    reasons: list[str] = field(default_factory=list)   # why KEEP (empty for LIFT)
    runs: list[str] = field(default_factory=list)      # which gate ran where, with what status

    @property
    def line(self) -> str:
        if self.decision == LIFT:
            return "verdict: LIFT the veto (every gate green on CUDA, speed-ab's graph arm ahead beyond the floor)"
        return f"verdict: KEEP the veto ({len(self.reasons)} reason{'s' * (len(self.reasons) != 1)}: " \
               f"{'; '.join(self.reasons[:3])}{'; ...' if len(self.reasons) > 3 else ''})"


def ran_on_cuda(report: GateReport) -> bool:
    env = report.environment
    return bool(env.get("cuda")) and str(env.get("device") or "cpu").startswith("cuda")


def decide(reports: list[GateReport], gate_names: tuple[str, ...] | None = None) -> Verdict:
    names = gate_names or tuple(g.name for g in GATES)
    reasons, runs = [], []
    green_on_cuda: dict[str, GateResult] = {}
    if not reports:
        return Verdict(KEEP, ["no gate report was given"])
    if not any(ran_on_cuda(r) for r in reports):
        reasons.append("no report ran on CUDA: the GPU gates (busy, no-sync's sync debug mode, speed-ab's "
                       "graph replay) did not run")
    for report in reports:
        device = "cuda" if ran_on_cuda(report) else report.environment.get("device") or "cpu"
        for g in report.gates:
            skipped_tests = [t for t in g.tests if t.outcome == "skipped"]
            runs.append(f"{g.name}: {g.status} on {device} ({g.reason})")
            if g.status in ("red", "error"):
                reasons.append(f"{g.name} is {g.status} on {device}: {g.reason}")
            elif g.status == "green" and device == "cuda" and not skipped_tests:
                green_on_cuda[g.name] = g
    for name in names:
        if name not in green_on_cuda:
            seen = [r for r in runs if r.startswith(f"{name}: ")]
            how = "; ".join(r.split(": ", 1)[1] for r in seen) if seen else "not run"
            reasons.append(f"{name} not green on CUDA ({how})")
    if SPEED_GATE in green_on_cuda:
        reasons += speed_reasons(green_on_cuda[SPEED_GATE])
    return Verdict(KEEP if reasons else LIFT, reasons, runs)


def speed_reasons(gate: GateResult) -> list[str]:
    """KEEP reasons from speed-ab's CUDA figures: its graph arm must show async ahead everywhere."""
    graph = [m for m in gate.measurements if m.get("graph_arm") == DECIDING_ARM]
    if not graph:
        return [f"{SPEED_GATE} recorded no {DECIDING_ARM}-arm figures"]
    out = []
    for m in graph:
        for ab in m.get("ab", []):
            where = f"{SPEED_GATE} {DECIDING_ARM} arm {m.get('drafter')} c={ab['concurrency']} {ab['metric']}"
            if ab["result"] == UNDER_THE_FLOOR:
                out.append(f"{where} under the floor ({ab['noise_floor']:.1%})")
            else:
                higher_is_better = ab["metric"] != "tpot_ms"
                if not (ab["ratio"] > 1 if higher_is_better else ab["ratio"] < 1):
                    out.append(f"{where}: async not ahead of sync ({ab['result']})")
    return out


def load(paths: list[str]) -> list[GateReport]:
    reports = []
    for path in paths:
        try:
            reports.append(GateReport.from_json(json.loads(Path(path).read_text())))
        except (OSError, json.JSONDecodeError, ValueError, TypeError) as e:
            raise ValueError(f"cannot read gate report {path}: {e}") from None
    return reports
