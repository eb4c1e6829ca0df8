"""`specgate prove --gate-mutants`: the static reach of the gates' checking functions, mutmut's
mutants as planted files, and the proof's judgement of a mutant on a tiny tree whose stand-in gate
runs the real gates/compare.py: a mutant that lets the defect through is killed by the defect's
judgement, one that breaks the check by the clean tree's, and one the proof cannot see survives."""
import sys
import textwrap
from pathlib import Path

import pytest

from gates.report import GateResult
from mutants.proof.apply import copy_tree
from mutants.proof.catalogue import Defect
from mutants.proof.gate_mutant_report import (
    KILLED,
    NOT_REACHED,
    SURVIVED,
    Measurement,
    MutantVerdict,
    final_line,
    markdown,
)
from mutants.proof.gate_mutants import mutant_trees, prove_mutant, tree_command, tree_kill
from mutants.proof.gate_reach import reached
from mutants.proof.matrix import RAN, TIMEOUT, TreeRun
from mutants.proof.mutant_source import as_mutant, function_of, module_path, mutate_files
from mutants.proof.prove import add_prove_parser

REPO = Path(__file__).resolve().parents[2]


# ---- static reach ---------------------------------------------------------------------------------
def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


REACH_TREE = {
    "gates/plugin.py": """\
        def pytest_configure(config):
            pass
        class Recorder:
            def check(self, difference):
                return difference.as_dict()
        """,
    "gates/conftest.py": """\
        import pytest
        @pytest.fixture
        def decoder():
            from gates.refmod import Decoder
            return Decoder()
        """,
    "gates/checks.py": """\
        LIMIT = 3
        class Diff:
            def as_dict(self):
                return {}
            def __str__(self):
                return "diff"
            def unused_method(self):
                return 0
        def used(x):
            return helper(x)
        def helper(x):
            return x
        def unused(x):
            return x
        def by_getattr():
            return 1
        def lonely():
            return 2
        """,
    "gates/refmod.py": """\
        from gates.checks import lonely
        class Decoder:
            pass
        """,
    "gates/g_direct.py": """\
        import gates.checks
        def test_it():
            assert gates.checks.used(1) == getattr(gates.checks, "by_getattr")()
        """,
    "gates/g_fixture.py": """\
        from gates.checks import LIMIT
        def test_it(decoder):
            assert LIMIT
        """,
    "gates/g_none.py": """\
        def test_it():
            pass
        """,
}


def test_a_function_is_reached_only_where_a_gate_run_names_it(tmp_path):
    write(tmp_path, REACH_TREE)
    framework = ("gates/plugin.py", "gates/conftest.py")
    dunders_and_plugin = {"xǁDiffǁas_dict", "xǁDiffǁ__str__"}  # the plugin calls as_dict on any difference
    assert reached("gates/g_direct.py", tmp_path, framework)["gates/checks.py"] == \
        {"x_used", "x_helper", "x_by_getattr"} | dunders_and_plugin
    # the fixture's lazy import loads refmod, which names lonely; a run that never asks for it does not
    assert reached("gates/g_fixture.py", tmp_path, framework)["gates/checks.py"] == {"x_lonely"} | dunders_and_plugin
    assert "gates/checks.py" not in reached("gates/g_none.py", tmp_path, framework)
    # a gate's own module is run whole
    assert reached("gates/checks.py", tmp_path, framework)["gates/checks.py"] == {
        "x_used", "x_helper", "x_unused", "x_by_getattr", "x_lonely", "xǁDiffǁunused_method"} | dunders_and_plugin


def test_the_real_gates_reach_their_checks():
    r = {g: reached(f"gates/{g}.py") for g in ("reason_a", "predicate_split", "emit_count", "busy", "speed_ab")}
    assert r["reason_a"]["gates/invariants.py"] >= {"x_logits_window_difference"}
    assert "x_trace_consistency" not in r["reason_a"]["gates/invariants.py"]
    assert "x_mixed_refusals" in r["predicate_split"]["gates/invariants.py"]
    assert "x_mixed_refusals" not in r["emit_count"]["gates/invariants.py"]
    assert {"x_busy_fraction", "x_judge_busy"} <= r["busy"]["gates/measure.py"]
    assert not {"x_busy_fraction", "x_judge_busy"} & r["speed_ab"]["gates/measure.py"]


# ---- mutmut's mutants as files --------------------------------------------------------------------
@pytest.fixture(scope="module")
def compare_mutants() -> dict[str, object]:
    """Every mutmut mutant of gates/compare.py, by its changed line."""
    original = (REPO / "gates" / "compare.py").read_text()
    mutants = [as_mutant(name, original, text) for name, text in
               mutate_files({"gates/compare.py": original}).items()]
    assert mutants and all(m.path == "gates/compare.py" for m in mutants)
    return {next(line[1:].strip() for line in m.diff.splitlines() if line.startswith("+") and
                 not line.startswith("+++")): m for m in mutants}


def test_a_mutant_is_its_file_with_one_function_changed(compare_mutants):
    m = compare_mutants['want, got = ((rec_e.emit_count, rec_a.emit_count) if field != "emit_count"']
    assert m.function == "x_first_difference" and m.name.startswith("gates.compare.x_first_difference__mutmut_")
    assert m.diff.count("\n-") == 1 and m.diff.count("\n+") == 2  # the +++ header and the one line
    assert "__mutmut" not in m.source and "trampoline" not in m.source
    compile(m.source, "compare.py", "exec")


def test_mutant_names_map_to_their_file_and_function():
    assert module_path("gates.compare.xǁDifferenceǁas_dict__mutmut_3") == "gates/compare.py"
    assert function_of("gates.measure.xǁPairedMedianABǁas_dict__mutmut_3") == "xǁPairedMedianABǁas_dict"


# ---- the proof's judgement of one mutant, on a tiny tree --------------------------------------------
FAKE_GATE = textwrap.dedent("""\
    import json, pathlib, sys
    from types import SimpleNamespace
    from gates.compare import first_difference
    names, out = sys.argv[1].split(","), sys.argv[2]
    defect = "a + 2" in pathlib.Path("engine/x.py").read_text()
    def rec(emit):
        return SimpleNamespace(emit_count=emit, input_ids=[7], positions=[5], seq_len=6, logits_indices=[3],
                               query_start=3)
    sync, async_ = {(0, 5): (1, rec(2))}, {(0, 5): (1, rec(1 if defect else 2))}
    red = first_difference(sync, async_, "emit_count") is not None
    gates = [{"name": n, "status": "red" if red else "green", "reason": ""} for n in names]
    pathlib.Path(out).write_text(json.dumps({"gates": gates}))
    """)
PATCH = """\
--- a/engine/x.py
+++ b/engine/x.py
@@ -1,2 +1,2 @@
 def f(a):
-    return a + 1
+    return a + 2
"""


@pytest.fixture
def tiny_tree(proof_repo):
    return proof_repo({"engine/x.py": "def f(a):\n    return a + 1\n",
                       "engine/trace.py": "RequestTrace = StepTrace = object\n",
                       "gates/compare.py": (REPO / "gates" / "compare.py").read_text(), "fake_gate.py": FAKE_GATE},
                      {"emit-count-differs": PATCH})


def fake_command(names, json_path, device, stop_at_red, forwards=()):
    return [sys.executable, "fake_gate.py", ",".join(names), str(json_path)]


@pytest.mark.parametrize("line, verdict, by", [
    # the comparison inverted: emit-count compares the device inputs, so the defect goes through
    ('want, got = ((rec_e.emit_count, rec_a.emit_count) if field != "emit_count"', KILLED,
     "emit-count-differs: emit-count green, not red"),
    # every equal pair a difference: the clean tree goes red
    ("if want == got:", KILLED, "clean tree: emit-count red"),
    # the evidence loses its name, the status is the same: nothing the proof reads changes
    ("return Difference(None, step_a, key[0], key[1], want, got)", SURVIVED, ""),
])
def test_the_proof_kills_a_mutant_at_its_first_changed_judgement(tiny_tree, tmp_path, compare_mutants,
                                                                 line, verdict, by):
    defect = Defect("emit-count-differs", "x", ("emit-count",))
    trees = mutant_trees(["emit-count"], [defect], cuda=False, seconds={})
    assert [(label, d and d.name, names) for label, d, names, _ in trees] == [
        ("clean tree emit-count", None, ["emit-count"]), ("emit-count-differs", "emit-count-differs", ["emit-count"])]
    before = {p: p.read_bytes() for p in tiny_tree.rglob("*") if p.is_file() and ".git" not in p.parts}
    snapshot = copy_tree(tiny_tree, tmp_path / "snapshot")
    work = tmp_path / "work"
    work.mkdir()
    got, why, finished = prove_mutant(compare_mutants[line], trees, snapshot, work, jobs=1, timeout_s=60,
                                      command=fake_command)
    assert (got, why) == (verdict, by)
    assert finished == (1 if by.startswith("clean") else 2)
    assert not (work / "mutant").exists()
    assert {p: p.read_bytes() for p in tiny_tree.rglob("*") if p.is_file() and ".git" not in p.parts} == before


def test_a_mutant_the_time_limit_interrupts_is_not_judged(tiny_tree, tmp_path, compare_mutants):
    import time
    trees = mutant_trees(["emit-count"], [Defect("emit-count-differs", "x", ("emit-count",))], cuda=False, seconds={})
    snapshot = copy_tree(tiny_tree, tmp_path / "snapshot")
    (tmp_path / "work").mkdir()
    t0 = time.perf_counter()
    sleeps = lambda *_: [sys.executable, "-c", "import time; time.sleep(60)"]  # noqa: E731
    assert prove_mutant(compare_mutants["if want == got:"], trees, snapshot, tmp_path / "work", jobs=2, timeout_s=90,
                        command=sleeps, deadline=t0 + 1.0) is None
    assert time.perf_counter() - t0 < 30  # its runs were ended, not waited for


def test_a_tree_kills_when_its_judgement_changes():
    d = Defect("d", "x", ("combine", "emit-count"))
    green, red = GateResult("combine", status="green"), GateResult("combine", status="red")
    clean = "clean tree combine"
    assert tree_kill(TreeRun(clean, RAN, {"combine": green}), None, ["combine"]) is None
    assert tree_kill(TreeRun(clean, RAN, {"combine": red}), None, ["combine"]) == "clean tree: combine red"
    assert tree_kill(TreeRun(clean, RAN, {}), None, ["combine"]) == "clean tree: combine not run"
    assert tree_kill(TreeRun("d", RAN, {"combine": red}), d, ["combine"]) is None
    assert tree_kill(TreeRun("d", RAN, {"combine": green}), d, ["combine"]) == "d: combine green, not red"
    assert tree_kill(TreeRun("d", "could not run"), d, ["combine"]) == "d: could not run"
    assert tree_kill(TreeRun("d", TIMEOUT), d, ["combine"]) is None  # a timeout is never a kill


def test_trees_run_clean_gates_first_then_defects_cheapest_first():
    cheap, dear = Defect("cheap", "x", ("reason-a",)), Defect("dear", "x", ("lossless", "reason-a"))
    cuda_only = Defect("gpu", "x", ("reason-a",), needs="cuda")
    trees = mutant_trees(["lossless", "reason-a"], [dear, cheap, cuda_only], cuda=False,
                         seconds={"lossless": 40.0, "reason-a": 2.0})
    assert [(label, names) for label, _, names, _ in trees] == [
        ("clean tree reason-a", ["reason-a"]), ("clean tree lossless", ["lossless"]),
        ("cheap", ["reason-a"]), ("dear", ["lossless", "reason-a"])]
    assert mutant_trees([], [cheap], cuda=False, seconds={}) == []


def test_a_tree_of_one_gate_ends_at_its_first_failed_or_errored_test():
    one = tree_command(["emit-count"], Path("t.json"), "cpu", False)
    assert one[:2] == ["env", "PYTEST_ADDOPTS=--exitfirst"] and "--stop-at-red" in one
    two = tree_command(["combine", "emit-count"], Path("t.json"), "cpu", False)
    assert "env" not in two and "--stop-at-red" in two and two[-3:] == ["--jobs", "1", "--stop-at-red"]


def test_the_report_counts_each_side_and_lists_what_survived_both():
    diff = "--- a/gates/x.py\n+++ b/gates/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
    verdicts = [MutantVerdict("gates.x.x_f__mutmut_1", "gates/x.py", ["combine"], KILLED, "clean tree: combine red",
                              1, 3.0, "killed", diff=diff),
                MutantVerdict("gates.x.x_f__mutmut_2", "gates/x.py", ["combine"], SURVIVED, "", 4, 9.0, "killed",
                              diff=diff),
                MutantVerdict("gates.x.x_g__mutmut_1", "gates/x.py", [], NOT_REACHED, "no gate", 0, 0.0, "survived",
                              "equivalent: the same", diff)]
    m = Measurement(verdicts, listed=40, drawn=5, seed=0, stopped=True, wall_s=12.0,
                    command="specgate prove --gate-mutants", commit="abc")
    assert final_line(m) == ("proof kills 1 of 3 sampled gate-checking mutants (40 listed, seed 0; the first 3 of 5 "
                             "drawn, stopped at the time limit), unit tests kill 2 of the same 3; 1 survive both; "
                             "1 not reached by a gate runnable here")
    page = markdown(m)
    assert "| `gates/x.py` | 3 | 1 | 2 | 1 |" in page
    assert "## Survived both (1)\n\n### `gates.x.x_g__mutmut_1`" in page
    assert "reviewed in equivalent-mutants.toml: equivalent: the same" in page
    assert "## Survived the proof, killed by the unit tests (1)\n\n- `gates.x.x_f__mutmut_2` (survived, reaches " \
           "combine): `a = 2`" in page


def test_gate_mutant_options_are_refused_out_of_place(capsys):
    import argparse
    ap = argparse.ArgumentParser()
    add_prove_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["prove", "--gate-mutants", "--sample", "5", "--seed", "3", "--module", "gates/compare.py"])
    assert (args.gate_mutants, args.sample, args.seed, args.module) == (True, 5, 3, ["gates/compare.py"])
    assert args.func(ap.parse_args(["prove", "--sample", "5"])) == 2
    assert "--sample go with --gate-mutants" in capsys.readouterr().err
    assert args.func(ap.parse_args(["prove", "--gate-mutants", "stale-drafts"])) == 2
    assert "--gate-mutants takes no DEFECT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ap.parse_args(["prove", "--gate-mutants", "--module", "gates/plugin.py"])
