"""prove's two phases: the timed gates (speed, busy) run after every other gate, one at a time and
each in a process of its own, and their results join their tree's run; a defect's tree stops each
gate at its first red; a defect of the compiled forward, and the clean tree beside it, judge both
forwards; and the environment every child of prove and mutate gets."""
import json
import os
import sys
import textwrap

import pytest
from test_prove import fake_repo  # noqa: F401  (a fixture)

from mutants.proof.apply import parse_patch
from mutants.proof.catalogue import DEFECTS, Defect
from mutants.proof.matrix import GREEN, RED
from mutants.proof.prove import ProveOptions, prove
from mutants.proof.prover import gate_command

TIMED_GATES = textwrap.dedent("""\
    import json, pathlib, sys, time
    names, out, log, stop_at_red = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4] == "True"
    start = time.time()
    time.sleep(0.3)
    source = pathlib.Path("engine/x.py").read_text()
    status = {"combine": "red" if "a + 2" in source else "green", "lossless": "green", "speed": "green",
              "busy": "green"}
    pathlib.Path(out).write_text(json.dumps({"gates": [{"name": n, "status": status[n], "reason": ""} for n in names]}))
    with open(log, "a") as f:
        f.write(json.dumps({"names": names, "start": start, "end": time.time(), "stop_at_red": stop_at_red,
                            "defect": "a + 2" in source}) + "\\n")
    """)


def test_timed_gates_run_alone_after_every_other_gate_and_join_their_tree(fake_repo, tmp_path):
    (fake_repo / "timed_gates.py").write_text(TIMED_GATES)
    log = tmp_path / "runs.jsonl"

    def command(names, json_path, device, stop_at_red, forwards=()):
        return [sys.executable, "timed_gates.py", ",".join(names), str(json_path), str(log), str(stop_at_red)]
    defects = [Defect("off-by-one", "x", ("combine", "speed"), token_invisible=True)]
    p = prove(defects, ProveOptions(jobs=2, progress=False), repo=fake_repo, cuda=False, command=command,
              gate_needs={"lossless": "cpu", "combine": "cpu", "speed": "cpu", "busy": "cpu"},
              timed={"speed", "busy"})
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    timed = sorted((r for r in runs if {"speed", "busy"} & set(r["names"])), key=lambda r: r["start"])
    others = [r for r in runs if r not in timed]
    # The clean tree's speed and busy, and the defect's speed: one process each, after the rest.
    # The untimed gates: the clean tree in two parts (two jobs) and the defect's tree.
    assert sorted(r["names"] for r in timed) == [["busy"], ["speed"], ["speed"]] and len(others) == 3
    assert min(r["start"] for r in timed) >= max(r["end"] for r in others), "a timed gate ran beside other work"
    assert all(a["end"] <= b["start"] for a, b in zip(timed, timed[1:])), "two timed gates ran at once"
    assert {g: r.status for g, r in p.runs["off-by-one"].gates.items()} == \
        {"lossless": GREEN, "combine": RED, "speed": GREEN}
    assert set(p.clean.gates) == {"lossless", "combine", "speed", "busy"} and p.clean.status == "ran"
    # A defect's tree stops each gate at its first red (red is all the proof reads there); the clean
    # tree runs every test, for it must be green throughout.
    assert all(r["stop_at_red"] == r["defect"] for r in runs) and {r["defect"] for r in runs} == {True, False}


def test_children_keep_outside_site_paths_but_never_the_working_tree(monkeypatch, tmp_path):
    """On the GPU machine mutmut comes as wheels installed with `pip install --target DIR` and
    PYTHONPATH=DIR: a child must still import it (the first --cuda-only run there failed with
    `No module named mutmut`), but never the working tree, a relative entry or a lifted veto."""
    from mutants.child_env import REPO, child_env
    site = str(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(REPO / "engine"), ".", "", site]))
    monkeypatch.setenv("VT_ASYNC_RUNNER", "1")
    monkeypatch.setenv("SPECGATE_FORWARDS", "compiled")
    env = child_env(OMP_NUM_THREADS="1")
    assert env["PYTHONPATH"] == site and "VT_ASYNC_RUNNER" not in env and env["OMP_NUM_THREADS"] == "1"
    assert "SPECGATE_FORWARDS" not in env
    assert child_env(PYTHONPATH="/copy")["PYTHONPATH"] == os.pathsep.join(["/copy", site])
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    assert "PYTHONPATH" not in child_env() and child_env(PYTHONPATH="/copy")["PYTHONPATH"] == "/copy"


@pytest.mark.parametrize("with_compiled", [False, True], ids=["reference-defects", "a-compiled-defect"])
def test_a_compiled_forward_defect_and_the_clean_tree_judge_both_forwards(fake_repo, tmp_path, with_compiled):
    """Its gates must run the compiled forward to see it (on the CPU: their compiled case, behind
    --forwards); the clean tree then judges both too, so what goes red on the defect is green there.
    Without such a defect, no tree is given --forwards (the gates' default)."""
    (fake_repo / "timed_gates.py").write_text(TIMED_GATES)
    log, seen = tmp_path / "runs.jsonl", []

    def command(names, json_path, device, stop_at_red, forwards=()):
        seen.append((stop_at_red, forwards))
        return [sys.executable, "timed_gates.py", ",".join(names), str(json_path), str(log), str(stop_at_red)]
    defects = [Defect("off-by-one", "x", ("combine",), forward="compiled" if with_compiled else "reference")]
    p = prove(defects, ProveOptions(jobs=1, progress=False), repo=fake_repo, cuda=False, command=command,
              gate_needs={"lossless": "cpu", "combine": "cpu"}, timed=set())
    assert p.runs["off-by-one"].cell("combine") == RED and p.clean.cell("combine") == GREEN
    both = ("reference", "compiled") if with_compiled else ()
    assert sorted(seen) == [(False, both), (True, both)]  # the clean tree, then the defect's


def test_the_gate_command_names_the_forwards_only_when_given(tmp_path):
    base = gate_command(["emit-count"], tmp_path / "g.json", "cpu", True)
    assert base[-1] == "--stop-at-red" and "--forwards" not in base
    assert gate_command(["emit-count"], tmp_path / "g.json", "cpu", True, ("reference", "compiled")) == \
        base + ["--forwards", "reference,compiled"]


def test_a_defect_names_a_forward_the_engine_has():
    with pytest.raises(ValueError, match="forward must be one of"):
        Defect("fused-bug", "x", ("emit-count",), forward="fused")


def test_compiled_forward_defects_patch_the_compiled_path_alone_and_a_cpu_one_names_emit_count():
    """Seeded defects live only where compile=True runs (engine/fused.py), on the CPU and on CUDA; a
    CPU one names emit-count, whose compiled case is what judges it on the CPU."""
    compiled = [d for d in DEFECTS if d.forward == "compiled"]
    assert {d.needs for d in compiled} == {"cpu", "cuda"}
    for d in compiled:
        assert {h.path for h in parse_patch(d.patch.read_text())} == {"engine/fused.py"}, d.name
        assert d.needs == "cuda" or "emit-count" in d.gates, d.name
