"""Synthetic gate reports, written as `specgate gates run --json` writes them, for the verdict's
tests (tests/gates/test_verdict*.py): every registry gate green on CUDA with both forwards unless a
gate is given, speed-ab's paired A/B figures in both arms."""
from gates import verdict
from gates.registry import GATES
from gates.report import GateReport

NAMES = tuple(g.name for g in GATES)


def ab(metric: str, c: int, ratio: float | None) -> dict:
    """speed-ab's paired figures for one A/B (gates/measure.py): a ratio only beyond the floor."""
    out = {"metric": metric, "concurrency": c, "min_effect": 0.02}
    if ratio is None:
        out.update(result="under the floor", interval=[-0.01, 0.03])
    else:
        ahead = ratio > 1 if metric != "tpot_ms" else ratio < 1
        out.update(result="ahead" if ahead else "behind", ratio=ratio, interval=[ratio - 1.01, ratio - 0.99])
    return out


def speed_figures(graph_tpot=0.8, graph_tps=1.25) -> list[dict]:
    """Per forward (reference first), per drafter (ngram first): the eager arm, then the graph arm."""
    out = []
    for forward in ("reference", "compiled"):
        for drafter in ("ngram", "block"):
            out.append({"drafter": drafter, "device": "cuda", "forward": forward, "graph_arm": "eager",
                        "ab": [ab(m, c, None) for c in (1, 8) for m in ("tpot_ms", "output_tokens_per_s")]})
            out.append({"drafter": drafter, "device": "cuda", "forward": forward, "graph_arm": "graph",
                        "ab": [ab("tpot_ms", c, graph_tpot) for c in (1, 8)]
                        + [ab("output_tokens_per_s", c, graph_tps) for c in (1, 8)]})
    return out


def gate(name: str, status: str = "green", skipped_tests: int = 0, measurements=None, reason="8 cases") -> dict:
    tests = [{"nodeid": f"{name}::t{i}", "outcome": "passed"} for i in range(2)]
    tests += [{"nodeid": f"{name}::s{i}", "outcome": "skipped"} for i in range(skipped_tests)]
    return {"name": name, "status": status, "reason": reason, "tests": tests,
            "measurements": measurements if measurements is not None
            else (speed_figures() if name == "speed-ab" else [])}


def on_own_folder(g: dict, name: str = "llama-1b-deep") -> dict:
    """The gate result `g` of a gate that ran on a folder of its own, not the session's target (its
    `models`), as the depth gate records its deep folder."""
    return g | {"models": [{"name": name, "folder": f"/cache/bench-models/{name}",
                            "model_shape": {"hidden_size": 2048, "max_position_embeddings": 40960}}]}


TREE = {"engine": "e" * 64, "gates": "g" * 64, "fixtures": "f" * 64}


def report(device: str = "cuda", cuda: bool = True, sources=TREE, forwards=("reference", "compiled"),
           **overrides) -> dict:
    """A report whose gates name no forwards of their own: the environment's count for them."""
    gates = [overrides.get(n.replace("-", "_")) or gate(n) for n in NAMES]
    return {"environment": {"cuda": cuda, "device": device, "sources": sources, "forwards": list(forwards)},
            "gates": gates}


def model_report(model: str, names=("busy", "speed-ab", "no-sync"), forwards=("reference", "compiled"),
                 **overrides) -> dict:
    """A CUDA report on another model folder (the 1B shape) with only the named gates, as
    gpu-check's gates1b writes one."""
    gates = [overrides.get(n.replace("-", "_")) or gate(n) for n in names]
    return {"environment": {"cuda": True, "device": "cuda", "sources": TREE, "forwards": list(forwards),
                            "model": model}, "gates": gates}


def cpu_report() -> dict:
    gates = [gate(g.name, "skipped", reason="needs CUDA: torch.cuda.is_available() is False")
             if g.needs == "cuda" else gate(g.name) for g in GATES]
    for g in gates:
        if g["name"] == "speed-ab":
            g["measurements"] = [{**m, "device": "cpu"} for m in g["measurements"]]
    return {"environment": {"cuda": False, "device": "cpu", "sources": TREE}, "gates": gates}


def decide(reports: list[dict], **kwargs) -> verdict.Verdict:
    """The verdict of reports written as their JSON."""
    return verdict.decide([GateReport.from_json(r) for r in reports], **kwargs)
