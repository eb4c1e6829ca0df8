"""The committed fixtures are intact (checksum manifest), small, and described truthfully."""
import json
import math
import re
import shutil
import subprocess
import sys

import pytest
from safetensors import safe_open

from fixtures import FIXTURES_DIR, TARGET_DIR
from fixtures.manifest import MANIFEST_NAME, MODEL_DIRS, fixture_files, verify_manifest, write_manifest


def test_manifest_matches_the_committed_fixtures():
    assert verify_manifest() == []


def test_manifest_covers_every_fixture_model_folder():
    listed = json.loads((FIXTURES_DIR / MANIFEST_NAME).read_text())["files"]
    present = [name for name in MODEL_DIRS if (FIXTURES_DIR / name).is_dir()]
    assert {rel.split("/")[0] for rel in listed} == set(present)
    for name in ("config.json", "model.safetensors", "README.md", "training.json"):
        assert f"target/{name}" in listed


@pytest.fixture
def fixtures_copy(tmp_path):
    root = tmp_path / "fixtures"
    root.mkdir()
    for name in MODEL_DIRS:
        if (FIXTURES_DIR / name).is_dir():
            shutil.copytree(FIXTURES_DIR / name, root / name)
    shutil.copy(FIXTURES_DIR / MANIFEST_NAME, root / MANIFEST_NAME)
    assert verify_manifest(root) == []  # the control: an undamaged copy passes
    return root


def flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    offset = len(data) // 2 if offset is None else offset
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped byte in the weights": (lambda root: flip_byte(root / "target/model.safetensors"),
                                    r"^target/model\.safetensors: damaged: sha256 "),
    "flipped byte in the config": (lambda root: flip_byte(root / "target/config.json", 0),
                                   r"^target/config\.json: damaged: sha256 "),
    "truncated weights": (lambda root: (root / "target/model.safetensors").write_bytes(
        (root / "target/model.safetensors").read_bytes()[:1000]),
        r"^target/model\.safetensors: damaged: 1000 bytes, manifest\.json says 6698696$"),
    "missing file": (lambda root: (root / "target/training.json").unlink(),
                     r"^target/training\.json: missing \(listed in manifest\.json\)$"),
    "extra file": (lambda root: (root / "target/notes.txt").write_text("hi"),
                   r"^target/notes\.txt: extra file, not in manifest\.json$"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_copy_is_detected_by_name(fixtures_copy, damage):
    apply, message = DAMAGE[damage]
    apply(fixtures_copy)
    problems = verify_manifest(fixtures_copy)
    assert len(problems) == 1, problems
    assert re.match(message, problems[0]), problems[0]


def test_missing_or_invalid_manifest_is_reported(fixtures_copy):
    (fixtures_copy / MANIFEST_NAME).write_text("{")
    assert re.match(r".*manifest\.json is not a valid manifest", verify_manifest(fixtures_copy)[0])
    (fixtures_copy / MANIFEST_NAME).unlink()
    assert re.match(r".*manifest\.json is missing; run `python -m fixtures\.manifest --write`",
                    verify_manifest(fixtures_copy)[0])


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fixtures.manifest", *args], capture_output=True, text=True,
                          cwd=FIXTURES_DIR.parent)


def test_cli_check_exits_1_naming_the_damaged_file_and_write_accepts_it(fixtures_copy):
    flip_byte(fixtures_copy / "target/model.safetensors")
    damaged = run_cli("--check", "--root", str(fixtures_copy))
    assert damaged.returncode == 1
    assert "target/model.safetensors: damaged" in damaged.stderr
    assert run_cli("--write", "--root", str(fixtures_copy)).returncode == 0
    accepted = run_cli("--check", "--root", str(fixtures_copy))
    assert accepted.returncode == 0, accepted.stderr
    assert f"ok: {len(fixture_files(fixtures_copy))} fixture files" in accepted.stdout


def test_write_then_verify_round_trips(fixtures_copy):
    (fixtures_copy / "target/extra.bin").write_bytes(b"\0" * 10)
    write_manifest(fixtures_copy)
    assert verify_manifest(fixtures_copy) == []
    assert "target/extra.bin" in json.loads((fixtures_copy / MANIFEST_NAME).read_text())["files"]


# ---- the target's model card ---------------------------------------------------------------

@pytest.fixture(scope="module")
def card():
    return (TARGET_DIR / "README.md").read_text()


@pytest.fixture(scope="module")
def training():
    return json.loads((TARGET_DIR / "training.json").read_text())


def test_model_card_states_the_losses_in_training_json(card, training):
    rows = {m[1]: (float(m[2]), float(m[3]))
            for m in re.finditer(r"^\|\s*(train|held out)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|$", card, re.M)}
    assert rows == {
        "train": (training["train_loss_nats_per_byte"], training["train_bits_per_byte"]),
        "held out": (training["heldout_loss_nats_per_byte"], training["heldout_bits_per_byte"]),
    }


def test_model_card_states_size_parameters_and_corpus(card, training):
    num_params = int(re.search(r"Parameter count: \*\*([\d,]+)\*\*", card)[1].replace(",", ""))
    size = int(re.search(r"`model\.safetensors`\s+is ([\d,]+) bytes", card)[1].replace(",", ""))
    assert num_params == training["num_parameters"]
    assert size == (TARGET_DIR / "model.safetensors").stat().st_size
    with safe_open(str(TARGET_DIR / "model.safetensors"), "pt") as f:  # tied: lm_head stored once
        assert sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys()) == num_params
    assert f"**`{training['corpus']['fingerprint']}`**" in card
    assert f"steps          | {training['steps']}" in card


def test_target_weights_are_small():
    assert (TARGET_DIR / "model.safetensors").stat().st_size < 8_000_000
