"""Which mutants a run tests: every mutant listed up front, the reviewed ones not re-run while their
function is unchanged, a deterministic shard of the rest, and shard reports merged into one.

- The list: mutmut's own mutation of each source file (`mutate_file_contents`, in the staging
  folder, where mutmut reads its configuration) names every mutant and hashes its function the
  way mutmut does. It is cached in the staging folder by the sources' digest.
- Reviewed, not re-run: an entry of equivalent-mutants.toml with a `function_hash` equal to its
  function's hash now was reviewed on this very code; the run does not test it again and the
  report marks it "reviewed, not re-run". Any change to the function changes the hash, and the
  mutant is tested again (and its entry goes stale if its verdict changed).
- Shard I of N: the mutants sorted by file, function and number, every N-th from the I-th. Each
  function's mutants are spread evenly over the shards, so the shards cost about the same
  whatever a function's tests cost.
"""
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

from mutants.mutation.ratchet import CUDA_ONLY
from mutants.mutation.results import Equivalent, matches, valid_cached
from mutants.mutation.stage import SOURCES, STAGING, is_mutated

# Each mutant's function hash, and the first line it changes: the line mutmut's own diff of the
# mutant adds (mutants/mutation_results.mutated_line), read here from one parse of the mutated file.
_LIST_SCRIPT = """
import ast, difflib, json, sys
from pathlib import Path
from mutmut.mutation.file_mutation import mutate_file_contents
from mutmut.utils.format_utils import get_mutant_name, orig_function_and_class_names_from_key
hashes, lines = {}, {}
for path in map(Path, sys.argv[1:]):
    mutated = mutate_file_contents(str(path), path.read_text())
    code = mutated.code.splitlines()  # sliced by line numbers: ast.get_source_segment splits the file per call
    functions = {node.name: "\\n".join(code[node.lineno - 1:node.end_lineno])
                 for node in ast.walk(ast.parse(mutated.code))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name}
    for name in mutated.mutant_names:
        function = name.rpartition("__mutmut_")[0]
        full = get_mutant_name(path, name)
        hashes[full] = mutated.hash_by_function_name.get(function, "")
        # named as in the source, as mutmut's diff names it (a mutant of the def line shows the name)
        source_name = orig_function_and_class_names_from_key(full)[0]
        orig = functions[function + "__mutmut_orig"].replace(function + "__mutmut_orig", source_name).splitlines()
        mutant = functions[name].replace(name, source_name).splitlines()
        lines[full] = next((l[1:].strip() for l in difflib.unified_diff(orig, mutant, lineterm="")
                            if l.startswith("+") and not l.startswith("+++")), "")
json.dump({"hashes": hashes, "lines": lines}, sys.stdout)
"""


LISTING = "mutant-list.json"  # in the staging folder


def sources_digest(staging: Path = STAGING) -> str:
    """The cache key of the listing: the mutated files, and the script that lists them."""
    h = hashlib.sha256(_LIST_SCRIPT.encode())
    for path in mutated_files(staging):
        h.update(str(path.relative_to(staging)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def mutated_files(staging: Path) -> list[Path]:
    return sorted(p for source in SOURCES for p in (staging / source).rglob("*.py")
                  if is_mutated(p.relative_to(staging).as_posix()))


def list_mutants(staging: Path = STAGING) -> dict[str, str]:
    """Every mutant of the staged sources -> its function's hash (mutmut's), in mutmut's naming."""
    return _listing(staging)["hashes"]


def mutated_lines(staging: Path = STAGING) -> dict[str, str]:
    """Every mutant of the staged sources -> the first line it changes, as the reviewed list names it."""
    return _listing(staging)["lines"]


def _listing(staging: Path) -> dict:
    digest, cache = sources_digest(staging), staging / LISTING
    if cache.exists():
        cached = json.loads(cache.read_text())
        if cached.get("digest") == digest and "lines" in cached:
            return cached
    # libcst's mutation of every file takes about a minute on one core: the files are split over
    # the cores, largest first onto the least loaded process.
    groups: list[list[Path]] = [[] for _ in range(len(os.sched_getaffinity(0)))]
    for path in sorted(mutated_files(staging), key=lambda p: -p.stat().st_size):
        min(groups, key=lambda g: sum(p.stat().st_size for p in g)).append(path)
    procs = [subprocess.Popen([sys.executable, "-c", _LIST_SCRIPT, *(str(p.relative_to(staging)) for p in group)],
                              cwd=staging, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for group in groups if group]
    listing = {"digest": digest, "hashes": {}, "lines": {}}
    try:
        for proc in procs:
            out, err = proc.communicate()
            if proc.returncode:
                raise ValueError(f"listing the mutants failed: {err.strip().splitlines()[-1:]}")
            part = json.loads(out)
            listing["hashes"].update(part["hashes"])
            listing["lines"].update(part["lines"])
    finally:  # a failed or interrupted listing leaves no process behind on the cores
        for proc in procs:
            proc.kill()
            proc.wait()
    cache.write_text(json.dumps(listing))
    return listing


def order_key(name: str) -> tuple:
    function, _, number = name.rpartition("__mutmut_")
    return function, int(number) if number.isdigit() else -1, name


def shard(names, index: int, count: int) -> list[str]:
    """Shard `index` (1-based) of `count`: every count-th mutant in (function, number) order."""
    if not 1 <= index <= count:
        raise ValueError(f"shard {index}/{count}: need 1 <= I <= N")
    return [n for i, n in enumerate(sorted(names, key=order_key)) if i % count == index - 1]


def parse_shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected I/N, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text}: need 1 <= I <= N")
    return index, count


def reviewed_unchanged(equivalents: dict[str, Equivalent], hashes: dict[str, str]) -> set[str]:
    """Reviewed mutants whose function is byte for byte the one reviewed (same mutmut hash)."""
    return {name for name, eq in equivalents.items()
            if eq.function_hash and hashes.get(name) == eq.function_hash}


def cuda_only(equivalents: dict[str, Equivalent]) -> list[str]:
    return sorted((n for n, eq in equivalents.items() if eq.reason.startswith(CUDA_ONLY)), key=order_key)


def plan_run(hashes: dict[str, str], equivalents: dict[str, Equivalent], staging: Path, patterns: list[str],
             shard_index: tuple[int, int] | None, cuda: bool) -> tuple[list[str], set[str], set[str], list[str]]:
    """Which mutants a listed run covers and which of them it tests: (in the run, reviewed and not
    re-run, from the cache, to test). mutmut always re-tests a mutant it is given by name, so the run
    names only those without a valid verdict, except on an --only run (`patterns`), which re-tests
    every mutant it matches. A shard keeps the cache as a full run does: a CI shard job that restores
    its staging folder re-tests only the mutants of functions changed since."""
    if cuda:
        in_run = [n for n in cuda_only(equivalents) if n in hashes]
    elif shard_index:
        in_run = shard(hashes, *shard_index)
    else:
        in_run = [n for n in hashes if matches(n, patterns)]
    not_rerun = set() if cuda else reviewed_unchanged(equivalents, hashes) & set(in_run)
    cached_now = set() if patterns else valid_cached(hashes, staging) & set(in_run)
    return in_run, not_rerun, cached_now, [n for n in in_run if n not in not_rerun and n not in cached_now]


SAMPLE_SEED = 0  # a bounded run's draw: the same mutants on every run of the same change


def bounded(names: list[str], budget: int, seed: int = SAMPLE_SEED) -> tuple[list[str], str | None]:
    """At most `budget` of `names`, drawn uniformly with a fixed seed when there are more: (the
    mutants to run, sorted; a note for the score line when some were left out, else None)."""
    names = sorted(names)
    if len(names) <= budget:
        return names, None
    return (sorted(random.Random(seed).sample(names, budget)),
            f"{budget} of {len(names)} mutants of the changed functions (seed {seed})")


def listing_digest(names) -> str:
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]
