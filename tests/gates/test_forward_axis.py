"""The gates' `forward` axis (gates/conftest.py, gates/plugin.py) on fake gates, no engine built: on a
cuda device a forward-dependent gate runs each engine-building test once per judged forward, each
engine on its test's forward; on the CPU the reference alone, and a test marked forwards(...) only
when the session judges those forwards (CPU: --forwards, or --deep); every forward asked for is a
claim, so a gate whose engines never ran the compiled forward is red; the report names the forwards
each gate's engines ran and the ones the session judged."""
import json
from types import SimpleNamespace

import pytest

from gates import registry

AXIS_GATE = '''
from types import SimpleNamespace

import pytest

from gates.conftest import forward, pytest_generate_tests  # noqa: F401  the axis, as for a module under gates/
from gates.plugin import SESSION_PLUGIN

CLAIMS = ("ran",)
IGNORES_COMPILE = {ignores}


def fake_llm(compile, **kwargs):
    """An engine as the gates see it: its config's forward; IGNORES_COMPILE: a factory that drops compile=."""
    return SimpleNamespace(config=SimpleNamespace(forward="compiled" if compile and not IGNORES_COMPILE
                                                  else "reference",
                                                  attention_backend=kwargs.get("attention_backend", "sdpa")),
                           kwargs=kwargs)


@pytest.fixture(scope="session")
def make_llm(request):
    session = request.config.pluginmanager.get_plugin(SESSION_PLUGIN)
    return lambda judged=True, **kwargs: session.build_engine(fake_llm, judged, **kwargs)


@pytest.fixture(scope="module")
def module_engine(make_llm, forward):
    return make_llm(judged=False)


def test_builds_an_engine(make_llm, gate_record, module_engine):
    llm = make_llm(spec="ngram")
    gate_record.case(built=llm.config.forward, module=module_engine.config.forward)
    gate_record.occurred("ran")


def test_builds_none(gate_record):
    gate_record.case(built=None)


@pytest.mark.forwards("reference", "compiled")
def test_runs_both_itself(make_llm, gate_record):
    gate_record.case(built=[make_llm(compile=c).config.forward for c in (False, True)])
'''


def run_axis_gate(tmp_path, device="cpu", forwards=None, deep=False, ignores_compile=False, monkeypatch=None):
    from gates.run import run_gates
    module = tmp_path / "fake_axis.py"
    module.write_text(AXIS_GATE.format(ignores=ignores_compile))
    gate = registry.Gate("fake-axis", module.stem, "fake forward-dependent gate", "cpu", module, forward_axis=True)
    if deep:
        monkeypatch.setenv("HYPOTHESIS_PROFILE", "deep")
    report = run_gates([gate], str(tmp_path / "g.json"), quiet=True, device=device,
                       pytest_args=("--forwards", forwards) if forwards else ()).to_json()
    return report["gates"][0], report["environment"]


def cases_by_test(gate: dict) -> dict[str, list[dict]]:
    out = {}
    for case in gate["cases"]:
        out.setdefault(case["test"], []).append({k: v for k, v in case.items() if k != "test"})
    return out


def test_on_cuda_each_engine_building_test_runs_once_per_forward(tmp_path):
    gate, env = run_axis_gate(tmp_path, device="cuda")
    assert gate["status"] == "green", gate["reason"]
    assert cases_by_test(gate) == {
        "test_builds_an_engine[reference]": [{"forward": "reference", "built": "reference", "module": "reference"}],
        "test_builds_an_engine[compiled]": [{"forward": "compiled", "built": "compiled", "module": "compiled"}],
        "test_builds_none": [{"built": None}],
        "test_runs_both_itself": [{"built": ["reference", "compiled"]}]}
    assert gate["forwards"] == ["reference", "compiled"] and env["forwards"] == ["reference", "compiled"]
    assert gate["claims"] == {"ran": True, "reference forward": True, "compiled forward": True}
    assert gate["attention_backends"] == ["sdpa"]  # what its engines' configs ran, for the verdict's evidence


def test_on_the_cpu_the_reference_alone_and_no_test_ids_change(tmp_path):
    gate, env = run_axis_gate(tmp_path)
    assert gate["status"] == "green", gate["reason"]
    assert sorted(cases_by_test(gate)) == ["test_builds_an_engine", "test_builds_none"]  # forwards(...) deselected
    assert gate["forwards"] == ["reference"] and env["forwards"] == ["reference"]
    assert gate["claims"] == {"ran": True}


@pytest.mark.parametrize("how", ["--forwards", "--deep"])
def test_the_cpu_judges_the_compiled_forward_by_the_marked_tests_alone(tmp_path, monkeypatch, how):
    gate, env = run_axis_gate(tmp_path, forwards="reference,compiled" if how == "--forwards" else None,
                              deep=how == "--deep", monkeypatch=monkeypatch)
    assert gate["status"] == "green", gate["reason"]
    cases = cases_by_test(gate)
    assert cases["test_builds_an_engine"] == [{"built": "reference", "module": "reference"}]  # no compiled axis
    assert cases["test_runs_both_itself"] == [{"built": ["reference", "compiled"]}]
    assert gate["forwards"] == ["reference", "compiled"] and env["forwards"] == ["reference", "compiled"]
    assert gate["claims"] == {"ran": True, "reference forward": True, "compiled forward": True}


def test_a_gate_whose_engines_never_ran_the_compiled_forward_is_red(tmp_path):
    """The negative control: a factory that drops compile= runs the reference forward in the
    compiled arm; the claim "compiled forward" never occurs."""
    gate, _ = run_axis_gate(tmp_path, device="cuda", ignores_compile=True)
    assert gate["status"] == "red" and gate["reason"] == "claimed but never occurred: compiled forward"
    assert gate["forwards"] == ["reference"]


@pytest.mark.parametrize("ignores_compile", [False, True])
def test_on_cuda_one_judged_forward_is_the_one_the_engines_run(tmp_path, ignores_compile):
    """--forwards compiled on a cuda device: every engine-building test runs the compiled forward and
    the gate claims it (a factory that drops compile= leaves the claim unmet: red), never the
    reference forward under a report that says compiled (seen on the H200, 2026-12-03)."""
    gate, env = run_axis_gate(tmp_path, device="cuda", forwards="compiled", ignores_compile=ignores_compile)
    assert env["forwards"] == ["compiled"]
    if ignores_compile:
        assert gate["status"] == "red" and gate["reason"] == "claimed but never occurred: compiled forward"
        return
    assert gate["status"] == "green", gate["reason"]
    assert cases_by_test(gate)["test_builds_an_engine[compiled]"] == [
        {"forward": "compiled", "built": "compiled", "module": "compiled"}]
    assert "test_builds_an_engine" not in cases_by_test(gate)
    assert gate["forwards"] == ["compiled"] and gate["claims"]["compiled forward"] is True


def test_forwards_the_session_cannot_judge_are_refused(tmp_path):
    gate, _ = run_axis_gate(tmp_path, forwards="reference,fused")
    assert gate["status"] == "error"


def test_the_command_takes_only_the_engine_s_forwards(capsys):
    from engine.config import FORWARDS
    from gates.cli import main
    assert registry.FORWARDS == FORWARDS
    with pytest.raises(SystemExit):
        main(["gates", "run", "emit-count", "--forwards", "reference,reference"])
    assert "expected distinct values out of reference, compiled" in capsys.readouterr().err


def test_an_engine_outside_a_gate_test_is_built_on_the_reference_forward():
    """build_engine with no running test (a session fixture set up outside a gate): the reference."""
    from gates.plugin import GateSession
    session = GateSession(SimpleNamespace(), ())
    llm = session.build_engine(lambda compile, **kw: SimpleNamespace(config=SimpleNamespace(
        forward="compiled" if compile else "reference")))
    assert llm.config.forward == "reference" and session.forwards_run == {}


def test_a_report_names_the_forwards_its_gates_ran(tmp_path):
    """GateResult.forwards survives the JSON round trip (what the verdict reads)."""
    from gates.report import GateReport
    gate, env = run_axis_gate(tmp_path, device="cuda")
    data = json.loads((tmp_path / "g.json").read_text())
    assert GateReport.from_json(data).gates[0].forwards == ["reference", "compiled"]
