"""Shared set-up of the proof's tests: a fake repository the prover plants patches in."""
import subprocess
import tempfile
from pathlib import Path

import pytest

from mutants.proof import catalogue


@pytest.fixture
def proof_repo(tmp_path, monkeypatch):
    """proof_repo(files, patches): a fake repository for the prover (see fake_proof_repo)."""
    return lambda files, patches: fake_proof_repo(tmp_path, monkeypatch, files, patches)


def fake_proof_repo(tmp_path: Path, monkeypatch, files: dict[str, str], patches: dict[str, str]) -> Path:
    """tmp_path/repo: the four packages the prover copies, `files` (path -> text) and a git
    repository; `patches` (name -> diff) become the catalogue's patch folder, and the prover's
    temporary copies go under tmp_path/tmp."""
    repo = tmp_path / "repo"
    for package in ("engine", "gates", "mutants", "fixtures"):
        (repo / package).mkdir(parents=True)
        (repo / package / "__init__.py").write_text("")
    for path, text in files.items():
        (repo / path).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    folder = tmp_path / "patches"
    folder.mkdir()
    for name, diff in patches.items():
        (folder / f"{name}.diff").write_text(diff)
    monkeypatch.setattr(catalogue, "PATCHES", folder)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return repo
