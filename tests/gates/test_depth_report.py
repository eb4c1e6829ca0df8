"""The depth gate's report names the folder it ran on: its plan's deep folder (`tiny-deep` on the
CPU, `llama-1b-deep` on CUDA), in its result's `models`, never the session's target that the
report's environment describes (`model`, `model_shape`: the fixture target unless --model names
one). The verdict's side, that such a folder adds no model to the per-model rule, is in
test_verdict.py."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench.models import config_dict, shape_named
from gates import registry
from gates.depth import plan_for
from gates.provenance import SHAPE_KEYS

REPO = Path(__file__).resolve().parents[2]


def shape_keys(shape: str) -> dict:
    """The shape keys the report records (gates/provenance.py) of a benchmark shape's folder."""
    return {k: v for k, v in config_dict(shape_named(shape)).items() if k in SHAPE_KEYS}


OWN_FOLDER = '''
import json
from engine.bench.models import config_dict, shape_named
CLAIMS = ()
def test_on_its_own_folder(gate_record, tmp_path):
    folder = tmp_path / "written"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config_dict(shape_named("{shape}"))))
    gate_record.model(folder, "{shape}")
    gate_record.model(folder, "{shape}")  # once per folder, however many tests name it
    gate_record.case()
'''


def test_a_gate_on_a_folder_of_its_own_names_it_with_its_shape_the_cuda_plans_1b_folder(tmp_path):
    """On CUDA the depth gate runs on the 1B shape with 40,960 positions (a 2.5 GB folder: written
    here as its config alone); the report names that shape, not the environment's target. A gate
    that names no folder of its own ran the target: its `models` is empty."""
    from gates.run import run_gates
    shape = plan_for("cuda", "ci").shape
    assert shape == "llama-1b-deep"
    own = tmp_path / "fake_own_folder.py"
    own.write_text(OWN_FOLDER.replace("{shape}", shape))
    target = tmp_path / "fake_on_target.py"
    target.write_text("CLAIMS = ()\ndef test_on_the_target(gate_record):\n    gate_record.case()\n")
    gates = [registry.Gate("fake-own-folder", own.stem, "on its own folder", "cpu", own),
             registry.Gate("fake-on-target", target.stem, "on the target", "cpu", target)]
    result = run_gates(gates, str(tmp_path / "g.json"), quiet=True).to_json()
    own_result, target_result = result["gates"]
    assert own_result["status"] == "green" and target_result["models"] == []
    (model,) = own_result["models"]
    assert model["name"] == shape and model["model_shape"] == shape_keys(shape)
    assert model["model_shape"]["hidden_size"] == 2048 and model["model_shape"]["max_position_embeddings"] == 40960
    assert result["environment"]["model_shape"] != model["model_shape"]  # the environment: the fixture target


@pytest.mark.slow
def test_the_depth_gate_on_the_cpu_names_tiny_deep_not_the_environments_target(tmp_path, cli_env):
    """`specgate gates run depth --device cpu` (about 15 s): the gate runs on `tiny-deep` (16,384
    positions; the fixture target holds 1,024, fewer than the gate's 4,072) and says so."""
    path = tmp_path / "depth.json"
    proc = subprocess.run([sys.executable, "-m", "specgate_cli", "gates", "run", "depth", "--device", "cpu",
                           "--json", str(path)], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    written = json.loads(path.read_text())
    (depth,) = written["gates"]
    assert depth["status"] == "green", depth["reason"]
    assert [(m["name"], m["model_shape"]) for m in depth["models"]] == [("tiny-deep", shape_keys("tiny-deep"))]
    assert Path(depth["models"][0]["folder"]).name == "tiny-deep"
    env = written["environment"]
    assert env["model_given"] is False and env["model_shape"] != shape_keys("tiny-deep")
