"""Gate reach: which engine lines and branches each gate's cases execute (coverage.py).

`specgate gates run --coverage` runs the gates under coverage.py with branch measurement; the
gates plugin switches coverage's context to the running gate's name, so the data file holds, per
gate, the lines and arcs it executed. Here:

- `gate_figures`: per gate, engine statements and branches reached (and their totals);
- `unreached_branches`: the branches of the request path (REQUEST_PATH) that no gate takes, each
  named by its file and the text of its source and destination lines (line numbers move; the text
  is what a reviewer reads);
- `judge`: those against the reviewed list, gates/unreached-branches.toml (each entry with a
  one-line reason). An unreached branch not listed fails, and so does a stale entry (its branch
  is taken now, or its code is gone), as mutants/mutation/equivalent-mutants.toml does for mutants.
"""
import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path

import coverage

REVIEWED = Path(__file__).resolve().parent / "unreached-branches.toml"
# The request path: every module a request passes through from add_request to its last token,
# and the bench's folding of legs into figures (only those functions of engine/bench/legs.py).
REQUEST_PATH = {"engine/scheduler.py": None, "engine/block_manager.py": None, "engine/runner.py": None,
                "engine/device_state.py": None,
                "engine/step_plan.py": None, "engine/llm.py": None, "engine/verify.py": None,
                "engine/sampling.py": None, "engine/proposers.py": None, "engine/block_drafter.py": None,
                "engine/bench/metrics.py": None, "engine/bench/legs.py": ("is_warm", "fold", "run_leg", "run_bench")}
EXIT = "exit"


@dataclass(frozen=True, order=True)
class Branch:
    file: str       # relative to the repository root
    line: int
    to: int         # negative: the branch leaves the code object
    source: str     # the text of the two lines, stripped
    target: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}->{self.to if self.to > 0 else EXIT}  {self.source!r} -> {self.target!r}"


def _coverage(data_file: Path, root: Path) -> coverage.Coverage:
    cov = coverage.Coverage(data_file=str(data_file), branch=True, source=[str(root / "engine")])
    cov.load()
    return cov


def _engine_files(cov: coverage.Coverage, root: Path) -> dict[str, str]:
    """Measured engine files: path relative to root -> the path the data holds."""
    out = {}
    for f in cov.get_data().measured_files():
        rel = (Path(f).resolve().relative_to(root.resolve()) if Path(f).resolve().is_relative_to(root.resolve())
               else None)
        if rel is not None and rel.parts[0] == "engine":
            out[rel.as_posix()] = f
    return out


def gate_figures(data_file: Path, root: Path) -> dict[str, dict]:
    """gate -> {statements, statements_reached, branches, branches_taken} over engine/."""
    cov = _coverage(data_file, root)
    data = cov.get_data()
    files = _engine_files(cov, root)
    out = {}
    for gate in sorted(c for c in data.measured_contexts() if c):
        data.set_query_contexts([gate])
        fig = dict(statements=0, statements_reached=0, branches=0, branches_taken=0)
        for measured in files.values():
            n = cov._analyze(measured).numbers
            fig["statements"] += n.n_statements
            fig["statements_reached"] += n.n_executed
            fig["branches"] += n.n_branches
            fig["branches_taken"] += n.n_branches - n.n_missing_branches
        out[gate] = fig
    data.set_query_contexts(None)
    return out


def _function_lines(source: str, names) -> set[int]:
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name in names:
            lines |= set(range(node.lineno, node.end_lineno + 1))
    return lines


def unreached_branches(data_file: Path, root: Path, request_path: dict = REQUEST_PATH) -> list[Branch]:
    """Branches of the request path that no context (no gate) took."""
    cov = _coverage(data_file, root)
    cov.get_data().set_query_contexts(None)
    files = _engine_files(cov, root)
    out = []
    for rel, only in request_path.items():
        path = root / rel
        text = path.read_text().splitlines()
        keep = _function_lines(path.read_text(), only) if only else None
        if rel in files:
            missing = cov._analyze(files[rel]).missing_branch_arcs()
        else:  # never imported by any gate: every branch is unreached
            missing = _all_branches(cov, path)
        for line, targets in sorted(missing.items()):
            if keep is not None and line not in keep:
                continue
            for to in sorted(targets):
                out.append(Branch(rel, line, to, text[line - 1].strip(),
                                  text[to - 1].strip() if to > 0 else EXIT))
    return out


def _all_branches(cov: coverage.Coverage, path: Path) -> dict[int, list[int]]:
    from coverage.python import PythonParser
    parser = PythonParser(filename=str(path))
    parser.parse_source()
    exits = parser.exit_counts()
    out: dict[int, list[int]] = {}
    for a, b in parser.arcs():
        if a > 0 and exits.get(a, 0) > 1:
            out.setdefault(a, []).append(b)
    return out


def load_reviewed(path: Path = REVIEWED) -> list[dict]:
    entries = tomllib.loads(path.read_text()).get("branch", []) if path.exists() else []
    for e in entries:
        missing = {"file", "source", "target", "reason"} - e.keys()
        if missing or not str(e.get("reason", "")).strip():
            raise ValueError(f"{path}: entry {e} needs file, source, target and a reason")
    return entries


def _matches(entry: dict, b: Branch) -> bool:
    return (entry["file"], entry["source"], entry["target"]) == (b.file, b.source, b.target)


def judge(unreached: list[Branch], reviewed: list[dict]) -> tuple[list[Branch], list[dict]]:
    """(unreached branches no entry reviews, entries that match no unreached branch: stale)."""
    unreviewed = [b for b in unreached if not any(_matches(e, b) for e in reviewed)]
    stale = [e for e in reviewed if not any(_matches(e, b) for b in unreached)]
    return unreviewed, stale


def html_report(data_file: Path, root: Path, directory: Path) -> None:
    """coverage.py's HTML report of engine/, each line showing the gates that ran it."""
    cov = _coverage(data_file, root)
    cov.html_report(directory=str(directory), show_contexts=True, title="specgate: engine lines each gate reaches")


def summary(result) -> str:
    """The reach part of a `gates run --coverage` report (a gates.report.GateReport), for the terminal."""
    lines = ["gate reach (engine/): statements reached / total, branches taken / total"]
    for g in result.gates:
        c = g.coverage
        if c:
            lines.append(f"  {g.name:<16} {c['statements_reached']:>5} / {c['statements']:<5} "
                         f"{c['branches_taken']:>5} / {c['branches']}")
    reach = result.reach
    lines.append(f"HTML: {reach['html']}/index.html")
    if not reach["judged"]:
        lines.append("unreached request-path branches: not judged (only when every gate that can run here ran)")
        return "\n".join(lines)
    lines.append(f"unreached request-path branches: {len(reach['unreached'])}, of which "
                 f"{len(reach['unreached']) - len(reach['unreviewed'])} reviewed ({REVIEWED.name})")
    lines += [f"  NOT REVIEWED {b}" for b in reach["unreviewed"]]
    lines += [f"  STALE entry (its branch is taken now, or its code is gone): {e}" for e in reach["stale"]]
    return "\n".join(lines)
