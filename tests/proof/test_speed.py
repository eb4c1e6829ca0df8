"""What makes the harness fast without changing a verdict: the gates' measured-seconds cache
(gates/timings.py), which orders and groups work and never decides; prove's longest-first order;
and the Hypothesis profile that keeps examples the same under pytest-xdist."""
from gates import timings
from gates.report import GateResult


def test_balance_puts_the_slowest_first_and_evens_the_bins():
    costs = [("a", 40.0), ("b", 15.0), ("c", 12.0), ("d", 10.0), ("e", 8.0), ("f", 4.0)]
    bins = timings.balance(costs, 2)
    assert bins == [["a", "f"], ["b", "c", "d", "e"]]  # 44 s and 45 s
    assert timings.balance(costs, 3) == [["a"], ["b", "e"], ["c", "d", "f"]]
    assert sorted(k for b in timings.balance(costs, 4) for k in b) == sorted(k for k, _ in costs)
    assert timings.balance([("x", 1.0)], 4) == [["x"]]
    assert timings.balance([("y", 1.0), ("x", 1.0)], 1) == [["x", "y"]]  # ties by key: deterministic


def test_the_cache_merges_and_survives_a_bad_file(tmp_path):
    path = tmp_path / "build" / "gate-seconds.json"
    assert timings.load(path) == {}
    timings.record({"lossless": 41.234}, path)
    timings.record({"combine": 9.0}, path)
    assert timings.load(path) == {"lossless": 41.23, "combine": 9.0}
    assert timings.estimate("lossless", timings.load(path)) == 41.23
    assert timings.estimate("busy", {}) == timings.STATIC_SECONDS["busy"]
    assert timings.estimate("a-new-gate", {}) == timings.UNKNOWN_SECONDS
    path.write_text("not json")
    assert timings.load(path) == {}


def test_prove_starts_the_longest_trees_first():
    """Trees are ordered by the sum of their gates' last measured seconds, estimates where none."""
    from mutants.proof.prove import schedule
    tasks = [("clean", None, ["lossless", "combine", "reason-a"], "cpu"),
             ("a", None, ["reason-a"], "cpu"),
             ("b", None, ["combine", "lossless"], "cpu"),
             ("c", None, ["predicate-split"], "cpu"),
             ("d", None, ["busy"], "cpu")]
    measured = {"lossless": 30.0, "combine": 5.0, "reason-a": 2.0, "predicate-split": 50.0}
    assert [t[0] for t in schedule(tasks, measured)] == ["c", "clean", "b", "a", "d"]
    assert [t[0] for t in schedule(tasks, {"predicate-split": 1.0})][-2:] == ["c", "d"]
    assert [t[0] for t in schedule(tasks, {})][0] == "clean"  # the static estimates alone


def test_the_ci_profile_draws_the_same_examples_on_any_xdist_worker():
    """`make test` runs pytest -n N: each test's examples must depend on the test alone, not on
    the worker, the order or an example database another worker wrote."""
    from hypothesis import settings
    for name in ("ci", "mutation"):
        profile = settings.get_profile(name)
        assert profile.derandomize and profile.database is None, name


def test_the_clean_tree_is_split_into_balanced_parts_and_merged_back():
    from mutants.proof.matrix import CLEAN, RAN, TIMEOUT, TreeRun
    from mutants.proof.prove import clean_parts, merge_clean
    gates = ["lossless", "combine", "emit-count", "reason-a", "predicate-split"]
    measured = {"lossless": 40.0, "combine": 10.0, "emit-count": 12.0, "reason-a": 4.0, "predicate-split": 15.0}
    assert clean_parts(gates, 1, measured) == [(CLEAN, gates)]
    parts = clean_parts(gates, 2, measured)
    assert [label for label, _ in parts] == [f"{CLEAN} part 1 of 2", f"{CLEAN} part 2 of 2"]
    assert sorted(g for _, part in parts for g in part) == sorted(gates)
    assert [part for _, part in parts] == [["lossless"], ["combine", "emit-count", "reason-a", "predicate-split"]]
    runs = [TreeRun(parts[0][0], RAN, {"lossless": GateResult("g", status="green")}, 40.0),
            TreeRun(parts[1][0], RAN, {"combine": GateResult("g", status="red")}, 10.0)]
    merged = merge_clean(runs)
    assert (merged.tree, merged.status, merged.seconds) == (CLEAN, RAN, 50.0)
    assert merged.gates == {"lossless": GateResult("g", status="green"), "combine": GateResult("g", status="red")}
    timed_out = merge_clean([runs[0], TreeRun(parts[1][0], TIMEOUT, detail="ran past 900 s")])
    assert timed_out.status == TIMEOUT and "part 2 of 2: ran past 900 s" in timed_out.detail
