"""`specgate gates verdict --record`: the evidence file the engine reads (engine/veto.py), written
for this tree's engine only, and never over a report it reads."""
import json

from gates.cli import main
from helpers.gate_reports import TREE, gate, model_report, on_own_folder, report


def test_record_writes_evidence_the_engine_reads_for_this_engine_only(tmp_path, capsys, monkeypatch):
    from engine import veto
    monkeypatch.delenv(veto.ENV_VAR, raising=False)
    this = {**TREE, "engine": veto.engine_source_hash()}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(sources=this)))
    evidence = tmp_path / "veto-evidence.json"
    assert main(["gates", "verdict", str(path), "--record", "--evidence", str(evidence)]) == 0
    assert f"wrote {evidence} (LIFT for engine {this['engine'][:12]})" in capsys.readouterr().out
    written = json.loads(evidence.read_text())
    assert (written["decision"], written["devices"], written["forwards"]) == ("LIFT", ["cuda"],
                                                                              ["reference", "compiled"])
    assert written["figures"]["speed-ab"] and written["reports"][0]["gates"]["busy"] == "green"
    assert {f["forward"] for f in written["figures"]["speed-ab"]} == {"reference", "compiled"}
    assert written["arms"] == ["graph"]
    assert written["attention_backends"] == ["sdpa"]  # results that name no backend ran sdpa, the old default
    assert veto.evidence_refusal("cuda", False, True, evidence, "sdpa") is None
    assert veto.evidence_refusal("cuda", True, True, evidence, "sdpa") is None  # compile=True, CUDA's default, too
    assert veto.use_async_runner("ngram", None, "cuda", graph=True, evidence=evidence, attention_backend="sdpa")
    assert "not paged" in veto.evidence_refusal("cuda", True, True, evidence)  # CUDA's default backend: not judged
    assert "not the eager arm" in veto.evidence_refusal("cuda", True, False, evidence)  # the eager arm stays vetoed
    path.write_text(json.dumps(report()))  # another engine's report
    assert main(["gates", "verdict", str(path), "--record", "--evidence", str(evidence)]) == 2
    assert "this tree's engine is" in capsys.readouterr().err


def test_record_never_writes_over_a_report(tmp_path, capsys, monkeypatch):
    """--record is a flag: `verdict --record A.json B.json` reads both reports (it once wrote the
    evidence over A.json), and --evidence naming a report read is refused with the report kept."""
    from gates import verdict as verdict_module
    written = []
    monkeypatch.setattr(verdict_module, "record", lambda v, reports, names, path: written.append(path) or path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        path.write_text(json.dumps(report()))
    assert main(["gates", "verdict", "--record", str(a), str(b)]) == 0
    assert written == [verdict_module.EVIDENCE_FILE] and json.loads(a.read_text()) == report()
    assert main(["gates", "verdict", str(a), "--record", "--evidence", str(a)]) == 2
    assert "is one of the reports read" in capsys.readouterr().err and json.loads(a.read_text()) == report()


def test_the_evidence_names_the_folder_a_gate_ran_on_beside_its_reports_target(tmp_path, monkeypatch):
    """A depth1b report's environment names the session's target, which the depth gate does not
    run on: each report's entry names the folders its gates ran on instead (`gate_models`)."""
    from engine import veto
    monkeypatch.delenv(veto.ENV_VAR, raising=False)
    this = {**TREE, "engine": veto.engine_source_hash()}
    depth1b = model_report("/repo/fixtures/target", names=("depth",), depth=on_own_folder(gate("depth")))
    paths = []
    for name, content in (("round", report(sources=this)), ("depth1b", depth1b | {
            "environment": depth1b["environment"] | {"sources": this}})):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(content))
    evidence = tmp_path / "veto-evidence.json"
    assert main(["gates", "verdict", *map(str, paths), "--record", "--evidence", str(evidence)]) == 0
    round_entry, depth_entry = json.loads(evidence.read_text())["reports"]
    assert round_entry["gate_models"] == {}
    assert depth_entry["model"] == "/repo/fixtures/target"
    assert depth_entry["gate_models"] == {"depth": on_own_folder(gate("depth"))["models"]}
    assert depth_entry["gate_models"]["depth"][0]["model_shape"]["hidden_size"] == 2048
