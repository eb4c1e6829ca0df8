"""Identity of what a run used: model checksums, for reports that must be comparable."""
import hashlib
from pathlib import Path

from engine.loader import WEIGHTS_FILE


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()


def model_checksums(target_dir=None, drafter_dir=None, with_drafter: bool = False) -> dict:
    from fixtures import DRAFTER_DIR, TARGET_DIR
    out = {"target": file_sha256(Path(target_dir or TARGET_DIR) / WEIGHTS_FILE)}
    if drafter_dir or with_drafter:
        out["drafter"] = file_sha256(Path(drafter_dir or DRAFTER_DIR) / WEIGHTS_FILE)
    return out
