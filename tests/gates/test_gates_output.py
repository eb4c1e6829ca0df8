"""What `specgate gates run` shows and records: a line per finished gate (progress also when not
on a terminal), the gate table once (the command prints it, not pytest too), the model folder
actually used in the report's environment, and the paths it wrote."""
import json
import re

import pytest

from fixtures import TARGET_DIR
from gates.report import GateReport, GateResult


@pytest.mark.slow
def test_a_gate_run_prints_a_line_per_gate_its_table_once_and_records_the_model(tmp_path, capfd):
    """The real reason-a gate (seconds) through the command."""
    from specgate_cli import main
    json_path = tmp_path / "gates.json"
    assert main(["gates", "run", "reason-a", "--json", str(json_path)]) == 0
    out, err = capfd.readouterr()
    assert re.search(r"^specgate: gate reason-a green \(\d+ cases, \d+ s\)", err, re.M), err
    assert out.count("reason-a         green") == 1 and "reason-a         green" not in err  # one table
    assert f"wrote {json_path}" in out
    env = json.loads(json_path.read_text())["environment"]
    assert env["model"] == str(TARGET_DIR) and env["model_given"] is False
    # What it judged, for the veto's verdict: this tree's sources, the device, the model's shape.
    from engine.veto import engine_source_hash
    from gates.provenance import sources
    assert env["sources"] == sources() and env["sources"]["engine"] == engine_source_hash()
    assert env["forwards"] == ["reference"] and env["device_name"]
    assert env["model_shape"] == {k: v for k, v in json.loads((TARGET_DIR / "config.json").read_text()).items()
                                  if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "intermediate_size", "vocab_size",
                                           "max_position_embeddings")}
    assert env["commit"] is None or len(env["commit"].split("+")[0]) == 40


def test_gates_run_says_where_it_wrote_and_defaults_under_reports(monkeypatch, tmp_path, capsys):
    from gates import cli
    assert cli.default_json([]) == "reports/gates.json"
    assert cli.default_json(["reason-a"]) == "reports/gate-reason-a.json"
    seen = {}

    def fake_run(gates, json_path, junit_path, **kwargs):
        seen["json"] = json_path
        return GateReport([GateResult("reason-a", status="green")])
    monkeypatch.setattr("gates.run.run_gates", fake_run)
    monkeypatch.chdir(tmp_path)
    from specgate_cli import main
    assert main(["gates", "run", "reason-a"]) == 0
    assert seen["json"] == "reports/gate-reason-a.json" and (tmp_path / "reports").is_dir()
    assert "wrote reports/gate-reason-a.json" in capsys.readouterr().out
