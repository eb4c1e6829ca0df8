"""The veto's verdict from gate reports: LIFT or KEEP, with its reasons, and the evidence file the
engine reads (engine/veto.py).

`specgate gates verdict [REPORT.json ...]` (default reports/gates.json) reads the JSON reports of
`specgate gates run`, one or several (rounds, the fixtures and the 1B shape, a CPU and a CUDA run),
and says LIFT only when:
- every report judged the same source tree (the sha256 of engine/, gates/ and fixtures/ its
  environment records); reports of different trees are refused, naming them, unless asked
  (`--allow-mixed-trees`), since a verdict over two trees speaks for neither;
- every gate in the registry ran and was green on CUDA (the report's environment says CUDA was
  available and the engine ran on a cuda device), with none of its tests skipped: the veto
  governs GPU runs, and busy, no-sync's sync debug mode and real graph replay exist only there;
- every gate whose verdict depends on the forward (Gate.forward_axis) judged, green on CUDA, both
  the reference and the compiled forward (its result's `forwards`): CUDA runs compile by default,
  and the evidence lifts the veto for the forwards it names only; likewise for the attention
  backends (its result's `attention_backends`, EngineConfig.attention_backend): the evidence names
  those every such gate judged green on CUDA, and lifts the veto for them only;
- every model a CUDA report judged (its target, the environment's `model`: the fixtures, the 1B
  shape; not a gate's own folder as depth's, GateReport.judged_target) has the gates whose verdict
  depends on the model's size (MODEL_GATES: busy, speed-ab, no-sync, what gpu-check's gates1b
  runs) green on CUDA, with both forwards where the gate has a forward axis: the fixtures' green
  speed-ab does not speak for the 1B shape, where the host's share of a step is another;
- no report has a red or errored gate, on any device;
- in every CUDA report (every round, every model), speed-ab's graph arm shows async ahead of sync
  beyond the floor on every A/B (both drafters, c=1 and c=8, TPOT and throughput; the paired
  statistic of gates/measure.py): a difference under the floor is not a gain; and busy's graph
  arm keeps the async level at its threshold; each forward's figures count.
Otherwise it says KEEP and names each reason. On a machine without CUDA it is always KEEP.

`--record` writes the decision, with what it judged, to engine/veto-evidence.json (or a path given):
the engine lifts its veto by default only for the engine sources, device kinds, forwards, arms and
attention backends that file names (engine/veto.py).
"""
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import FORWARDS
from engine.veto import EVIDENCE_FILE, engine_source_hash
from gates.measure import UNDER_THE_FLOOR
from gates.registry import GATES
from gates.report import GateReport, GateResult

LIFT, KEEP = "LIFT", "KEEP"
SPEED_GATE, BUSY_GATE, DECIDING_ARM = "speed-ab", "busy", "graph"
FORWARD_GATES = tuple(g.name for g in GATES if g.forward_axis)
# The gates whose verdict depends on the model's size: each model judged must have them all.
MODEL_GATES = (BUSY_GATE, SPEED_GATE, "no-sync")
# What a report that names no forwards judged: every gate ran the reference forward before reports
# recorded them.
UNRECORDED_FORWARDS = ("reference",)
# What a gate result that names no attention backend judged: sdpa, the only default before results
# recorded them (no gate sets a backend of its own).
UNRECORDED_BACKENDS = ("sdpa",)


class MixedTrees(ValueError):
    """Reports of different source trees, combined without being asked to."""


@dataclass
class Verdict:
    decision: str
    reasons: list[str] = field(default_factory=list)   # why KEEP (empty for LIFT)
    runs: list[str] = field(default_factory=list)      # which gate ran where, with what status
    figures: dict = field(default_factory=dict)        # what decided it: speed-ab's graph A/Bs, busy's levels
    forwards: list[str] = field(default_factory=list)  # forwards every forward-dependent gate judged on CUDA
    attention_backends: list[str] = field(default_factory=list)  # attention backends they all judged, likewise

    @property
    def line(self) -> str:
        if self.decision == LIFT:
            return (f"verdict: LIFT the veto (every gate green on CUDA, {' and '.join(self.forwards)} forward, "
                    f"{' and '.join(self.attention_backends)} attention, speed-ab's graph arm ahead beyond the floor)")
        return f"verdict: KEEP the veto ({len(self.reasons)} reason{'s' * (len(self.reasons) != 1)}: " \
               f"{'; '.join(self.reasons[:3])}{'; ...' if len(self.reasons) > 3 else ''})"


def ran_on_cuda(report: GateReport) -> bool:
    env = report.environment
    return bool(env.get("cuda")) and str(env.get("device") or "cpu").startswith("cuda")


def tree_of(report: GateReport) -> str:
    """The source tree a report judged, as one short label (its sources' hashes), or why it has none."""
    sources = report.environment.get("sources")
    if not sources:
        return "unrecorded (a report written before reports recorded their sources)"
    return " ".join(f"{name} {digest[:12]}" for name, digest in sorted(sources.items()))


def check_one_tree(reports: list[GateReport], names: list[str]) -> None:
    """Raises MixedTrees, naming each tree and its reports, when the reports judged more than one."""
    trees: dict[str, list[str]] = {}
    for report, name in zip(reports, names):
        trees.setdefault(tree_of(report), []).append(name)
    if len(trees) > 1:
        raise MixedTrees("the reports judged different source trees: " + "; ".join(
            f"{tree} ({', '.join(files)})" for tree, files in trees.items())
            + " (run the gates again on one tree, or pass --allow-mixed-trees)")


def forwards_of(g: GateResult, report: GateReport) -> tuple[str, ...]:
    """The forwards a gate's engines ran, as its result names them (a report from before results
    named them: its environment's, else the reference forward, all there was)."""
    return tuple(g.forwards or report.environment.get("forwards") or UNRECORDED_FORWARDS)


def backends_of(g: GateResult) -> tuple[str, ...]:
    """The attention backends a gate's engines ran (a result from before results named them: sdpa)."""
    return tuple(g.attention_backends or UNRECORDED_BACKENDS)


def model_reasons(reports: list[GateReport], model_gates: list[str], forward_gates: tuple[str, ...]) -> list[str]:
    """Where CUDA reports judged several models: why one of them lacks a model-size gate green on
    CUDA, or one of its forwards (skipped tests allowed here: the fixture block drafter does not fit
    the 1B target)."""
    forwards: dict[str, dict[str, set[str]]] = {}  # model -> gate -> forwards judged green on CUDA
    for report in (r for r in reports if ran_on_cuda(r) and r.judged_target):  # a gate ran on its target
        model = report.environment.get("model") or "(not recorded)"
        judged = forwards.setdefault(model, {})
        for g in report.gates:
            if g.name in model_gates and g.status == "green":
                judged.setdefault(g.name, set()).update(forwards_of(g, report))
    if len(forwards) < 2:
        return []  # one model: the rules over every report already say it
    reasons = []
    for model, judged in forwards.items():
        for name in model_gates:
            need = FORWARDS if name in forward_gates else ()
            missing = [f for f in need if f not in judged.get(name, set())]
            if name not in judged:
                reasons.append(f"{name} did not run green on CUDA on the model {model}: each model judged needs "
                               f"{', '.join(model_gates)} there")
            elif missing:
                reasons.append(f"{name} did not judge the {' and '.join(missing)} forward on CUDA on the model "
                               f"{model}")
    return reasons


def decide(reports: list[GateReport], gate_names: tuple[str, ...] | None = None, allow_mixed: bool = False,
           report_names: list[str] | None = None, forward_gates: tuple[str, ...] = FORWARD_GATES) -> Verdict:
    names = gate_names or tuple(g.name for g in GATES)
    if not reports:
        return Verdict(KEEP, ["no gate report was given"])
    if not allow_mixed:
        check_one_tree(reports, report_names or [f"report {i + 1}" for i in range(len(reports))])
    reasons, runs = [], []
    if not any(ran_on_cuda(r) for r in reports):
        reasons.append("no report ran on CUDA: the GPU gates (busy, no-sync's sync debug mode, speed-ab's "
                       "graph replay) did not run")
    green_on_cuda: set[str] = set()
    forwards_on_cuda: dict[str, set[str]] = {name: set() for name in names}  # judged green, no test skipped
    backends_on_cuda: dict[str, set[str]] = {name: set() for name in names}  # likewise
    how: dict[str, list[str]] = {name: [] for name in names}
    judged: dict[str, list[GateResult]] = {SPEED_GATE: [], BUSY_GATE: []}
    for report in reports:
        device = "cuda" if ran_on_cuda(report) else report.environment.get("device") or "cpu"
        for g in report.gates:
            runs.append(f"{g.name}: {g.status} on {device} ({g.reason})")
            how.setdefault(g.name, []).append(_how(g, device))
            if g.status in ("red", "error"):
                reasons.append(f"{g.name} is {g.status} on {device}: {g.reason}")
            elif g.status == "green" and device == "cuda" and not any(t.outcome == "skipped" for t in g.tests):
                green_on_cuda.add(g.name)
                forwards_on_cuda.setdefault(g.name, set()).update(forwards_of(g, report))
                backends_on_cuda.setdefault(g.name, set()).update(backends_of(g))
            if g.name in judged and device == "cuda" and g.status in ("green", "red"):
                judged[g.name].append(g)  # a red run's figures are evidence too: what kept the veto
    for name in names:
        if name not in green_on_cuda:
            reasons.append(f"{name} is not green on CUDA: {'; '.join(how[name]) or 'not run in any report'}")
    deciding = [name for name in names if name in forward_gates]
    for name in (n for n in deciding if n in green_on_cuda):
        missing = [f for f in FORWARDS if f not in forwards_on_cuda[name]]
        if missing:
            reasons.append(f"{name} did not judge the {' and '.join(missing)} forward on CUDA (it judged the "
                           f"{' and '.join(sorted(forwards_on_cuda[name]))} forward): run the CUDA gates with "
                           f"both forwards, as --device cuda does by default")
    reasons += model_reasons(reports, [n for n in MODEL_GATES if n in names], forward_gates)
    covered = [f for f in FORWARDS if deciding and all(f in forwards_on_cuda[n] for n in deciding)]
    # The evidence lifts the veto for the attention backends every forward-dependent gate judged
    # green on CUDA (a run with another backend stays vetoed, engine/veto.py).
    backends = sorted(set.intersection(*(backends_on_cuda[n] for n in deciding))) if deciding else []
    if deciding and all(name in green_on_cuda for name in deciding) and not backends:
        reasons.append("the forward-dependent gates judged no attention backend in common on CUDA: "
                       + "; ".join(f"{n} {', '.join(sorted(backends_on_cuda[n]))}" for n in deciding))
    speed, speed_figures = speed_reasons(judged[SPEED_GATE])
    busy, busy_figures = busy_reasons(judged[BUSY_GATE])
    reasons += speed + busy
    return Verdict(KEEP if reasons else LIFT, reasons, runs, {SPEED_GATE: speed_figures, BUSY_GATE: busy_figures},
                   covered, backends)


def _how(g: GateResult, device: str) -> str:
    """One gate's run, in the words a reviewer reads once."""
    skipped = [t for t in g.tests if t.outcome == "skipped"]
    if g.status == "skipped":
        return f"skipped on {device} ({g.reason})"
    if g.status == "green" and skipped:
        why = (skipped[0].message or "no reason given").strip().splitlines()[0]
        return f"green on {device}, but {len(skipped)} of {len(g.tests)} tests skipped ({why})"
    if g.status == "green":
        return f"green on {device}, not on CUDA" if device != "cuda" else f"green on {device}"
    return f"{g.status} on {device}"


def speed_reasons(gates: list[GateResult]) -> tuple[list[str], list[dict]]:
    """KEEP reasons from every CUDA speed-ab result: its graph arm must show async ahead everywhere."""
    out, figures = [], []
    for i, gate in enumerate(gates, 1):
        graph = [m for m in gate.measurements if m.get("graph_arm") == DECIDING_ARM]
        where_run = f" (report {i} of {len(gates)})" if len(gates) > 1 else ""
        if not graph:
            out.append(f"{SPEED_GATE} recorded no {DECIDING_ARM}-arm figures{where_run}")
        for m in graph:
            forward = m.get("forward", UNRECORDED_FORWARDS[0])
            for ab in m.get("ab", []):
                where = (f"{SPEED_GATE} {DECIDING_ARM} arm, {forward} forward, {m.get('drafter')} "
                         f"c={ab['concurrency']} {ab['metric']}")
                figures.append({"drafter": m.get("drafter"), "forward": forward, "concurrency": ab["concurrency"],
                                "metric": ab["metric"], "result": ab["result"], "ratio": ab.get("ratio"),
                                "interval": ab.get("interval"), "min_effect": ab.get("min_effect")})
                if "interval" not in ab:
                    out.append(f"{where}: recorded by an older speed-ab (a range floor over 3 legs), not the "
                               f"paired statistic: run the gate on this tree{where_run}")
                elif ab["result"] == UNDER_THE_FLOOR:
                    out.append(f"{where} under the floor (the interval of the median per-leg change, "
                               f"{ab['interval'][0]:+.1%} to {ab['interval'][1]:+.1%}, does not clear "
                               f"+-{ab['min_effect']:.0%}){where_run}")
                elif ab["result"] != "ahead":
                    out.append(f"{where}: async behind sync (async/sync = {ab['ratio']:.3f}){where_run}")
    return out, figures


# busy's figures the verdict keeps: the judged level (its measure: unprofiled in the graph arm),
# the profiled level and its per-kernel union beside it.
BUSY_FIGURES = ("arm", "measure", "async_level", "sync_level", "profiled_async_level", "profiled_sync_level",
                "kernel_busy_async", "kernel_busy_sync", "threshold")


def busy_reasons(gates: list[GateResult]) -> tuple[list[str], list[dict]]:
    """KEEP reasons from every CUDA busy result: the async graph arm's level at its threshold."""
    out, figures = [], []
    for gate in gates:
        for m in gate.measurements:
            forward = m.get("forward", UNRECORDED_FORWARDS[0])
            figures.append({"forward": forward} | {k: m.get(k) for k in BUSY_FIGURES})
            if m.get("threshold") is not None and m.get("async_level", 0) < m["threshold"]:
                out.append(f"{BUSY_GATE} {m.get('arm')} arm, {forward} forward: async level {m.get('async_level')} "
                           f"under its threshold {m['threshold']}")
    return out, figures


def load(paths: list[str]) -> list[GateReport]:
    reports = []
    for path in paths:
        try:
            reports.append(GateReport.from_json(json.loads(Path(path).read_text())))
        except (OSError, json.JSONDecodeError, ValueError, TypeError) as e:
            raise ValueError(f"cannot read gate report {path}: {e}") from None
    return reports


def evidence(v: Verdict, reports: list[GateReport], names: list[str]) -> dict:
    """The evidence file's content: the decision, what it judged, and the figures that decided it.
    Refuses (ValueError) reports whose engine is not this tree's: the evidence must name the
    engine that ran."""
    engines = {r.environment.get("sources", {}).get("engine") for r in reports}
    if len(engines) != 1 or None in engines:
        raise ValueError("--record needs reports that all judged one engine and recorded it "
                         f"(engine hashes seen: {sorted(str(e)[:12] for e in engines)})")
    (engine,) = engines
    if engine != engine_source_hash():
        raise ValueError(f"--record: the reports judged engine {engine[:12]}, this tree's engine is "
                         f"{engine_source_hash()[:12]}: record on the tree the gates ran on")
    cuda = [r for r in reports if ran_on_cuda(r)]
    env = cuda[0].environment if cuda else reports[0].environment
    return {"decision": v.decision, "engine_sha256": engine,
            "devices": sorted({"cuda"} if cuda else set()),
            "forwards": list(v.forwards),
            "attention_backends": list(v.attention_backends),
            # The arm the verdict judged: speed-ab's and busy's graph arm. The eager arm is never
            # lifted (engine/veto.py says why).
            "arms": [DECIDING_ARM] if v.decision == LIFT else [],
            "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": env.get("commit"), "device_name": env.get("device_name"), "torch": env.get("torch"),
            "sources": env.get("sources"),
            "reports": [{"report": name, "device": r.environment.get("device"), "model": r.environment.get("model"),
                         "model_shape": r.environment.get("model_shape"), "gate_models": r.gate_models,
                         "gates": {g.name: g.status for g in r.gates}} for r, name in zip(reports, names)],
            "reasons": v.reasons, "figures": v.figures,
            "how_to_refresh": "scripts/gpu-check.sh env gates verdict on a GPU; `specgate gates verdict --record` "
                              "over its reports (docs/gates.md)"}


def record(v: Verdict, reports: list[GateReport], names: list[str], path: Path = EVIDENCE_FILE) -> Path:
    Path(path).write_text(json.dumps(evidence(v, reports, names), indent=2) + "\n")
    return Path(path)
