"""The shape of the code: the top-level packages import one way, no module imports itself back
round a circle, the engine's core knows nothing of its benchmark, and no file grows past 300 lines
without saying why.

Layers, bottom to top (README, "Layout"):

    engine  <-  gates  <-  mutants  <-  fixtures, tests, specgate_cli.py, conftest.py

A file may import from its own layer and the layers below it, never above: the engine imports
none of the harness, the gates know no seeded defect, and the mutants know no fixture model.
Inside the engine, the benchmark (engine/bench/) sits on the core, which never imports it.
Imports are read with `ast`, including those inside functions, so a deferred import counts too.
"""
import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOP = 3
LAYERS = {"engine": 0, "gates": 1, "mutants": 2, "fixtures": TOP, "tests": TOP, "specgate_cli": TOP,
          "conftest": TOP, "scripts": TOP}
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
        (f"{path.relative_to(REPO)} has {len(path.read_text().splitlines())} lines: split it, "
         f"or say '{REASON} ...' at its top")


# ---- modules: no circle, and the engine's core below its benchmark ---------------------------------
PACKAGES = ("engine", "gates", "mutants", "fixtures")
BENCH = "engine.bench"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules a file imports, at any depth (`from pkg import mod` names the module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return (found & modules) - {name}


def import_graph(files: list[Path]) -> dict[str, set[str]]:
    modules = {module_name(p) for p in files}
    return {module_name(p): module_imports(p, modules) for p in files}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports once, as the modules along it (a depth-first search's back edges)."""
    found, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = "done"
    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def package_files() -> list[Path]:
    return [p for p in project_files() if layer_of(p) in PACKAGES or p.name == "specgate_cli.py"]


def test_no_module_imports_itself_back_round_a_circle():
    assert circles(import_graph(package_files())) == []


def test_the_engine_core_never_imports_its_benchmark():
    graph = import_graph(package_files())
    core = {m: deps for m, deps in graph.items() if m.startswith("engine") and not m.startswith(BENCH)}
    assert {m: sorted(d for d in deps if d.startswith(BENCH)) for m, deps in core.items()
            if any(d.startswith(BENCH) for d in deps)} == {}


def test_the_circle_check_finds_a_circle_through_a_function_level_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "mutants" / "mutation").mkdir(parents=True)
    report = tmp_path / "mutants" / "mutation" / "report.py"
    report.write_text("from mutants.mutation.diff import place\n")
    diff = tmp_path / "mutants" / "mutation" / "diff.py"
    diff.write_text("def place():\n    from . import report\n")
    assert circles(import_graph([report, diff])) == [["mutants.mutation.diff", "mutants.mutation.report",
                                                      "mutants.mutation.diff"]]
