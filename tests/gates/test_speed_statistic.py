"""speed-ab's statistic (gates/speed_ab.py, gates/measure.py PairedMedianAB), on synthetic legs: a
difference under the floor is never a ratio, one slow leg does not hide a consistent gain, and the
eager arm's allowance never reaches the graph arm."""
import pytest

from gates.measure import SPEED_MIN_EFFECT, UNDER_THE_FLOOR, PairedMedianAB


def speed(metric: str, sync: list[float], asyn: list[float]) -> PairedMedianAB:
    """speed-ab's statistic (gates/speed_ab.py): paired legs, relative differences, the 2% floor."""
    return PairedMedianAB(metric, sync, asyn, higher_is_better=metric != "tpot_ms", min_effect=SPEED_MIN_EFFECT,
                          relative=True)


def test_speed_ab_reports_a_difference_under_the_floor_never_as_a_ratio():
    noisy = speed("output_tokens_per_s", [100, 110, 105, 98, 103], [104, 108, 103, 99, 104])
    assert noisy.result == UNDER_THE_FLOOR and not noisy.b_is_worse
    assert noisy.as_dict()["result"] == UNDER_THE_FLOOR and "ratio" not in noisy.as_dict()
    slower = speed("output_tokens_per_s", [100, 101, 100, 102, 100], [90, 91, 90, 92, 90])
    assert slower.b_is_worse and slower.as_dict()["ratio"] == pytest.approx(0.9, abs=0.01)
    faster_tpot = speed("tpot_ms", [10, 10.1, 10, 10.2, 10], [9, 9.05, 9, 9.1, 9])
    assert faster_tpot.b_is_better and faster_tpot.as_dict()["ratio"] == pytest.approx(0.9, abs=0.01)


def test_one_slow_sync_leg_does_not_hide_a_consistent_gain():
    """The H200's compiled graph arm at c=1 (2026-12-02): TPOT sync 1.703, 1.703, 1.920 against async
    1.563 x 3, an 8% gain that the range floor (12.2%) called noise; paired, the gain counts."""
    sync, asyn = [1.7034, 1.7027, 1.92, 1.7031, 1.7029], [1.5633, 1.5628, 1.5633, 1.5630, 1.5631]
    ab = speed("tpot_ms", sync, asyn)
    assert ab.result == "ahead" and ab.as_dict()["ratio"] == pytest.approx(0.918, abs=0.002)
    assert {(o["runner"], o["leg"]) for o in ab.as_dict()["outliers"]} >= {("sync", 2)}


def test_speed_ab_names_each_a_b_where_async_is_behind_in_one_line():
    """The graph arm's red line: concurrency, metric, the ratio and the interval of the median
    per-leg change, never the statistic's whole record (the H200's 2026-12-03 verdict quoted it raw)."""
    from gates.speed_ab import behind_line
    slow = speed("tpot_ms", [16.7551, 17.6495, 20.3055, 17.2, 18.0], [22.7039, 23.1372, 24.5656, 23.0, 23.5])
    assert slow.b_is_worse
    line = behind_line({"concurrency": 8, **slow.as_dict()})
    low, high = slow.as_dict()["interval"]
    assert line == (f"c=8 tpot_ms async/sync {slow.as_dict()['ratio']:.3f} (median per-leg change {low:+.1%} to "
                    f"{high:+.1%})")
    ahead = speed("tpot_ms", [0.52, 0.53, 0.51, 0.52, 0.52], [0.34, 0.35, 0.34, 0.35, 0.34])
    assert not ahead.b_is_worse


def test_the_ratio_is_rounded_to_4_places_like_every_other_figure():
    """A gain of exactly 1/3 on every leg: the ratio 4/3 is reported as 1.3333, not 1.33333."""
    sync = [3.0, 6.0, 9.0, 12.0, 15.0]
    d = speed("output_tokens_per_s", sync, [v * 4 / 3 for v in sync]).as_dict()
    assert d["result"] == "ahead" and d["ratio"] == 1.3333 and d["median_difference"] == 0.3333
