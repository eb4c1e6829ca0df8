"""Reading a mutmut run's results from the staging folder: one MutantRecord per mutant, with the
reviewed list of equivalent mutants (mutants/mutation/equivalent-mutants.toml) applied.

mutmut keeps, per mutated source file, `mutants/<path>.meta` (each mutant's exit code and
duration) and the mutated module itself; the records are read from those files under the
staging folder given, whatever the current directory.
"""
import contextlib
import json
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from mutants.mutation.record import MutantRecord
from mutants.mutation.stage import REPO, SOURCES, STAGING

EQUIVALENTS = REPO / "mutants" / "mutation" / "equivalent-mutants.toml"


@dataclass(frozen=True)
class Equivalent:
    name: str
    mutated: str  # the mutant's changed line: an entry goes stale when mutmut renumbers
    reason: str
    # mutmut's hash of the function when it was reviewed: while it is unchanged the mutant is not
    # re-run (mutants/mutation/shard.py); absent, the mutant is re-run every time
    function_hash: str | None = None


def read_results(patterns: list[str], equivalents: dict[str, Equivalent],
                 staging: Path = STAGING, names: set[str] | None = None) -> list[MutantRecord]:
    """The mutants mutmut knows in the staging folder (only those matching `patterns`, if any,
    and only those in `names`, if given)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import mangled_name_from_mutant_name, orig_function_and_class_names_from_key
    work = staging / "mutants"  # mutmut's working copy
    covered = json.loads((work / "mutmut-stats.json").read_text())["tests_by_mangled_function_name"]
    records = []
    for meta_path in sorted(m for source in SOURCES for m in (work / source).rglob("*.py.meta")):
        path = meta_path.relative_to(work).with_suffix("")
        meta = json.loads(meta_path.read_text())
        for name, code in sorted(meta["exit_code_by_key"].items()):
            if (names is not None and name not in names) or not matches(name, patterns):
                continue
            function, cls = orig_function_and_class_names_from_key(name)
            # From the staging folder mutmut finds its line index of the mutated file (mutants/*.spans)
            # and parses only the two functions; given the source, it parses the whole file per
            # mutant (1.9 s a mutant here: about 40 minutes for a shard of 1,325).
            with contextlib.chdir(staging):
                diff = get_diff_for_mutant(name, path=path)
            status = status_by_exit_code[code]
            eq = equivalents.get(name)
            reason = eq.reason if eq and status == "survived" and eq.mutated == mutated_line(diff) else None
            records.append(MutantRecord(
                name=name, path=str(path), function=f"{cls}.{function}" if cls else function,
                status=status, diff=diff,
                covered_by=tuple(sorted(covered.get(mangled_name_from_mutant_name(name), ()))),
                seconds=meta["durations_by_key"].get(name), equivalent=reason))
    return records


def valid_cached(hashes: dict[str, str], staging: Path = STAGING) -> set[str]:
    """Mutants whose verdict mutmut holds for the function as it is now (mutmut resets the others
    when it regenerates a changed function)."""
    from mutmut.utils.format_utils import mangled_name_from_mutant_name
    valid = set()
    for meta_path in (m for source in SOURCES for m in (staging / "mutants" / source).rglob("*.meta")):
        meta = json.loads(meta_path.read_text())
        function_hashes = meta.get("hash_by_function_name", {})
        for name, code in meta["exit_code_by_key"].items():
            function = mangled_name_from_mutant_name(name).rpartition(".")[2]
            if code is not None and name in hashes and function_hashes.get(function) == hashes[name]:
                valid.add(name)
    return valid


def cached_verdicts(patterns: list[str], staging: Path = STAGING) -> dict[str, float | None]:
    """The mutants (matching `patterns`, if any) whose verdict mutmut already holds, with its
    duration: a mutant the run retests gets a new one, so the run's speed counts only those."""
    cached = {}
    for meta_path in (m for source in SOURCES for m in (staging / "mutants" / source).rglob("*.meta")):
        meta = json.loads(meta_path.read_text())
        cached.update({name: meta["durations_by_key"].get(name) for name, code in meta["exit_code_by_key"].items()
                       if code is not None and matches(name, patterns)})
    return cached


def matches(name: str, patterns: list[str]) -> bool:
    """Whether a mutant is in the run: every mutant when there are no patterns."""
    return not patterns or any(fnmatch(name, p) for p in patterns)


def mutated_line(diff: str) -> str:
    """The first line a mutant adds, stripped ('' when it only removes)."""
    return next((line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")),
                "")


def load_equivalents(path: Path = EQUIVALENTS) -> dict[str, Equivalent]:
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("mutant", [])
    bad = [e for e in entries if not (e.get("name") and e.get("mutated") is not None and e.get("reason"))]
    if bad:
        raise ValueError(f"{path.name}: every [[mutant]] needs name, mutated and reason; not {bad[0]}")
    names = [e["name"] for e in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{path.name}: a mutant is reviewed once; listed more than once: {', '.join(twice)}")
    return {e["name"]: Equivalent(e["name"], e["mutated"], e["reason"], e.get("function_hash")) for e in entries}
