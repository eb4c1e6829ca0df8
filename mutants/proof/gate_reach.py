"""Which gates can run a function of the gates' checking code: the static reach that restricts a
gate mutant's proof (mutants/proof/gate_mutants.py) to the gates, and so the defects, it can change.

A gate run executes the gate's module and the framework (FRAMEWORK: `gates run`, the plugin and
the gates' conftest); a function of gates/ runs in it only if something that runs names it. So,
over the gates/ modules the run can load, starting from those:

- a unit is a function (top-level, or a method of a top-level class; nested functions belong to
  the function around them) or a module's import-time code (everything but function bodies);
- reached from the start: every unit of the gate's module (pytest calls its tests by no name we
  read), every unit of the framework but its fixtures that are not autouse (pytest calls a
  fixture by the parameter name that asks for it), and the import-time code of a loaded module;
- a module is loaded when a reached unit imports it (at the top, or inside a function);
- a function is reached when a reached unit names it (a name, an attribute, an imported name, a
  parameter name, or a string passed to a call that reads as one: getattr, getfixturevalue), or
  when it is a dunder
  (`__post_init__`, `__str__`: called by the language, not by name).

This over-approximates (a name used for another object counts), never under: a function no
reached unit names cannot run in that gate's run, on any tree, so its mutants cannot change that
gate's verdict.
"""
import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FRAMEWORK = ("gates/plugin.py", "gates/conftest.py")  # the pytest session every gate runs in
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def units(module: ast.Module) -> dict[str, list[ast.AST]]:
    """mutmut's name of each function (`x_f`, `xǁClassǁf`) -> [its node]; '' -> the import-time
    code (a function's decorators and defaults, a class's bases, fields and decorators run too)."""
    out: dict[str, list[ast.AST]] = {"": []}
    for node in module.body:
        if isinstance(node, FUNCTIONS):
            out[f"x_{node.name}"] = [node]
            out[""] += [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
        elif isinstance(node, ast.ClassDef):
            out[""] += [*node.decorator_list, *node.bases, *node.keywords]
            for member in node.body:
                if isinstance(member, FUNCTIONS):
                    out[f"xǁ{node.name}ǁ{member.name}"] = [member]
                    out[""] += member.decorator_list
                else:
                    out[""].append(member)
        else:
            out[""].append(node)
    return out


def names_in(nodes: list[ast.AST]) -> set[str]:
    """The names a piece of code uses: names, attributes, imported names, parameters, and strings
    passed to a call that read as a name."""
    out = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Name):
                out.add(node.id)
            elif isinstance(node, ast.Attribute):
                out.add(node.attr)
            elif isinstance(node, ast.alias):
                out.add(node.asname or node.name.rpartition(".")[2])
            elif isinstance(node, ast.arg):
                out.add(node.arg)
            elif isinstance(node, ast.Call):  # getattr(x, "f"), request.getfixturevalue("f")
                out |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        and a.value.isidentifier()}
    return out


def gates_imports(nodes: list[ast.AST], repo: Path = REPO) -> set[str]:
    """The gates/ modules a piece of code imports, as paths relative to the repository."""
    found = set()
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "gates":
                    found |= {f"gates/{a.name}.py" for a in node.names}
                elif node.module.startswith("gates."):
                    found.add(node.module.replace(".", "/") + ".py")
            elif isinstance(node, ast.Import):
                found |= {a.name.replace(".", "/") + ".py" for a in node.names if a.name.startswith("gates.")}
    return {f for f in found if (repo / f).is_file()}


def plain_name(key: str) -> str:
    """A function's own name from mutmut's ('x_f', 'xǁClassǁf' -> 'f')."""
    return key.rpartition("ǁ")[2] if key.startswith("xǁ") else key.removeprefix("x_")


def _is_dunder(key: str) -> bool:
    name = plain_name(key)
    return name.startswith("__") and name.endswith("__")


def _called_by_pytest(node: ast.AST) -> bool:
    """Whether pytest runs a framework function without being asked by name: all but a fixture
    that is not autouse."""
    for d in getattr(node, "decorator_list", []):
        text = ast.unparse(d)
        if "fixture" in text:
            return "autouse=True" in text
    return True


def reached(gate_file: str, repo: Path = REPO, framework: tuple[str, ...] = FRAMEWORK) -> dict[str, set[str]]:
    """module path -> mutmut's names of its functions that a run of the gate whose module is
    `gate_file` (relative to the repository) can execute, for every gates/ module the run loads."""
    loaded: dict[str, dict[str, list[ast.AST]]] = {}
    done: set[tuple[str, str]] = set()
    names: set[str] = set()
    todo = [(rel, "") for rel in (gate_file, *framework)]
    for rel in (gate_file, *framework):
        loaded[rel] = units(_tree(repo / rel))
        todo += [(rel, key) for key, nodes in loaded[rel].items()
                 if key and (rel == gate_file or _called_by_pytest(nodes[0]))]
    while todo:
        while todo:
            rel, key = todo.pop()
            if (rel, key) in done:
                continue
            done.add((rel, key))
            nodes = loaded[rel][key]
            names |= names_in(nodes)
            for new in sorted(gates_imports(nodes, repo) - set(loaded)):
                loaded[new] = units(_tree(repo / new))
                todo.append((new, ""))
        todo = [(rel, key) for rel, us in loaded.items() for key in us
                if key and (rel, key) not in done and (_is_dunder(key) or plain_name(key) in names)]
    return {rel: {key for r, key in done if r == rel and key} for rel in loaded}


def reaching_gates(module: str, function: str, gate_files: dict[str, str], repo: Path = REPO) -> list[str]:
    """The gates (name -> module path, in order) whose run can execute `function` (mutmut's name,
    e.g. 'x_runs_difference') of `module` (e.g. 'gates/compare.py')."""
    return [name for name, rel in gate_files.items() if function in reached(rel, repo).get(module, set())]
