"""The seeded-defect catalogue and `specgate prove`: every patch applies exactly to this tree, a
patch that no longer applies is reported stale, planting a defect never touches the working
tree, and the driver plants, runs and cleans up with a stand-in for the gate runs. The matrix's
judgement is tests/proof/test_matrix.py's; the real gate runs are `make prove`'s job, not this suite's."""
import hashlib
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from gates import registry
from mutants.proof import catalogue
from mutants.proof.apply import StalePatch, apply_patch, copy_tree, parse_patch, patched_files, source_files
from mutants.proof.catalogue import DEFECTS, Defect
from mutants.proof.matrix import GREEN, RED, TIMEOUT
from mutants.proof.prove import ProveOptions, add_prove_parser, prove, stale_check

# Each runs whole gate sessions in subprocesses: left out of mutation runs.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def read_repo(rel):
    path = REPO / rel
    return path.read_text() if path.is_file() else None


# ---- the catalogue ---------------------------------------------------------------------------------
def test_defect_names_are_unique_kebab_case_and_name_known_gates():
    names = [d.name for d in DEFECTS]
    assert len(names) == len(set(names))
    known = {g.name for g in registry.GATES}
    for d in DEFECTS:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", d.name), d.name
        assert d.gates and set(d.gates) <= known, f"{d.name} names unknown gates {set(d.gates) - known}"
        assert len(d.gates) == len(set(d.gates))
        assert d.models.strip() and d.models.count(". ") <= 2, f"{d.name}: say what it models in one or two sentences"
        assert d.needs in ("cpu", "cuda")
        assert not (d.token_invisible and "lossless" in d.gates), \
            f"{d.name} cannot be invisible to lossless and red on it"


def test_a_bad_defect_is_refused():
    with pytest.raises(ValueError, match="kebab-case"):
        Defect("Stale_Drafts", "x", ("combine",))
    with pytest.raises(ValueError, match="names no gate"):
        Defect("stale-drafts", "x", ())


def test_at_least_two_defects_claim_every_token_unchanged_and_are_caught_by_emit_count_combine_or_reason_a():
    invisible = [d for d in DEFECTS if d.token_invisible and {"emit-count", "combine", "reason-a"} & set(d.gates)]
    assert len(invisible) >= 2, [d.name for d in invisible]


def test_every_cpu_gate_is_named_by_a_cpu_defect_and_every_gate_by_some_defect():
    proven = catalogue.proven_against(g.name for g in registry.GATES)
    for g in registry.GATES:
        assert proven[g.name], f"gate {g.name} is proven against no defect"
        if g.needs == "cpu":
            cpu = [d.name for d in DEFECTS if g.name in d.gates and d.needs == "cpu"]
            assert cpu, f"CPU gate {g.name} is named only by defects that need CUDA"


def test_proven_against_is_read_from_the_mutants_catalogue():
    defects = [types.SimpleNamespace(name="stale-drafts", gates=("emit-count", "combine")),
               types.SimpleNamespace(name="reason-a-fallback", gates=("reason-a",))]
    proven = catalogue.proven_against((g.name for g in registry.GATES), defects)
    assert list(proven) == [g.name for g in registry.GATES]
    assert proven["emit-count"] == ("stale-drafts",)
    assert proven["reason-a"] == ("reason-a-fallback",)
    assert proven["busy"] == ()


def test_gates_list_reads_the_defects_from_the_catalogue(capsys):
    from specgate_cli import main
    assert main(["gates", "list"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("reason-a "))
    assert "reason-a-eager-arm" in line and "reason-a-graph-arm" in line


def test_each_defect_has_its_patch_and_every_patch_a_defect():
    patches = {p.stem for p in catalogue.PATCHES.glob("*")}
    assert patches == {d.name for d in DEFECTS}
    assert all(p.suffix == ".diff" for p in catalogue.PATCHES.iterdir())


def test_mutants_holds_no_mutmut_files():
    """mutmut 3 works in a folder called mutants/ too: none of its files may land in ours."""
    folder = REPO / "mutants"
    ours = {"__init__.py", "child_env.py", "README.md", "__pycache__", "proof", "mutation"}
    assert {p.name for p in folder.iterdir()} <= ours
    assert not list(folder.rglob("*mutmut*")) and not list(folder.rglob("*.meta"))


# ---- patches against this tree -------------------------------------------------------------------
@pytest.mark.parametrize("defect", DEFECTS, ids=lambda d: d.name)
def test_every_patch_applies_exactly_once_to_the_current_tree(defect):
    text = defect.patch.read_text()
    files = patched_files(text, read_repo)
    assert files and all(files[p] != read_repo(p) for p in files)
    assert all(p.startswith("engine/") for p in files), "a defect is planted in the engine"
    # And it is a standard diff: `git apply --check` (read-only) agrees.
    subprocess.run(["git", "apply", "--check", str(defect.patch)], cwd=REPO, check=True, capture_output=True)


def test_stale_check_of_the_catalogue_against_this_tree_finds_nothing():
    assert stale_check(list(DEFECTS), REPO) == {}


PATCH = textwrap.dedent("""\
    --- a/engine/x.py
    +++ b/engine/x.py
    @@ -1,3 +1,3 @@
     def f(a):
    -    return a + 1
    +    return a + 2
     # end
    """)


def test_a_patch_that_no_longer_applies_is_stale(tmp_path):
    (tmp_path / "engine").mkdir()
    target = tmp_path / "engine" / "x.py"
    target.write_text("def f(a):\n    return a + 1\n# end\n")
    assert apply_patch(PATCH, tmp_path) == ["engine/x.py"]
    assert target.read_text() == "def f(a):\n    return a + 2\n# end\n"
    with pytest.raises(StalePatch, match="matches nowhere"):          # the code moved under it
        apply_patch(PATCH, tmp_path)
    target.write_text("def f(a):\n    return a + 1\n# end\n" * 2)
    with pytest.raises(StalePatch, match="matches 2 times"):         # ambiguous: never guessed
        apply_patch(PATCH, tmp_path)
    target.unlink()
    with pytest.raises(StalePatch, match="does not exist"):
        apply_patch(PATCH, tmp_path)


def test_stale_check_reports_a_defect_whose_code_moved(tmp_path):
    defect = DEFECTS[0]
    touched = sorted({h.path for h in parse_patch(defect.patch.read_text())})
    copy_tree(REPO, tmp_path / "tree", files=touched)
    assert stale_check([defect], tmp_path / "tree") == {}
    hunk = parse_patch(defect.patch.read_text())[0]
    line = next(ln for ln in hunk.old if ln.strip())   # someone edits a line the patch rests on
    path = tmp_path / "tree" / hunk.path
    path.write_text(path.read_text().replace(line, line.rstrip("\n") + "  # edited\n", 1))
    stale = stale_check([defect], tmp_path / "tree")
    assert set(stale) == {defect.name} and "matches nowhere" in stale[defect.name]


def test_hunks_are_read_by_their_line_counts_across_files():
    """git's multi-file form (diff/index headers), and a removed line that itself starts with
    '--' (it must not be taken for a file header)."""
    text = textwrap.dedent("""\
        diff --git a/engine/a.py b/engine/a.py
        index 1111111..2222222 100644
        --- a/engine/a.py
        +++ b/engine/a.py
        @@ -1,2 +1,2 @@
        --- a comment that starts with dashes
        +-- another
         x = 1
        diff --git a/engine/b.py b/engine/b.py
        --- a/engine/b.py
        +++ b/engine/b.py
        @@ -3 +3 @@
        -y = 2
        +y = 3
        """)
    hunks = parse_patch(text)
    assert [(h.path, h.old, h.new) for h in hunks] == [
        ("engine/a.py", ["-- a comment that starts with dashes\n", "x = 1\n"], ["-- another\n", "x = 1\n"]),
        ("engine/b.py", ["y = 2\n"], ["y = 3\n"])]
    with pytest.raises(ValueError, match="ends early"):
        parse_patch(text.replace("+y = 3\n", ""))


def test_a_patch_cannot_write_outside_the_tree(tmp_path):
    escaping = PATCH.replace("b/engine/x.py", "b/../x.py")
    (tmp_path / "tree").mkdir()
    (tmp_path / "x.py").write_text("def f(a):\n    return a + 1\n# end\n")
    with pytest.raises(ValueError, match="leaves the tree"):
        apply_patch(escaping, tmp_path / "tree")
    assert (tmp_path / "x.py").read_text() == "def f(a):\n    return a + 1\n# end\n"


def tree_state() -> tuple[dict[str, str], str]:
    files = {f: hashlib.sha256((REPO / f).read_bytes()).hexdigest() for f in source_files(REPO)}
    status = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
    return files, status


def test_planting_every_defect_never_touches_the_working_tree(tmp_path):
    before = tree_state()
    for d in DEFECTS:
        touched = sorted({h.path for h in parse_patch(d.patch.read_text())})
        copy = copy_tree(REPO, tmp_path / d.name, files=touched)
        assert apply_patch(d.patch.read_text(), copy) == touched
        assert all((copy / f).read_text() != (REPO / f).read_text() for f in touched)
    assert tree_state() == before


# ---- the driver, with a stand-in for the gate runs -------------------------------------------------
FAKE_GATES = textwrap.dedent("""\
    import json, pathlib, sys, time
    names, out = sys.argv[1].split(","), sys.argv[2]
    source = pathlib.Path("engine/x.py").read_text()
    if "SLEEP" in source:
        time.sleep(60)
    status = {"combine": "red" if "a + 2" in source else "green", "lossless": "green"}
    pathlib.Path(out).write_text(json.dumps({"gates": [{"name": n, "status": status[n], "reason": ""} for n in names]}))
    """)


@pytest.fixture
def fake_repo(proof_repo):
    sleeps = PATCH.replace("+    return a + 2", "+    return a + 1  # SLEEP")
    return proof_repo({"engine/x.py": "def f(a):\n    return a + 1\n# end\n", "fake_gates.py": FAKE_GATES},
                      {"off-by-one": PATCH, "sleeps": sleeps})


def fake_command(names, json_path, device, stop_at_red, forwards=()):
    return [sys.executable, "fake_gates.py", ",".join(names), str(json_path)]


def test_prove_plants_each_defect_in_a_copy_runs_in_parallel_and_cleans_up(fake_repo, tmp_path):
    before = {p: p.read_bytes() for p in fake_repo.rglob("*") if p.is_file() and ".git" not in p.parts}
    defects = [Defect("off-by-one", "x", ("combine",), token_invisible=True)]
    p = prove(defects, ProveOptions(jobs=2, progress=False), repo=fake_repo, cuda=False,
              command=fake_command, gate_needs={"lossless": "cpu", "combine": "cpu"})
    v, runs, clean = p.judgement, p.runs, p.clean
    assert v.exit_status == 1 and v.problems == ["gate lossless (cpu) is proven against no defect"]
    assert {g: r.status for g, r in runs["off-by-one"].gates.items()} == {"lossless": GREEN, "combine": RED}
    assert clean.cell("combine") == GREEN and clean.cell("lossless") == GREEN
    assert {p: p.read_bytes() for p in fake_repo.rglob("*") if p.is_file() and ".git" not in p.parts} == before
    assert list((tmp_path / "tmp").iterdir()) == []  # every temporary folder removed


def test_a_tree_that_outlives_its_timeout_fails_and_is_ended(fake_repo, tmp_path):
    defects = [Defect("sleeps", "x", ("combine",))]
    p = prove(defects, ProveOptions(jobs=2, progress=False, timeout_s=2, complete=False), repo=fake_repo,
              cuda=False, command=fake_command, gate_needs={"lossless": "cpu", "combine": "cpu"})
    v, runs = p.judgement, p.runs
    assert runs["sleeps"].status == TIMEOUT and "sleeps: timeout" in v.problems
    assert runs["sleeps"].seconds < 30
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_defect_runs_its_gates_plus_lossless_when_it_claims_every_token_unchanged():
    from mutants.proof.prove import gates_for
    order = [g.name for g in registry.GATES]
    assert gates_for(Defect("d", "x", ("emit-count", "combine")), order, full=False) == ["combine", "emit-count"]
    assert gates_for(Defect("d", "x", ("emit-count",), token_invisible=True),
                     order, False) == ["lossless", "emit-count"]
    assert gates_for(Defect("d", "x", ("emit-count",)), order, full=True) == order


def test_sigterm_ends_prove_like_ctrl_c():
    import os
    import signal

    from mutants.proof.prove import ending_on_signals
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with ending_on_signals():
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
            pytest.fail("SIGTERM did not interrupt")
    assert signal.getsignal(signal.SIGTERM) is before


def test_prove_command_line():
    import argparse
    ap = argparse.ArgumentParser()
    add_prove_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["prove", "stale-drafts", "--json", "m.json", "--markdown", "m.md", "--full", "--jobs", "3"])
    assert (args.defects, args.json, args.markdown, args.full, args.jobs) == (["stale-drafts"], "m.json", "m.md",
                                                                              True, 3)
    assert ap.parse_args(["prove"]).jobs == 2
    assert args.func(ap.parse_args(["prove", "no-such-defect"])) == 2
