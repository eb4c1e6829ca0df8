"""The veto's verdict (gates/verdict.py) on synthetic gate reports: LIFT only when every gate is
green on CUDA and speed-ab's graph arm is ahead beyond the floor; KEEP, with the reason, otherwise."""
import json

import pytest

from gates import verdict
from gates.cli import main
from gates.registry import GATES
from gates.report import GateReport

NAMES = tuple(g.name for g in GATES)


def ab(metric: str, c: int, ratio: float | None, floor: float = 0.05) -> dict:
    out = {"metric": metric, "concurrency": c, "noise_floor": floor}
    if ratio is None:
        out["result"] = "under the floor"
    else:
        out.update(result=f"async/sync = {ratio:.3f}", ratio=ratio)
    return out


def speed_figures(graph_tpot=0.8, graph_tps=1.25) -> list[dict]:
    out = []
    for drafter in ("ngram", "block"):
        out.append({"drafter": drafter, "device": "cuda", "graph_arm": "eager",
                    "ab": [ab(m, c, None) for c in (1, 8) for m in ("tpot_ms", "output_tokens_per_s")]})
        out.append({"drafter": drafter, "device": "cuda", "graph_arm": "graph",
                    "ab": [ab("tpot_ms", c, graph_tpot) for c in (1, 8)]
                    + [ab("output_tokens_per_s", c, graph_tps) for c in (1, 8)]})
    return out


def gate(name: str, status: str = "green", skipped_tests: int = 0, measurements=None, reason="8 cases") -> dict:
    tests = [{"nodeid": f"{name}::t{i}", "outcome": "passed"} for i in range(2)]
    tests += [{"nodeid": f"{name}::s{i}", "outcome": "skipped"} for i in range(skipped_tests)]
    return {"name": name, "status": status, "reason": reason, "tests": tests,
            "measurements": measurements if measurements is not None
            else (speed_figures() if name == "speed-ab" else [])}


def report(device: str = "cuda", cuda: bool = True, **overrides) -> dict:
    gates = [overrides.get(n.replace("-", "_")) or gate(n) for n in NAMES]
    return {"environment": {"cuda": cuda, "device": device}, "gates": gates}


def cpu_report() -> dict:
    gates = [gate(g.name, "skipped", reason="needs CUDA: torch.cuda.is_available() is False")
             if g.needs == "cuda" else gate(g.name) for g in GATES]
    for g in gates:
        if g["name"] == "speed-ab":
            g["measurements"] = [{**m, "device": "cpu"} for m in g["measurements"]]
    return {"environment": {"cuda": False, "device": "cpu"}, "gates": gates}


def decide(reports: list[dict]) -> verdict.Verdict:
    """The verdict of reports written as their JSON."""
    return verdict.decide([GateReport.from_json(r) for r in reports])


def test_every_gate_green_on_cuda_with_the_graph_arm_ahead_is_lift():
    v = decide([report()])
    assert v.decision == verdict.LIFT, v.reasons
    assert v.line.startswith("verdict: LIFT")


def test_cpu_only_is_keep_and_names_the_gpu_gates_that_did_not_run():
    v = decide([cpu_report()])
    assert v.decision == verdict.KEEP
    assert any("no report ran on CUDA" in r for r in v.reasons)
    for name in ("busy", "no-sync", "speed-ab", "lossless"):
        assert any(r.startswith(f"{name} not green on CUDA") for r in v.reasons), name
    assert any("busy not green on CUDA (skipped on cpu" in r for r in v.reasons)


def test_a_cpu_report_marked_cuda_device_without_cuda_is_not_a_cuda_run():
    assert decide([report(cuda=False)]).decision == verdict.KEEP


def test_one_red_gate_is_keep_and_names_it():
    v = decide([report(busy=gate("busy", "red", reason="1 of 2 tests failed: level 0.41 < 0.95"))])
    assert v.decision == verdict.KEEP
    assert any(r.startswith("busy is red on cuda: 1 of 2 tests failed: level 0.41") for r in v.reasons)


def test_a_red_cpu_report_beside_a_green_cuda_one_is_keep():
    cpu = cpu_report()
    cpu["gates"][0]["status"] = "red"
    assert decide([report(), cpu]).decision == verdict.KEEP


def test_a_gate_with_skipped_tests_on_cuda_is_keep():
    v = decide([report(no_sync=gate("no-sync", skipped_tests=1))])
    assert v.decision == verdict.KEEP and any(r.startswith("no-sync not green on CUDA") for r in v.reasons)


def test_speed_under_the_floor_in_the_graph_arm_is_keep():
    figures = speed_figures()
    figures[1]["ab"][1] = ab("tpot_ms", 8, None, floor=0.059)
    v = decide([report(speed_ab=gate("speed-ab", measurements=figures))])
    assert v.decision == verdict.KEEP
    assert v.reasons == ["speed-ab graph arm ngram c=8 tpot_ms under the floor (5.9%)"]


def test_speed_under_the_floor_in_the_eager_arm_only_is_still_lift():
    """The veto reads the graph arm; the eager arm is host-bound and under its floor."""
    assert decide([report()]).decision == verdict.LIFT


def test_speed_behind_or_missing_graph_figures_is_keep():
    slower = decide([report(speed_ab=gate("speed-ab", measurements=speed_figures(graph_tpot=1.1)))])
    assert slower.decision == verdict.KEEP and any("not ahead" in r for r in slower.reasons)
    eager_only = [m for m in speed_figures() if m["graph_arm"] == "eager"]
    missing = decide([report(speed_ab=gate("speed-ab", measurements=eager_only))])
    assert missing.reasons == ["speed-ab recorded no graph-arm figures"]


def test_a_gate_missing_from_every_report_is_keep():
    r = report()
    r["gates"] = [g for g in r["gates"] if g["name"] != "combine"]
    v = decide([r])
    assert v.reasons == ["combine not green on CUDA (not run)"]


def test_no_report_is_keep():
    assert decide([]).decision == verdict.KEEP


@pytest.mark.parametrize("which, status", [("cpu", 0), ("cuda", 0), ("red", 1)])
def test_the_verdict_command_prints_the_decision_last(tmp_path, capsys, which, status):
    data = {"cpu": cpu_report(), "cuda": report(), "red": report(busy=gate("busy", "red"))}[which]
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(data))
    assert main(["gates", "verdict", str(path)]) == status
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("verdict: LIFT" if which == "cuda" else "verdict: KEEP")


def test_an_unreadable_report_is_a_usage_error(tmp_path, capsys):
    assert main(["gates", "verdict", str(tmp_path / "missing.json")]) == 2
    assert "cannot read gate report" in capsys.readouterr().err
