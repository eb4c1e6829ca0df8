"""Identity of what a run used: model checksums, for reports that must be comparable."""
import hashlib
from pathlib import Path

from engine.loader import WEIGHTS_FILE


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()


def model_checksums(target_dir, drafter_dir=None) -> dict:
    out = {"target": file_sha256(Path(target_dir) / WEIGHTS_FILE)}
    if drafter_dir:
        out["drafter"] = file_sha256(Path(drafter_dir) / WEIGHTS_FILE)
    return out
