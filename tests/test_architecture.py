"""The shape of the code: the top-level packages import one way, and no file grows past 300 lines
without saying why.

Layers, bottom to top (README, "Layout"):

    engine  <-  gates  <-  mutants  <-  fixtures, tests, specgate_cli.py, conftest.py

A file may import from its own layer and the layers below it, never above: the engine imports
none of the harness, the gates know no seeded defect, and the mutants know no fixture model.
Imports are read with `ast`, including those inside functions, so a deferred import counts too.
"""
import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOP = 3
LAYERS = {"engine": 0, "gates": 1, "mutants": 2, "fixtures": TOP, "tests": TOP, "specgate_cli": TOP,
          "conftest": TOP, "strategies": TOP}  # tests/strategies.py is imported as `strategies`
SKIPPED_DIRS = {".git", ".venv", "build", "reports", "__pycache__", ".hypothesis"}
MAX_LINES = 300
REASON = "Over 300 lines because"


def project_files() -> list[Path]:
    return sorted(p for p in REPO.rglob("*.py")
                  if not SKIPPED_DIRS & set(p.relative_to(REPO).parts))


def layer_of(path: Path) -> str:
    rel = path.relative_to(REPO)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import in the file, at any depth; relative imports are
    of the file's own package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, layer_of(path) if node.level else node.module.split(".")[0]))
    return found


def upward_imports(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        here = layer_of(path)
        for line, module in imported_modules(path):
            if module in LAYERS and LAYERS[module] > LAYERS[here]:
                bad.append(f"{path.relative_to(REPO)}:{line}: {here} imports {module}")
    return bad


def test_the_layers_are_the_top_level_folders():
    assert {layer_of(p) for p in project_files()} <= set(LAYERS), \
        "a new top-level package or module: give it a layer here and in README's Layout"


def test_no_import_runs_back_up_the_layers():
    assert upward_imports(project_files()) == []


def test_the_import_check_sees_imports_inside_functions(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "engine").mkdir()
    deferred = tmp_path / "engine" / "x.py"
    deferred.write_text("import torch\n\n\ndef f():\n    from fixtures import TARGET_DIR\n    return TARGET_DIR\n")
    relative = tmp_path / "engine" / "y.py"
    relative.write_text("from . import x\nfrom engine.x import f\n")
    assert upward_imports([deferred, relative]) == ["engine/x.py:5: engine imports fixtures"]


def opening_text(source: str) -> str:
    """The module docstring and the comment lines before it."""
    comments = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        comments.append(line)
    return "\n".join(comments) + "\n" + (ast.get_docstring(ast.parse(source)) or "")


@pytest.mark.parametrize("path", [p for p in project_files()
                                  if len(p.read_text().splitlines()) > MAX_LINES],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_a_file_over_300_lines_says_why_in_its_opening(path):
    assert REASON in opening_text(path.read_text()), \
        f"{path.relative_to(REPO)} has {len(path.read_text().splitlines())} lines: split it, or say '{REASON} ...' at its top"
