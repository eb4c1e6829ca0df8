"""Identity of what a run used: model checksums, for reports that must be comparable."""
import hashlib
from pathlib import Path

from engine.loader import INDEX_FILE, WEIGHTS_FILE


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()


def weights_sha256(model_dir: Path) -> str:
    """sha256 of model.safetensors; for a sharded folder, of the index and every shard's sha256."""
    model_dir = Path(model_dir)
    if (model_dir / WEIGHTS_FILE).is_file() or not (model_dir / INDEX_FILE).is_file():
        return file_sha256(model_dir / WEIGHTS_FILE)
    h = hashlib.sha256((model_dir / INDEX_FILE).read_bytes())
    for shard in sorted(model_dir.glob("model-*-of-*.safetensors")):
        h.update(f"{shard.name}:{file_sha256(shard)}".encode())
    return h.hexdigest()


def model_checksums(target_dir, drafter_dir=None) -> dict:
    out = {"target": weights_sha256(target_dir)}
    if drafter_dir:
        out["drafter"] = file_sha256(Path(drafter_dir) / WEIGHTS_FILE)
    return out
