"""The mutation run's verdicts against what was reviewed and measured before: timeouts are run
failures, the baseline only rises within the scope it measured and a widened scope re-sets it,
and reviewed equivalents go stale loudly when their mutant changes."""
import json

import pytest

from mutants.mutation import ratchet, results, stage
from mutants.mutation.record import MutantRecord
from mutants.mutation.report import summarise

DIFF = """--- engine/verify.py
+++ engine/verify.py
@@ -1,3 +1,3 @@
 def f(a, b):
-    return a + b
+    return a - b"""


def record(name="engine.verify.x_f__mutmut_1", status="survived", diff=DIFF, equivalent=None) -> MutantRecord:
    return MutantRecord(name=name, path="engine/verify.py", function="f", status=status, diff=diff,
                        equivalent=equivalent)


def test_timeouts_and_unchecked_mutants_are_run_failures_never_kills():
    summary = summarise([record(status="killed"), record(name="engine.verify.x_f__mutmut_2", status="timeout"),
                         record(name="engine.verify.x_f__mutmut_3", status="not checked")])
    assert summary["killed"] == 1
    problems = ratchet.ratchet(summary, baseline=None, complete=True, stale=[])
    assert problems == ["1 timeout", "1 not checked"]


def baseline(strength: float, scope=stage.SCOPE) -> ratchet.Baseline:
    return ratchet.Baseline(test_strength=strength, killed=1, total=2, commit="abc", date="2026-12-01",
                                     scope=tuple(scope))


def test_a_full_run_under_the_baseline_fails_and_at_it_passes():
    summary = summarise([record(status="killed"), record(name="engine.verify.x_f__mutmut_2")])
    assert summary["test_strength"] == 0.5
    assert ratchet.ratchet(summary, baseline(0.5), complete=True, stale=[]) == []
    assert "under the baseline" in ratchet.ratchet(summary, baseline(0.6), complete=True, stale=[])[0]


def test_a_baseline_of_another_scope_fails_a_full_run_until_it_is_re_set():
    """A widened scope (new modules mutated) is measured afresh: the old scope's strength neither
    passes nor fails it, and only a full run that re-sets the baseline goes through."""
    summary = summarise([record(status="killed"), record(name="engine.verify.x_f__mutmut_2")])
    narrow = baseline(0.4, scope=("engine/*",))
    [problem] = ratchet.ratchet(summary, narrow, complete=True, stale=[])
    assert "another scope (40.00% of 2 mutants of engine/* (commit abc))" in problem
    assert "--update-baseline" in problem
    assert ratchet.ratchet(summary, narrow, complete=True, stale=[], rescoping=True) == []
    assert not any("scope" in p for p in ratchet.ratchet(summary, narrow, complete=False, stale=[]))


def test_the_baseline_is_re_set_for_a_new_scope_and_only_rises_within_one(tmp_path):
    path = tmp_path / "baseline.json"
    high = summarise([record(status="killed")])
    low = summarise([record(status="killed"), record(name="engine.verify.x_f__mutmut_2")])
    ratchet.update_baseline(high, "abc", path, scope=("engine/*",))
    message = ratchet.update_baseline(low, "def", path)
    assert message.startswith(f"baseline: re-set for scope {', '.join(stage.SCOPE)}: test strength 50.00%")
    assert "was 100.00% of 1 mutants of engine/* (commit abc)" in message
    loaded = ratchet.load_baseline(path)
    assert (loaded.test_strength, loaded.scope, loaded.commit) == (0.5, stage.SCOPE, "def")
    with pytest.raises(ValueError, match="only rises"):
        ratchet.update_baseline(summarise([record()]), "ghi", path)
    path.write_text(json.dumps({"test_strength": 0.5, "killed": 1, "total": 2, "commit": "x", "date": "y"}))
    with pytest.raises(ValueError, match="names no scope"):
        ratchet.load_baseline(path)


def test_a_since_run_fails_on_an_unexplained_survivor_only():
    unexplained = summarise([record()])
    explained = summarise([record(equivalent="same result for every input")])
    assert "neither killed nor listed" in ratchet.ratchet(unexplained, None, complete=False, stale=[])[0]
    assert ratchet.ratchet(explained, None, complete=False, stale=[]) == []


def test_the_baseline_only_rises(tmp_path):
    path = tmp_path / "baseline.json"
    low = summarise([record(status="killed"), record(name="engine.verify.x_f__mutmut_2")])
    high = summarise([record(status="killed")])
    assert "was none" in ratchet.update_baseline(low, "abc", path)
    assert ratchet.load_baseline(path).test_strength == 0.5
    assert "was 50.00%" in ratchet.update_baseline(high, "def", path)
    with pytest.raises(ValueError, match="only rises"):
        ratchet.update_baseline(low, "ghi", path)
    assert json.loads(path.read_text())["commit"] == "def"


def test_equivalents_need_a_reason_and_go_stale_when_the_mutant_changes(tmp_path):
    path = tmp_path / "equivalent.toml"
    path.write_text('[[mutant]]\nname = "engine.verify.x_f__mutmut_1"\nmutated = "return a - b"\n')
    with pytest.raises(ValueError, match="reason"):
        results.load_equivalents(path)
    path.write_text(path.read_text() + 'reason = "b is always 0 here"\n')
    eqs = results.load_equivalents(path)
    twice = tmp_path / "twice.toml"
    twice.write_text(path.read_text() * 2)
    with pytest.raises(ValueError, match="listed more than once: engine.verify.x_f__mutmut_1"):
        results.load_equivalents(twice)
    assert ratchet.stale_equivalents([record()], eqs, complete=True) == []
    renumbered = record(diff=DIFF.replace("a - b", "a * b"))
    killed = record(status="killed")
    assert "now mutates `return a * b`" in ratchet.stale_equivalents([renumbered], eqs, complete=True)[0]
    assert "but it was killed" in ratchet.stale_equivalents([killed], eqs, complete=True)[0]
    assert "no such mutant" in ratchet.stale_equivalents([], eqs, complete=True)[0]
    assert ratchet.stale_equivalents([], eqs, complete=False) == []


def test_the_committed_equivalents_and_baseline_are_well_formed():
    for eq in results.load_equivalents().values():
        assert eq.name.startswith(("engine.", "gates.")) and "__mutmut_" in eq.name and len(eq.reason) > 10
        assert eq.function_hash is None or len(eq.function_hash) == 12
    committed = ratchet.load_baseline()
    assert committed is None or (0 < committed.test_strength <= 1 and committed.scope)


def test_since_baseline_names_the_commit_of_the_last_full_run(tmp_path):
    path = tmp_path / "baseline.json"
    with pytest.raises(ValueError, match="no baseline.json yet"):
        ratchet.baseline_commit(path)
    ratchet.update_baseline(summarise([record(status="killed")]), "abc1234", path)
    assert ratchet.baseline_commit(path) == "abc1234"
