"""`--timed-arms` (gates/plugin.py) on fake gates, no engine built: a timed gate's tests of an arm
left out are deselected and that arm's claim is waived with the reason, whichever way the test
names its arm (`graph_arm`, or a `graph` flag); a gate that is not timed keeps every arm; the
report's environment names the arms measured; an unknown arm is refused."""
import pytest

from gates import registry
from gates.run import run_gates

ARMS_GATE = '''
import pytest

CLAIMS = ("eager arm", "graph arm")


@pytest.mark.parametrize("graph_arm", ["eager", "graph"])
def test_named_arm(gate_record, graph_arm):
    gate_record.case(arm=graph_arm)
    gate_record.occurred(f"{graph_arm} arm")


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_flag_arm(gate_record, graph):
    gate_record.case(arm="graph" if graph else "eager")


def test_no_arm(gate_record):
    gate_record.case(arm=None)
'''


def run_arms_gate(tmp_path, timed: bool, arms: str | None) -> tuple[dict, dict]:
    module = tmp_path / "fake_arms.py"
    module.write_text(ARMS_GATE)
    gate = registry.Gate("fake-arms", module.stem, "fake gate with arms", "cpu", module, timed=timed)
    report = run_gates([gate], str(tmp_path / "g.json"), quiet=True,
                       pytest_args=("--timed-arms", arms) if arms else ()).to_json()
    return report["gates"][0], report["environment"]


def arms_run(gate: dict) -> list:
    return sorted((c["test"].split("[")[0], c["arm"]) for c in gate["cases"])


def test_a_timed_gate_measures_only_the_arms_asked_and_names_the_one_left_out(tmp_path):
    gate, env = run_arms_gate(tmp_path, timed=True, arms="graph")
    assert gate["status"] == "green", gate["reason"]
    assert arms_run(gate) == [("test_flag_arm", "graph"), ("test_named_arm", "graph"), ("test_no_arm", None)]
    assert gate["waived_claims"] == {"eager arm": "not measured: --timed-arms graph"}
    assert env["timed_arms"] == ["graph"]


def test_by_default_and_for_a_gate_that_is_not_timed_every_arm_runs(tmp_path):
    for timed, arms in ((True, None), (False, "graph")):
        gate, env = run_arms_gate(tmp_path, timed=timed, arms=arms)
        assert gate["status"] == "green" and gate["waived_claims"] == {}, (timed, gate["reason"])
        assert len(arms_run(gate)) == 5 and ("test_named_arm", "eager") in arms_run(gate)
        assert gate["claims"] == {"eager arm": True, "graph arm": True}
        assert env["timed_arms"] == (["eager", "graph"] if arms is None else ["graph"])


def test_an_unknown_arm_is_refused(capsys):
    from gates.cli import main
    with pytest.raises(SystemExit):
        main(["gates", "run", "speed-ab", "--timed-arms", "warm"])
    assert "--timed-arms" in capsys.readouterr().err
