"""The gates harness: the registry, `specgate gates list`, and the report's statuses in JSON and
JUnit. That every gate's checks go red on a doctored trace is tests/gates/test_gate_checks.py's."""
import json
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from gates import registry, report


# ---- registry and CLI --------------------------------------------------------------------------
def test_registry_names_are_kebab_case_unique_and_each_has_a_module():
    names = [g.name for g in registry.GATES]
    assert len(names) == len(set(names))
    for g in registry.GATES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", g.name), g.name
        assert g.needs in registry.NEEDS and g.purpose
        assert g.file.is_file(), f"gate {g.name}: no module {g.file}"
        source = g.file.read_text()
        assert "CLAIMS = (" in source and "def test_" in source, f"gate {g.name} claims nothing or tests nothing"


def test_a_bad_gate_definition_is_refused():
    with pytest.raises(ValueError, match="kebab-case"):
        registry.Gate("Emit_Count", "emit_count", "x", "cpu")
    with pytest.raises(ValueError, match="needs must be one of"):
        registry.Gate("emit-count", "emit_count", "x", "tpu")


def test_gates_list_shows_names_purposes_needs_and_the_defects_handed_in(capsys):
    """Which defects prove a gate comes from the catalogue, a layer above: the gates' command
    lists what it is handed (tests/proof/test_prove.py checks `specgate gates list` on the real join)."""
    import argparse

    from gates.cli import add_gates_parser
    ap = argparse.ArgumentParser()
    add_gates_parser(ap.add_subparsers(dest="command"), {"emit-count": ("stale-drafts", "reason-a-fallback")})
    args = ap.parse_args(["gates", "list"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    for g in registry.GATES:
        line = next(line for line in out.splitlines() if line.startswith(g.name + " "))
        proven = "stale-drafts, reason-a-fallback" if g.name == "emit-count" else "-"
        assert f"needs {g.needs}" in line and f"proven against: {proven}" in line
        assert g.purpose in out


def test_gates_run_refuses_an_unknown_gate(capsys):
    from gates.cli import main
    assert main(["gates", "run", "emit-count", "no-such-gate"]) == 2
    assert "unknown gate(s) no-such-gate" in capsys.readouterr().err


def test_gate_examples_are_bounded_under_ci_and_deep_under_deep(monkeypatch):
    from hypothesis import Phase

    from gates.workloads import gate_settings
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    ci = gate_settings(3)
    assert ci.max_examples == 3 and Phase.shrink not in ci.phases
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "deep")
    from hypothesis import settings
    assert gate_settings(3).max_examples == settings.get_profile("deep").max_examples > 3


# ---- statuses ----------------------------------------------------------------------------------
def _test(outcome="passed", cases=1, message=None):
    return {"nodeid": "g.py::t", "outcome": outcome, "message": message, "seconds": 0.0,
            "cases": [{"params": {}, "evidence": []}] * cases, "measurements": []}


@pytest.mark.parametrize("tests, needs, has_cuda, claims, seen, status", [
    ([_test()], "cpu", False, ("a",), {"a"}, report.GREEN),
    ([_test(cases=0)], "cpu", False, (), set(), report.RED),                  # zero cases is red
    ([], "cpu", False, (), set(), report.RED),
    ([_test()], "cpu", False, ("a", "b"), {"a"}, report.RED),                 # a claim that never occurred
    ([_test("failed", message="x")], "cpu", False, (), set(), report.RED),
    ([_test("error", message="x"), _test()], "cpu", False, (), set(), report.ERROR),
    ([_test("skipped", 0, "needs CUDA")] * 2, "cuda", False, (), set(), report.SKIPPED),
    ([_test()], "cuda", False, (), set(), report.SKIPPED),                    # never green without CUDA
    ([_test()], "cuda", True, (), set(), report.GREEN),
])
def test_verdict(tests, needs, has_cuda, claims, seen, status):
    assert report.gate_status(needs, tests, claims, seen, None, has_cuda)[0] == status


FAKE_GATES = {
    "green": '''
CLAIMS = ("ran",)
def test_ok(gate_record):
    gate_record.case(n=1)
    gate_record.case(n=2)
    gate_record.occurred("ran")
''',
    "empty": '''
CLAIMS = ()
def test_passes_but_checks_nothing(gate_record):
    pass
''',
    "red": '''
from gates.compare import Difference
CLAIMS = ()
def test_red(gate_record):
    gate_record.case(k=3)
    gate_record.check(Difference("emit_count", 7, 2, 41, 3, 1), "async vs sync")
''',
    "error": '''
CLAIMS = ()
def test_crashes(gate_record):
    gate_record.case()
    raise RuntimeError("engine exploded")
''',
    "cuda-pass": '''
CLAIMS = ()
def test_passes_anywhere(gate_record):
    gate_record.case()
''',
}


def write_fake_gates(folder) -> list:
    """FAKE_GATES written as gate modules in `folder`, as registry entries."""
    gates = []
    for name, source in FAKE_GATES.items():
        path = folder / f"fake_{name.replace('-', '_')}.py"
        path.write_text(source)
        gates.append(registry.Gate(f"fake-{name}", path.stem, f"fake gate {name}",
                                   "cuda" if name == "cuda-pass" else "cpu", path))
    return gates


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory):
    """One `specgate gates run` over fake gates, the real (cheap) reason-a gate, and the real
    CUDA-only busy gate."""
    from gates.run import run_gates
    tmp = tmp_path_factory.mktemp("gates")
    fakes = write_fake_gates(tmp)
    real = registry.by_name(["reason-a", "busy"])
    json_path, junit_path = tmp / "gates.json", tmp / "gates.xml"
    result = run_gates(fakes + real, str(json_path), str(junit_path), quiet=True).to_json()
    return result, json.loads(json_path.read_text()), ET.parse(junit_path)


@pytest.mark.slow
def test_gates_run_in_parallel_give_the_serial_report(tmp_path):
    """`--jobs 2` spreads the gates over two pytest processes (busy, timed, among them on the CPU);
    each gate's result, the summary and the JUnit suites equal the one-process run's. Fake
    gates (no engine) keep it cheap: the merge is what is tested, not the gates."""
    from gates.run import plan, run_gates
    gates = write_fake_gates(tmp_path)
    gates.insert(2, registry.by_name(["busy"])[0])
    phases = plan(gates, 2)
    assert len(phases) == 1 and len(phases[0]) == 2 and "busy" in [g.name for group in phases[0] for g in group]
    serial = run_gates(gates, None, str(tmp_path / "serial.xml"), quiet=True, jobs=1).to_json()
    parallel = run_gates(gates, None, str(tmp_path / "parallel.xml"), quiet=True, jobs=2).to_json()

    def comparable(result):
        return [{**{k: v for k, v in g.items() if k != "seconds"},
                 "tests": [{k: v for k, v in t.items() if k != "seconds"} for t in g["tests"]]}
                for g in result["gates"]]
    assert [g["name"] for g in parallel["gates"]] == [g.name for g in gates]
    assert comparable(parallel) == comparable(serial)
    assert parallel["summary"] == serial["summary"] and parallel["exit_status"] == serial["exit_status"] == 1
    assert parallel["command"].count(" -m pytest ") == 2 and serial["command"].count(" -m pytest ") == 1

    def suites(name):
        return [(s.get("name"), s.get("tests"), s.get("failures"), s.get("errors"), s.get("skipped"))
                for s in ET.parse(tmp_path / name).getroot().findall("testsuite")]
    assert suites("parallel.xml") == suites("serial.xml")


def test_plan_balances_untimed_gates_and_runs_timed_ones_alone_on_cuda():
    from gates import timings
    from gates.run import plan
    gates = registry.by_name([])
    known = {"lossless": 40.0, "combine": 10.0, "emit-count": 12.0, "predicate-split": 15.0}
    phases = plan(gates, 2, known, device="cuda")
    untimed, timed = phases
    assert [g.name for g in timed[0]] == [g.name for g in gates if g.timed] == ["speed-ab", "busy"]
    assert sorted(g.name for group in untimed for g in group) == sorted(g.name for g in gates if not g.timed)
    totals = sorted(sum(timings.estimate(g.name, known) for g in group) for group in untimed)
    smallest = min(timings.estimate(g.name, known) for g in gates if not g.timed)
    assert len(untimed) == 2 and totals[1] - totals[0] <= smallest
    assert plan(gates, 1, known) == [[gates]]  # one process, registry order: what prove's trees run
    assert plan(gates, 2, known, device="cuda") == phases  # deterministic
    # On the CPU speed decides nothing: every gate is balanced over the processes, in one phase.
    (cpu,) = plan(gates, 2, known, device="cpu")
    assert sorted(g.name for group in cpu for g in group) == sorted(g.name for g in gates) and len(cpu) == 2
    assert plan(gates, 2, known) == [cpu]  # no device given: the CPU


@pytest.mark.slow
def test_json_report_gives_status_cases_and_evidence(harness_run):
    result, written, _ = harness_run
    assert written == json.loads(json.dumps(result, default=str))
    gates = {g["name"]: g for g in written["gates"]}
    assert {n: g["status"] for n, g in gates.items()} == {
        "fake-green": "green", "fake-empty": "red", "fake-red": "red", "fake-error": "error",
        "fake-cuda-pass": "green" if torch.cuda.is_available() else "skipped",
        "reason-a": "green", "busy": "green" if torch.cuda.is_available() else "skipped"}
    assert gates["fake-green"]["num_cases"] == 2 and gates["fake-green"]["claims"] == {"ran": True}
    assert gates["fake-empty"]["reason"] == "ran zero cases"
    evidence = gates["fake-red"]["evidence"][0]
    assert evidence["case"] == {"k": 3}
    assert evidence["differences"] == [dict(what="emit_count", step=7, request_id=2, position=41, expected=3,
                                            actual=1, context="async vs sync")]
    assert "engine exploded" in gates["fake-error"]["reason"]
    assert gates["reason-a"]["num_cases"] > 0 and all(gates["reason-a"]["claims"].values())
    if not torch.cuda.is_available():
        assert "needs CUDA" in gates["busy"]["reason"]
    assert written["exit_status"] == 1 and written["summary"]["red"] == 2
    for g in written["gates"]:
        assert set(g) >= {"name", "purpose", "needs", "proven_against", "status", "reason", "num_cases",
                          "cases", "evidence", "measurements", "claims", "tests", "seconds"}


@pytest.mark.slow
def test_junit_report_is_well_formed_with_one_suite_per_gate(harness_run):
    result, _, tree = harness_run
    root = tree.getroot()
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == [g["name"] for g in result["gates"]]
    verdict = {name: s.find("testcase[@name='verdict']") for name, s in suites.items()}
    assert verdict["fake-green"].find("failure") is None
    assert verdict["fake-empty"].find("failure").get("message") == "ran zero cases"
    assert verdict["fake-error"].find("error") is not None
    if not torch.cuda.is_available():
        assert verdict["busy"].find("skipped") is not None
        assert verdict["fake-cuda-pass"].find("skipped") is not None
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())


def test_an_exit_status_is_non_zero_only_for_red_or_error():
    def gates(*statuses):
        return [report.GateResult(f"g{i}", status=s) for i, s in enumerate(statuses)]
    assert report.exit_status(gates("green", "skipped")) == 0
    assert report.exit_status(gates("green", "red")) == 1
    assert report.exit_status(gates("error")) == 1
    assert report.exit_status([]) == 1


STOPS_AT_RED = '''
from pathlib import Path
from gates.compare import Difference
CLAIMS = ()
def test_1_passes(gate_record):
    gate_record.case(n=1)
def test_2_goes_red(gate_record):
    gate_record.case(n=2)
    gate_record.check(Difference("token", 0, 0, 0, 1, 2), "first red")
def test_3_would_run_on(gate_record):
    gate_record.case(n=3)
    Path(__file__).with_suffix(".ran").write_text("ran")
'''


@pytest.mark.parametrize("stop", [False, True], ids=["every-test", "stop-at-red"])
def test_stop_at_red_ends_a_gate_at_its_first_failed_check_and_it_stays_red(tmp_path, stop):
    """prove's defect trees read only whether a gate is red, so they stop each gate at its first
    failed check: the gate's status and evidence are those of a full run, the later tests skipped."""
    from gates.run import run_gates
    module = tmp_path / "fake_stops.py"
    module.write_text(STOPS_AT_RED)
    gate = registry.Gate("fake-stops", module.stem, "stops at red", "cpu", module)
    result = run_gates([gate], str(tmp_path / "g.json"), quiet=True,
                       pytest_args=("--gates-stop-at-red",) if stop else ()).to_json()
    (g,) = result["gates"]
    assert g["status"] == "red" and g["evidence"][0]["message"] and "first red" in json.dumps(g["evidence"])
    assert [t["outcome"] for t in g["tests"]] == ["passed", "failed", "skipped" if stop else "passed"]
    assert module.with_suffix(".ran").exists() is not stop
