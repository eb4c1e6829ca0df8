"""One mutmut mutant as a file: the mutated module's whole text, with only that mutant's function
changed, and its diff. What a gate mutant's proof plants in a copy of the tree (mutants/proof/gate_mutants.py).

mutmut writes every mutant of a file into one module of trampolines, chosen at run time. A proof
tree must run the gates on the plain mutated code instead, so mutmut's own mutation of the file
(`mutate_file_contents`, the call that names the mutants in the run's listing, so the names are
the same) is read back with libcst and the one mutant's function put in the place of the original,
found by its class and name. It runs in a child process (libcst and mutmut stay out of this one)
with a minimal mutmut configuration in a folder of its own: mutmut reads its configuration from
the working folder, and mutating a file reads only the patterns it must not mutate, none here.
"""
import difflib
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mutants.child_env import child_env


@dataclass(frozen=True)
class MutantSource:
    name: str        # mutmut's name, e.g. 'gates.compare.x_runs_difference__mutmut_3'
    path: str        # the file, relative to the repository: 'gates/compare.py'
    function: str    # mutmut's name of its function: 'x_runs_difference', 'xǁDifferenceǁas_dict'
    source: str      # the whole mutated file
    diff: str        # a unified diff of the file (a/ and b/ prefixes, 3 lines of context)


_SCRIPT = r"""
import json, sys
import libcst as cst
from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name, orig_function_and_class_names_from_key
from pathlib import Path

def find(module, name, cls):
    for node in module.body:
        if cls is None and isinstance(node, cst.FunctionDef) and node.name.value == name:
            return node
        if isinstance(node, cst.ClassDef) and (cls is None or node.name.value == cls):
            for member in node.body.body:
                if isinstance(member, cst.FunctionDef) and member.name.value == name:
                    return member
    return None

request = json.load(sys.stdin)
out = {}
for rel, text in request["files"].items():
    mutated = mutate_file_contents(rel, text)
    generated, original = cst.parse_module(mutated.code), cst.parse_module(text)
    for short in mutated.mutant_names:
        name = get_mutant_name(Path(rel), short)
        if request["names"] is not None and name not in request["names"]:
            continue
        function, cls = orig_function_and_class_names_from_key(name)
        mutant = find(generated, short, cls) or find(generated, short, None)
        orig = find(original, function, cls)
        out[name] = original.deep_replace(orig, mutant.with_changes(name=cst.Name(function))).code
json.dump(out, sys.stdout)
"""


def module_path(name: str) -> str:
    """The file of a mutant of the gates' checks: 'gates.compare.x_f__mutmut_1' -> 'gates/compare.py'."""
    module = name.partition("__mutmut_")[0].rpartition(".")[0]
    return module.replace(".", "/") + ".py"


def function_of(name: str) -> str:
    """mutmut's name of a mutant's function: 'gates.compare.x_f__mutmut_1' -> 'x_f'."""
    return name.partition("__mutmut_")[0].rpartition(".")[2]


def mutate_files(files: dict[str, str], names: list[str] | None = None) -> dict[str, str]:
    """mutmut's mutants of `files` (path relative to the repository -> text): mutant name -> the
    whole mutated file, for each of `names` among them (every mutant when None)."""
    with tempfile.TemporaryDirectory(prefix="specgate-mutant-") as cwd:
        (Path(cwd) / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["gates"]\n')
        proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=cwd, env=child_env(),
                              input=json.dumps({"files": files, "names": names}), capture_output=True, text=True)
    if proc.returncode:
        raise ValueError(f"mutating {', '.join(files)} failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout)


def as_mutant(name: str, original: str, text: str) -> MutantSource:
    rel = module_path(name)
    diff = "".join(difflib.unified_diff(original.splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}"))
    return MutantSource(name, rel, function_of(name), text, diff)


def mutant_sources(names: list[str], root: Path) -> dict[str, MutantSource]:
    """name -> MutantSource for each of `names`, mutating the files of the tree at `root`.
    Raises ValueError when a name is not among mutmut's mutants of its file now (the listing the
    names came from is stale)."""
    files = {rel: (root / rel).read_text() for rel in sorted({module_path(n) for n in names})}
    sources = mutate_files(files, sorted(names))
    missing = sorted(set(names) - set(sources))
    if missing:
        raise ValueError(f"{len(missing)} mutants are not mutmut's mutants of the files now (a stale listing?): "
                         f"{', '.join(missing[:3])}")
    return {name: as_mutant(name, files[module_path(name)], text) for name, text in sources.items()}
