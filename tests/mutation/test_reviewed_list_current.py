"""The reviewed list (equivalent-mutants.toml) against today's sources, on every `make test`: each
entry must still name a mutant that makes the change it was reviewed for. An engine edit that
renumbers or removes a function's mutants otherwise leaves entries pointing at other mutations,
and only a full or shard mutation run noticed (2026-12-04: 20 stale entries after the staging
rewrite, unseen by CI's per-commit run, which on a commit without engine changes lists nothing)."""
from dataclasses import replace

from mutants.mutation.ratchet import stale_equivalents
from mutants.mutation.results import load_equivalents
from mutants.mutation.shard import mutated_lines
from mutants.mutation.stage import stage


def test_every_reviewed_entry_still_names_the_mutation_it_was_reviewed_for(tmp_path):
    staging = tmp_path / "mutmut"
    stage(staging)
    lines = mutated_lines(staging)
    equivalents = load_equivalents()
    assert equivalents and lines, "nothing listed or reviewed: the check would pass on nothing"
    assert stale_equivalents([], equivalents, complete=False, lines=lines) == []

    # the negative control: an entry renumbered onto a sibling, and one for a mutant that is gone
    name = next(iter(equivalents))
    sibling = next(n for n in lines if n.rsplit("__mutmut_", 1)[0] == name.rsplit("__mutmut_", 1)[0]
                   and lines[n] != equivalents[name].mutated)
    broken = {sibling: replace(equivalents[name], name=sibling), name + "0000": equivalents[name]}
    problems = stale_equivalents([], broken, complete=False, lines=lines)
    assert len(problems) == 2 and "but it now mutates" in problems[0] + problems[1] \
        and "no such mutant" in problems[0] + problems[1], problems
