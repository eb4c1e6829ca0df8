"""gates/reach.py on a small synthetic engine measured by coverage.py with two gate contexts:
per-gate figures, the unreached branches, the reviewed list (unreviewed and stale entries)."""
import importlib.util

import coverage
import pytest

from gates import reach

SOURCE = '''\
def route(x):
    if x > 0:
        return "up"
    return "down"


def fold(values):
    total = 0
    for v in values:
        total += v
    return total


def other(flag):
    if flag:
        return 1
    return 2
'''


def measure(tmp_path, calls):
    """Run the synthetic engine/mod.py under coverage, one context per (gate, function, args)."""
    (tmp_path / "engine").mkdir()
    path = tmp_path / "engine" / "mod.py"
    path.write_text(SOURCE)
    spec = importlib.util.spec_from_file_location(f"synthetic_{tmp_path.name}", path)
    data_file = tmp_path / ".coverage"
    cov = coverage.Coverage(data_file=str(data_file), branch=True, source=[str(tmp_path / "engine")])
    cov.start()
    try:
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        for gate, fn, args in calls:
            cov.switch_context(gate)
            getattr(mod, fn)(*args)
    finally:
        cov.stop()
    cov.save()
    return data_file


def test_each_gate_gets_its_own_figures(tmp_path):
    data = measure(tmp_path, [("gate-a", "route", (1,)), ("gate-b", "route", (1,)), ("gate-b", "route", (-1,))])
    figures = reach.gate_figures(data, tmp_path)
    assert set(figures) == {"gate-a", "gate-b"}
    a, b = figures["gate-a"], figures["gate-b"]
    assert a["branches"] == b["branches"] == 6   # route's if, fold's for, other's if: two arcs each
    assert a["branches_taken"] == 1 and b["branches_taken"] == 2
    assert a["statements_reached"] < b["statements_reached"] <= a["statements"]


def test_unreached_branches_are_named_by_their_text_and_judged_against_the_reviewed_list(tmp_path):
    data = measure(tmp_path, [("gate-a", "route", (1,)), ("gate-a", "fold", ([1, 2],))])
    unreached = reach.unreached_branches(data, tmp_path, {"engine/mod.py": None})
    described = {(b.source, b.target) for b in unreached}
    assert ('if x > 0:', 'return "down"') in described
    assert ("if flag:", "return 1") in described and ("if flag:", "return 2") in described
    assert ('if x > 0:', 'return "up"') not in described
    reviewed = [dict(file="engine/mod.py", source="if flag:", target="return 1", reason="never called"),
                dict(file="engine/mod.py", source="if flag:", target="return 2", reason="never called"),
                dict(file="engine/mod.py", source="if x > 0:", target='return "up"', reason="now taken")]
    unreviewed, stale = reach.judge(unreached, reviewed)
    assert [(b.source, b.target) for b in unreviewed] == [('if x > 0:', 'return "down"')]
    assert stale == [reviewed[2]]


def test_a_branch_taken_by_any_gate_is_reached(tmp_path):
    data = measure(tmp_path, [("gate-a", "route", (1,)), ("gate-b", "route", (-1,))])
    unreached = reach.unreached_branches(data, tmp_path, {"engine/mod.py": ("route",)})
    assert unreached == []


def test_a_restricted_file_lists_only_the_branches_of_the_named_functions(tmp_path):
    data = measure(tmp_path, [("gate-a", "route", (1,))])
    unreached = reach.unreached_branches(data, tmp_path, {"engine/mod.py": ("fold",)})
    assert {b.source for b in unreached} == {"for v in values:"}


def test_a_file_no_gate_imported_has_every_branch_unreached(tmp_path):
    data = measure(tmp_path, [("gate-a", "route", (1,))])
    (tmp_path / "engine" / "never.py").write_text("def f(x):\n    if x:\n        return 1\n    return 0\n")
    unreached = reach.unreached_branches(data, tmp_path, {"engine/never.py": None})
    assert {(b.source, b.target) for b in unreached} == {("if x:", "return 1"), ("if x:", "return 0")}


def test_a_reviewed_entry_needs_a_reason(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[[branch]]\nfile = "engine/x.py"\nsource = "if a:"\ntarget = "exit"\nreason = " "\n')
    with pytest.raises(ValueError, match="reason"):
        reach.load_reviewed(path)


def test_the_repository_s_reviewed_list_is_well_formed():
    for entry in reach.load_reviewed():
        assert entry["file"] in reach.REQUEST_PATH, entry
