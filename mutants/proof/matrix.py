"""The gate-proof matrix: defects x gates, and its judgement. Plain Python over gate results, so
the rules are testable on synthetic results.

A cell is the status a gate reported on a tree (green, red, skipped, error), or absent when the
gate was not run there. The judgement fails (exit 1) when
- a gate a defect names is not red on it (green, error, skipped on a machine that could run it,
  or the run timed out: a timeout is not a kill);
- a defect claimed token-invisible turns lossless red (or lossless could not decide);
- a defect no longer applies (stale: it must be re-seeded, never skipped);
- any gate is red or errored on the clean tree;
- a CPU gate is proven against no defect (a gate no planted defect turns red measures nothing
  we know of). With CUDA, the same holds for CUDA gates.
A defect that needs CUDA, on a machine without it, is listed and reported skipped, not failed.

A `Proof` holds one whole proof (the defects asked for, every tree's run, the judgement); the
report functions (text_table, markdown, report) read it.
"""
from dataclasses import asdict, dataclass, field

from gates.report import ERROR, GREEN, RED, SKIPPED, GateResult

# How a whole tree's run ended.
RAN, STALE, NEEDS_CUDA, TIMEOUT, FAILED_TO_RUN = "ran", "stale", "needs CUDA", "timeout", "could not run"
CLEAN = "clean tree"


@dataclass
class TreeRun:
    """The gates run on one tree: the clean copy, or a copy with one defect planted."""
    tree: str                                     # CLEAN or a defect name
    status: str                                   # RAN, STALE, NEEDS_CUDA, TIMEOUT, FAILED_TO_RUN
    gates: dict[str, GateResult] = field(default_factory=dict)
    seconds: float = 0.0
    detail: str = ""                              # why it is stale or could not run; a log tail

    def cell(self, gate: str) -> str | None:
        return self.gates[gate].status if gate in self.gates else None

    def reason(self, gate: str) -> str:
        return self.gates[gate].reason if gate in self.gates else ""

    def to_json(self) -> dict:
        """As prove's JSON keeps it: each gate's status, reason, seconds and first evidence."""
        out = asdict(self)
        out["gates"] = {g: {"status": r.status, "reason": r.reason, "seconds": r.seconds, "evidence": r.evidence}
                        for g, r in self.gates.items()}
        return out


@dataclass
class Judgement:
    problems: list[str]
    notes: list[str]
    proven: dict[str, list[str]]                  # gate -> defects it went red on, as named

    @property
    def exit_status(self) -> int:
        return 1 if self.problems else 0


@dataclass
class Proof:
    """One proof: the defects asked for (catalogue order), each defect's tree run by name, the
    clean tree's run, the gates (gate -> 'cpu'/'cuda', registry order) and the judgement."""
    defects: list
    runs: dict[str, TreeRun]
    clean: TreeRun | None
    gate_needs: dict[str, str]
    has_cuda: bool
    judgement: Judgement
    wall_s: float = 0.0

    @property
    def exit_status(self) -> int:
        return self.judgement.exit_status


def build_proof(defects, runs: dict[str, TreeRun], clean: TreeRun | None, gate_needs: dict[str, str],
                has_cuda: bool, complete: bool = True, wall_s: float = 0.0) -> Proof:
    """The Proof of these runs, with its judgement."""
    return Proof(list(defects), runs, clean, gate_needs, has_cuda,
                 judge(defects, runs, clean, gate_needs, has_cuda, complete), wall_s)


def judge(defects, runs: dict[str, TreeRun], clean: TreeRun | None, gate_needs: dict[str, str],
          has_cuda: bool, complete: bool = True) -> Judgement:
    """`defects` from the catalogue; `runs` by defect name; `gate_needs` gate -> 'cpu'/'cuda' in
    registry order; `complete`: every defect of the catalogue was asked for (else no gate is
    called unproven)."""
    problems, notes = [], []
    proven = {g: [] for g in gate_needs}

    def could_run(gate: str) -> bool:
        return gate_needs.get(gate) != "cuda" or has_cuda

    for d in defects:
        run = runs.get(d.name)
        if run is None:
            problems.append(f"{d.name}: not run")
            continue
        if run.status == STALE:
            problems.append(f"{d.name}: stale, the patch no longer applies ({run.detail}); re-seed it")
            continue
        if run.status == NEEDS_CUDA:
            continue
        if run.status != RAN:
            problems.append(f"{d.name}: {run.status}{': ' + run.detail.splitlines()[0] if run.detail else ''}")
            continue
        for gate in d.gates:
            status = run.cell(gate)
            if status == RED:
                proven.setdefault(gate, []).append(d.name)
            elif status == SKIPPED and not could_run(gate):
                continue
            else:
                reason = run.reason(gate)
                problems.append(f"{d.name}: gate {gate} is {status or 'not run'}, expected red"
                                + (f" ({reason})" if reason else ""))
        lossless = run.cell("lossless")
        if d.token_invisible and lossless != GREEN:
            reason = run.reason("lossless")
            problems.append(f"{d.name}: claimed token-invisible, but lossless is {lossless or 'not run'}"
                            + (f" ({reason})" if reason else ""))
        elif not d.token_invisible and "lossless" not in d.gates and lossless == GREEN:
            notes.append(f"{d.name}: lossless stayed green, though the defect is not claimed token-invisible: "
                         f"no run lossless makes reaches a token it changes")
    if clean is None or clean.status != RAN:
        problems.append(f"{CLEAN}: {clean.status if clean else 'not run'}"
                        + (f": {clean.detail.splitlines()[0]}" if clean and clean.detail else ""))
    else:
        for gate in gate_needs:
            status = clean.cell(gate)
            if status in (RED, ERROR) or (status in (None, SKIPPED) and could_run(gate)):
                reason = clean.reason(gate)
                problems.append(f"{CLEAN}: gate {gate} is {status or 'not run'}, expected green"
                                + (f" ({reason})" if reason else ""))
    if complete:
        for gate, needs in gate_needs.items():
            if proven.get(gate):
                continue
            if could_run(gate):
                problems.append(f"gate {gate} ({needs}) is proven against no defect")
            else:
                notes.append(f"gate {gate} needs CUDA: not proven on this machine")
    return Judgement(problems, notes, proven)


# ---- rendering ------------------------------------------------------------------------------------
MUST_RED, MUST_GREEN, BROKEN = "●", "○", "✗"


def cell_text(defect, run: TreeRun, gate: str, has_cuda: bool, gate_needs: dict[str, str]) -> str:
    if run.status != RAN:
        return ""
    status = run.cell(gate)
    text = status or "-"
    if defect is None:
        ok = status in (GREEN,) or (status == SKIPPED and gate_needs.get(gate) == "cuda" and not has_cuda)
        return text if ok else f"{text} {BROKEN}"
    if gate in defect.gates:
        ok = status == RED or (status == SKIPPED and gate_needs.get(gate) == "cuda" and not has_cuda)
        return f"{MUST_RED} {text}" + ("" if ok else f" {BROKEN}")
    if gate == "lossless" and defect.token_invisible:
        return f"{MUST_GREEN} {text}" + ("" if status == GREEN else f" {BROKEN}")
    return text


def row_status(defect, run: TreeRun, v: Judgement) -> str:
    if run.status != RAN:
        return {NEEDS_CUDA: "skipped (needs CUDA)"}.get(run.status, run.status)
    name = defect.name if defect is not None else CLEAN
    return "FAILED" if any(p.startswith(name + ":") for p in v.problems) else "ok"


def rows(p: Proof) -> list[list[str]]:
    gates = list(p.gate_needs)
    out = [["defect", "invisible", *gates, "run", "s"]]
    for d in p.defects:
        run = p.runs.get(d.name) or TreeRun(d.name, "not run")
        out.append([d.name, "yes" if d.token_invisible else "",
                    *(cell_text(d, run, g, p.has_cuda, p.gate_needs) for g in gates),
                    row_status(d, run, p.judgement), f"{run.seconds:.0f}"])
    if p.clean is not None:
        out.append([CLEAN, "", *(cell_text(None, p.clean, g, p.has_cuda, p.gate_needs) for g in gates),
                    row_status(None, p.clean, p.judgement), f"{p.clean.seconds:.0f}"])
    return out


LEGEND = (f"{MUST_RED} the catalogue says this gate must go red; {MUST_GREEN} the defect is claimed "
          f"token-invisible, so lossless must stay green; {BROKEN} the cell breaks its expectation; "
          f"skipped: a gate that needs CUDA, on a machine without it; -: not run.")


def markdown(p: Proof, meta: dict) -> str:
    defects, gate_needs, has_cuda, v = p.defects, p.gate_needs, p.has_cuda, p.judgement
    table = rows(p)
    lines = [f"Generated by `specgate prove{meta.get('args', '')}` in {meta['wall_s']:.0f} s "
             f"({meta['jobs']} jobs, {meta['device']}, CUDA {'available' if has_cuda else 'not available'}): "
             f"**{'PASS' if v.exit_status == 0 else 'FAIL'}**.", "",
             "| " + " | ".join(table[0]) + " |", "|" + " --- |" * len(table[0])]
    for r in table[1:]:
        lines.append("| " + " | ".join([r[0] if r[0] == CLEAN else f"`{r[0]}`", *r[1:]]) + " |")
    lines += ["", LEGEND, "", "Proven against (red on a defect that names it, in this run):", ""]
    for g, ds in v.proven.items():
        named = [d.name for d in defects if g in d.gates]
        if ds:
            lines.append(f"- `{g}`: {', '.join(f'`{d}`' for d in ds)}")
        elif gate_needs.get(g) == "cuda" and not has_cuda:
            lines.append(f"- `{g}`: not run here (needs CUDA); "
                         f"named by {', '.join(f'`{d}`' for d in named) or 'no defect'}")
        else:
            lines.append(f"- `{g}`: no defect")
    lines += ["", "The defects:", ""]
    lines += [f"- `{d.name}`{' (needs CUDA)' if d.needs == 'cuda' else ''}: {d.models}" for d in defects]
    for title, items in (("Problems", v.problems), ("Notes", v.notes)):
        if items:
            lines += ["", f"{title}:", ""] + [f"- {p}" for p in items]
    return "\n".join(lines) + "\n"


def text_table(p: Proof) -> str:
    table = rows(p)
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)


def gate_seconds(runs: dict[str, TreeRun], clean: TreeRun | None) -> dict[str, dict]:
    """gate -> {"runs", "seconds"} over every tree, slowest first: where prove's time goes."""
    out: dict[str, dict] = {}
    for run in [*runs.values(), *([clean] if clean else [])]:
        for gate, result in run.gates.items():
            if result.status != SKIPPED:
                t = out.setdefault(gate, {"runs": 0, "seconds": 0.0})
                t["runs"] += 1
                t["seconds"] = round(t["seconds"] + result.seconds, 1)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def report(p: Proof, meta: dict) -> dict:
    defects, runs, clean, gate_needs, has_cuda, v = p.defects, p.runs, p.clean, p.gate_needs, p.has_cuda, p.judgement
    return {"schema": "specgate-prove/1", **meta, "has_cuda": has_cuda, "exit_status": v.exit_status,
            "problems": v.problems, "notes": v.notes, "proven_against": v.proven,
            "gates": gate_needs, "gate_seconds": gate_seconds(runs, clean),
            "defects": [{"name": d.name, "models": d.models, "gates": list(d.gates),
                         "token_invisible": d.token_invisible, "needs": d.needs,
                         "patch": f"mutants/proof/patches/{d.name}.diff",
                         **runs[d.name].to_json()} for d in defects if d.name in runs],
            "clean": clean.to_json() if clean else None}
