"""What a gate report judged, recorded in its environment so that the veto's verdict can refuse to
combine reports of different trees and the evidence names exactly what it covers: a hash of the
engine's, the gates' and the fixtures' sources (and the commit, where there is a git checkout), the
device, the model folder's shape, and the forwards the session judged (each gate's result names the
forwards its own engines ran)."""
import json
import platform
import subprocess
from pathlib import Path

from engine.veto import engine_source_hash, source_hash

REPO = Path(__file__).resolve().parent.parent
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "vocab_size", "max_position_embeddings")


def sources() -> dict[str, str]:
    """sha256 of each source tree a verdict depends on."""
    return {"engine": engine_source_hash(), "gates": source_hash(REPO / "gates", (".py", ".toml")),
            "fixtures": source_hash(REPO / "fixtures", (".py", ".json"))}


def commit() -> str | None:
    """HEAD's commit, with "+dirty" when engine/, gates/ or fixtures/ differ from it; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engine", "gates", "fixtures"], cwd=REPO,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def device_name(device: str) -> str:
    import torch
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def model_shape(model_dir: Path | None) -> dict:
    """The shape keys of the model folder's config.json (what a 1B report and a fixture report differ in)."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
    except (TypeError, OSError, json.JSONDecodeError):
        return {}
    return {k: raw[k] for k in SHAPE_KEYS if k in raw}


def judged(device: str, model_dir: Path | None, forwards: tuple[str, ...]) -> dict:
    return {"sources": sources(), "commit": commit(), "device_name": device_name(device),
            "model_shape": model_shape(model_dir), "forwards": list(forwards)}
