"""The busy gate's statistic and decision (gates/measure.py), on synthetic legs: the statistic
must tolerate one collapsed leg (and name it), and must still go red on a real regression."""
import pytest

from gates.measure import (
    BUSY_MIN_EFFECT,
    UNDER_THE_FLOOR,
    PairedMedianAB,
    bootstrap_median_interval,
    judge_busy,
    median,
    outliers,
)

# Measured on the H200 at 3bee987 (graph arm, fixtures): leg 4 collapsed in both runners.
H200_SYNC = [.435, .430, .434, .422, .345]
H200_ASYNC = [.601, .593, .603, .596, .391]
THRESHOLD = 0.5  # a level between the synthetic legs' sync (~0.43) and async (~0.60) levels


def test_one_collapsed_leg_is_named_and_does_not_hide_the_gain():
    ab = PairedMedianAB("busy", H200_SYNC, H200_ASYNC, min_effect=BUSY_MIN_EFFECT)
    assert ab.result == "ahead"
    assert ab.interval[0] > BUSY_MIN_EFFECT
    named = {(o["runner"], o["leg"]) for o in ab.as_dict()["outliers"]}
    assert named == {("sync", 4), ("async", 4), ("async-sync", 4)}
    assert judge_busy("graph", ab, THRESHOLD) == []
    # The range floor this replaces ((max - min) / mean, the larger runner's) called the same legs
    # noise: the red the H200 saw.
    mean_gain = sum(H200_ASYNC) / sum(H200_SYNC) - 1
    range_floor = max((max(v) - min(v)) / (sum(v) / len(v)) for v in (H200_SYNC, H200_ASYNC))
    assert mean_gain < range_floor


def test_a_collapsed_leg_among_seven_changes_neither_median_nor_verdict():
    sync, asyn = H200_SYNC[:4] + [.431, .428, .345], H200_ASYNC[:4] + [.598, .600, .391]
    ab = PairedMedianAB("busy", sync, asyn)
    assert ab.result == "ahead" and ab.interval[0] > 0.1
    assert judge_busy("graph", ab, THRESHOLD) == []
    assert [o["leg"] for o in outliers(asyn)] == [6]


def test_async_less_busy_than_sync_is_red_in_both_arms():
    ab = PairedMedianAB("busy", H200_ASYNC[:4] + [.598, .600, .604], H200_SYNC[:4] + [.431, .428, .433])
    assert ab.result == "behind"
    for arm in ("eager", "graph"):
        problems = judge_busy(arm, ab, THRESHOLD)
        assert any("less busy" in p for p in problems), problems


def test_negative_control_a_blocking_async_runner_is_as_idle_as_sync_and_red_in_the_graph_arm():
    """The seeded defect's signature: async and sync draw from the same distribution."""
    sync = [.435, .430, .434, .422, .431, .428, .433]
    blocking_async = [.431, .436, .429, .433, .427, .434, .430]
    ab = PairedMedianAB("busy", sync, blocking_async)
    assert ab.result == UNDER_THE_FLOOR
    problems = judge_busy("graph", ab, THRESHOLD)
    assert any(UNDER_THE_FLOOR in p for p in problems) and any("under the threshold" in p for p in problems)
    assert judge_busy("eager", ab, THRESHOLD) == []  # the eager arm asks only "not worse"


def test_ahead_but_under_the_level_is_red():
    ab = PairedMedianAB("busy", [.30, .31, .30, .29, .30, .31, .30], [.40, .41, .40, .39, .40, .41, .40])
    assert ab.result == "ahead"
    assert any("under the threshold 0.95" in p for p in judge_busy("graph", ab, 0.95))
    assert judge_busy("graph", ab, 0.35) == []


def test_a_level_reached_exactly_counts_as_reached_for_both_runners():
    """The threshold is a level to reach: the async runner at exactly the threshold passes it, and
    the sync runner at exactly the threshold reaches it too, so the negative control is red."""
    ab = PairedMedianAB("busy", H200_SYNC, H200_ASYNC, min_effect=BUSY_MIN_EFFECT)
    assert (median(H200_SYNC), median(H200_ASYNC)) == (.430, .596)
    assert judge_busy("graph", ab, .596) == []
    problems = judge_busy("graph", ab, .430)
    assert len(problems) == 1 and "the negative control passed" in problems[0], problems


def test_lower_is_better_flips_the_sides():
    tpot = PairedMedianAB("tpot_ms", [10.0, 10.1, 10.2, 10.0, 10.1], [9.0, 9.1, 9.0, 9.2, 9.1],
                          higher_is_better=False)
    assert tpot.result == "ahead" and tpot.b_is_better and not tpot.b_is_worse


def test_the_bootstrap_is_seeded_and_named():
    diffs = [.166, .163, .169, .174, .046, .170, .160]
    assert bootstrap_median_interval(diffs, seed=0) == bootstrap_median_interval(diffs, seed=0)
    lo, hi = bootstrap_median_interval(diffs, resamples=2000, confidence=0.95, seed=3)
    assert lo <= median(diffs) <= hi
    d = PairedMedianAB("busy", H200_SYNC, H200_ASYNC).as_dict()
    assert d["resamples"] == 2000 and d["confidence"] == 0.95 and "bootstrap" in d["statistic"]
    assert "ratio" not in d


def test_too_few_or_unpaired_legs_are_refused():
    with pytest.raises(ValueError, match="at least"):
        PairedMedianAB("busy", [.4, .4, .4], [.5, .5, .5])
    with pytest.raises(ValueError, match="paired"):
        PairedMedianAB("busy", [.4] * 5, [.5] * 6)


def test_the_busy_threshold_is_0_95_unless_given_and_a_given_one_must_be_a_fraction(monkeypatch):
    from gates.busy import busy_threshold

    class Config:
        def getoption(self, name):
            raise ValueError(name)  # run without the gates plugin: the environment decides
    monkeypatch.delenv("SPECGATE_BUSY_THRESHOLD", raising=False)
    assert busy_threshold(Config()) == (0.95, "default 0.95")
    monkeypatch.setenv("SPECGATE_BUSY_THRESHOLD", "0.97")
    assert busy_threshold(Config()) == (0.97, "given (--busy-threshold or SPECGATE_BUSY_THRESHOLD)")
    monkeypatch.setenv("SPECGATE_BUSY_THRESHOLD", "1.5")
    with pytest.raises(pytest.UsageError, match="in \\(0, 1\\]"):
        busy_threshold(Config())


def test_a_level_the_sync_runner_also_reaches_is_red_for_its_negative_control():
    """On a model whose step dwarfs the host's work even the blocking runner keeps the device busy:
    a level both runners reach tells nothing, and the gate says so instead of going green."""
    sync = [.955, .957, .956, .954, .958, .956, .955]
    ab = PairedMedianAB("busy", sync, [v + .03 for v in sync], min_effect=BUSY_MIN_EFFECT)
    assert ab.result == "ahead"
    (problem,) = judge_busy("graph", ab, 0.95)
    assert problem.startswith("the negative control passed: the sync runner's busy level 0.956 reaches")
    assert judge_busy("graph", ab, 0.97) == []
    assert judge_busy("eager", ab, None) == []


def test_the_host_read_hook_flags_undeclared_reads_and_counts_declared_ones():
    import torch

    from engine.host_sync import DeclaredSyncs
    from gates.no_sync import HostReads
    declared, t = DeclaredSyncs(), torch.tensor([1, 2])
    reads = HostReads(declared)
    with reads:
        t.tolist()
        with declared.allow("deferred result read"):
            t.tolist()
        int(t[0])
        t.cpu()
    assert [r.split("(")[0].strip() for r in reads.undeclared] == [".tolist", ".__int__", ".cpu"]
    assert reads.allowed == 1 and declared.counts == {"deferred result read": 1} and declared.active is None


def test_a_consistent_gap_under_one_point_is_under_the_floor_and_a_larger_one_is_behind():
    sync = [.435, .430, .434, .422, .431, .428, .433]
    slightly = PairedMedianAB("busy", sync, [v - .003 for v in sync], min_effect=BUSY_MIN_EFFECT)
    assert slightly.result == UNDER_THE_FLOOR and judge_busy("eager", slightly, None) == []
    clearly = PairedMedianAB("busy", sync, [v - .05 for v in sync], min_effect=BUSY_MIN_EFFECT)
    assert clearly.result == "behind" and judge_busy("eager", clearly, None)


@pytest.mark.parametrize("graph, submissions, activities, replays, grouped", [
    (True, 40, 16_000, 31, True),      # 31 replays of ~500 kernels, plus the uploads
    (True, 16_000, 16_000, 31, False),  # no correlation ids: every kernel alone
    (True, 20, 16_000, 31, False),      # fewer submissions than replays: ids merged across replays
    (True, 40, 16_000, 0, False),       # the graph arm that never replayed
    (False, 12_000, 12_000, 0, True),   # eager: every launch is its own submission
])
def test_busy_trusts_the_grouping_only_when_replays_became_submissions(graph, submissions, activities, replays,
                                                                       grouped):
    from gates.busy import DecodeBusy
    measured = DecodeBusy(0.9, 0.8, submissions, activities, replays, steps=31, idle_ns={}, host_ns={})
    assert measured.grouped(graph) is grouped


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert median([3.0, 1.0, 2.0]) == 2.0


def test_an_outlier_is_reported_with_its_leg_value_median_and_distance_rounded_as_documented():
    from gates.measure import MAD_TO_SIGMA
    legs = [1.23456, 1.33457, 1.13458, 1.23455, 5.123456]
    mid = 1.23456
    scale = MAD_TO_SIGMA * (mid - 1.13458)  # the median absolute deviation
    (named,) = outliers(legs)
    assert named == {"leg": 4, "value": 5.1235, "median": 1.2346, "mads": round((5.123456 - mid) / scale, 1)}
    assert outliers([2.5, 2.5, 2.5, 7.77777]) == [{"leg": 3, "value": 7.7778, "median": 2.5, "mads": "inf"}]


def test_the_a_b_reports_name_both_runners_and_round_every_figure_to_4_places():
    p = PairedMedianAB("busy", [0.41234567, 0.42, 0.43, 0.44, 0.45], [0.51234567, 0.52, 0.53, 0.54, 0.56]).as_dict()
    assert p["sync_legs"][0] == 0.4123 and p["async_legs"][0] == 0.5123
    assert all(type(v) is float and round(v, 4) == v for v in p["interval"]) and p["interval"][0] < p["interval"][1]


def test_the_graph_arm_is_judged_on_the_unprofiled_legs_and_the_eager_arm_on_the_profiled_ones():
    """The profiler costs the host it watches, so the graph arm's verdict reads the legs measured
    without it; in the eager arm the host's launches sit inside each step's event pair, so there
    the profiled legs are judged."""
    from gates.busy import UnprofiledBusy, judged_legs
    profiled = {"sync": [.60, .61], "async": [.90, .91]}
    unprofiled = {runner: [UnprofiledBusy(level, {}) for level in levels]
                  for runner, levels in {"sync": [.80, .81], "async": [.98, .99]}.items()}
    assert judged_legs(True, profiled, unprofiled) == {"sync": [.80, .81], "async": [.98, .99]}
    assert judged_legs(False, profiled, unprofiled) == profiled
