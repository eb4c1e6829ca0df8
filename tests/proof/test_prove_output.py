"""What `specgate prove` shows while it runs: a line per finished tree when not on a terminal."""
import re

from test_prove import fake_command, fake_repo  # noqa: F401  (fake_repo is a fixture)

from mutants.proof.catalogue import Defect
from mutants.proof.prove import ProveOptions, prove


def test_prove_prints_a_line_per_tree_when_not_on_a_terminal(fake_repo, capsys):
    defects = [Defect("off-by-one", "x", ("combine",))]
    prove(defects, ProveOptions(jobs=1, progress=True, complete=False), repo=fake_repo, cuda=False,
          command=fake_command, gate_needs={"lossless": "cpu", "combine": "cpu"})
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("prove: [")]
    assert sorted(lines, key=lambda line: line.split("]")[0]) == lines and len(lines) == 2
    assert any(re.match(r"prove: \[\d/2\] off-by-one: red: combine \(\d+ s\)$", line) for line in lines), lines
    assert any(re.match(r"prove: \[\d/2\] clean tree: red: none \(\d+ s\)$", line) for line in lines), lines
