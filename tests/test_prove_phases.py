"""prove's two phases: the timed gates (speed, busy) run after every other gate, one at a time and
each in a process of its own, and their results join their tree's run."""
import json
import sys
import textwrap

from mutants.catalogue import Defect
from mutants.matrix import GREEN, RED
from mutants.prove import ProveOptions, prove
from test_prove import fake_repo  # noqa: F401  (a fixture)

TIMED_GATES = textwrap.dedent("""\
    import json, pathlib, sys, time
    names, out, log = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
    start = time.time()
    time.sleep(0.3)
    source = pathlib.Path("engine/x.py").read_text()
    status = {"combine": "red" if "a + 2" in source else "green", "lossless": "green", "speed": "green",
              "busy": "green"}
    pathlib.Path(out).write_text(json.dumps({"gates": [{"name": n, "status": status[n], "reason": ""} for n in names]}))
    with open(log, "a") as f:
        f.write(json.dumps({"names": names, "start": start, "end": time.time()}) + "\\n")
    """)


def test_timed_gates_run_alone_after_every_other_gate_and_join_their_tree(fake_repo, tmp_path):
    (fake_repo / "timed_gates.py").write_text(TIMED_GATES)
    log = tmp_path / "runs.jsonl"

    def command(names, json_path, device):
        return [sys.executable, "timed_gates.py", ",".join(names), str(json_path), str(log)]
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
    assert {g: r["status"] for g, r in p.runs["off-by-one"].gates.items()} == \
        {"lossless": GREEN, "combine": RED, "speed": GREEN}
    assert set(p.clean.gates) == {"lossless", "combine", "speed", "busy"} and p.clean.status == "ran"
