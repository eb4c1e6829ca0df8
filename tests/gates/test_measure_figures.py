"""The speed and busy gates' figures (gates/measure.py) for inputs small enough to work out by
hand: a timed leg on a scripted engine and clock, every field of both A/B reports, the bootstrap
interval against the exact bootstrap distribution, the outlier rule on both sides of its
boundary, and the busy verdict's sentences word for word."""
import math
from types import SimpleNamespace

import pytest

from gates import measure
from gates.measure import PairedMedianAB, TimedLeg, bootstrap_median_interval, judge_busy, outliers


class ScriptedEngine:
    """LLM.add_request / has_unfinished / step on a script: steps[i] maps a request's index to
    (tokens it emits in step i + 1, whether it finishes then). Each step takes 0.5 s of `time_source`
    (`clock` is where timed_leg hands the engine its step clock, as LLM.clock)."""

    def __init__(self, time_source, steps):
        self.time_source, self.steps, self.added, self.requests = time_source, steps, [], []

    def add_request(self, prompt, params):
        self.added.append((prompt, params))
        request = SimpleNamespace(request_id=10 + len(self.requests), output_token_ids=[], is_finished=False)
        self.requests.append(request)
        return request

    def has_unfinished(self):
        return any(not r.is_finished for r in self.requests)

    def step(self):
        self.time_source.now += 0.5
        for i, (tokens, finishes) in self.steps.pop(0).items():
            self.requests[i].output_token_ids += [1] * tokens
            self.requests[i].is_finished = finishes


def timed(monkeypatch, steps, num_reqs):
    clock = SimpleNamespace(now=100.0)
    clock.perf_counter = lambda: clock.now
    monkeypatch.setattr(measure, "time", clock)
    engine, params = ScriptedEngine(clock, steps), object()
    prompts = [f"prompt {i}" for i in range(num_reqs)]
    leg = measure.timed_leg(engine, prompts, params, "async", 8, 2, True)
    assert engine.added == [(p, params) for p in prompts]
    return leg


def test_a_timed_leg_reports_tokens_seconds_and_the_mean_time_per_output_token(monkeypatch):
    # Request 0: 3 tokens, first at 100.5 s, done at 103.5 s: 1.5 s a token after the first.
    # Request 1: one token, so no time per output token. Request 2: 3 tokens in 0.5 s: 0.25 s.
    # Request 3: 2 tokens, 0.5 s apart. Mean (1.5 + 0.25 + 0.5) / 3 = 0.75 s.
    steps = [{0: (1, False), 2: (1, False), 3: (1, False)}, {1: (1, True), 2: (2, True), 3: (1, True)}, {},
             {0: (1, False)}, {}, {}, {0: (1, True)}]
    assert timed(monkeypatch, steps, 4) == TimedLeg("async", 8, 2, True, 9, 3.5, 750.0)


def test_a_leg_of_single_token_requests_has_no_time_per_output_token(monkeypatch):
    assert timed(monkeypatch, [{0: (1, False)}, {0: (0, True), 1: (1, True)}], 2) == TimedLeg(
        "async", 8, 2, True, 2, 1.0, None)


def test_the_speed_a_b_report_states_its_relative_paired_figures_rounded_to_4_places():
    """Throughput legs where async gains exactly 1/8 on every leg (dyadic legs: the relative
    differences are exact): the median change, its interval and the ratio are all 1.125."""
    sync = [96.0, 100.0, 104.0, 112.0, 128.0]
    ab = PairedMedianAB("output_tokens_per_s", sync, [v * 1.125 for v in sync], min_effect=0.02, relative=True)
    d = ab.as_dict()
    assert d["statistic"] == "percentile bootstrap of the median of per-leg relative differences (async / sync - 1)"
    assert d["sync_legs"] == sync and d["async_legs"] == [108.0, 112.5, 117.0, 126.0, 144.0]
    assert (d["sync_median"], d["async_median"]) == (104.0, 117.0)
    assert d["median_difference"] == 0.125 and d["interval"] == [0.125, 0.125] and d["min_effect"] == 0.02
    assert d["result"] == "ahead" and d["ratio"] == 1.125
    # lower is better (TPOT): the same gain in time is "ahead" with a ratio under 1
    tpot = PairedMedianAB("tpot_ms", sync, [v * 0.875 for v in sync], higher_is_better=False, min_effect=0.02,
                          relative=True).as_dict()
    assert tpot["result"] == "ahead" and tpot["ratio"] == 0.875


def test_the_busy_a_b_report_states_every_figure_rounded_to_4_places():
    """Every leg gains exactly 2023/16384 (dyadic legs, so the differences are exact): the median
    difference and both ends of its bootstrap interval are that gain, whatever the resamples."""
    sync = [0.40625, 0.4375, 0.46875, 0.5, 0.53125]
    ab = PairedMedianAB("busy", sync, [v + 2023 / 16384 for v in sync], min_effect=0.01, seed=7)
    assert ab.as_dict() == {
        "metric": "busy", "statistic": "percentile bootstrap of the median of per-leg differences (async - sync)",
        "resamples": 2000, "confidence": 0.95, "seed": 7, "legs": 5,
        "sync_legs": [0.4062, 0.4375, 0.4688, 0.5, 0.5312], "async_legs": [0.5297, 0.561, 0.5922, 0.6235, 0.6547],
        "sync_median": 0.4688, "async_median": 0.5922, "median_difference": 0.1235, "interval": [0.1235, 0.1235],
        "min_effect": 0.01,
        "outlier_rule": "beyond 3 scaled MADs (1.4826 x MAD) of the median; named, kept in every statistic",
        "outliers": [], "result": "ahead"}


@pytest.mark.parametrize("seed", [0, 1, 5])
def test_the_bootstrap_interval_is_the_exact_bootstrap_quantiles_of_the_median(seed):
    """Resamples of [0, 1, 2] have median 0 with probability 7/27 (two or three draws of 0), 1 with
    13/27, 2 with 7/27. A 40% interval cuts 30% off each side, inside the middle class; a 60%
    interval cuts 20%, inside the outer classes. 2000 resamples put each cut 4 standard errors
    or more from a class boundary, so any seed gives the exact answer."""
    assert bootstrap_median_interval([0.0, 1.0, 2.0], 2000, 0.4, seed=seed) == (1.0, 1.0)
    assert bootstrap_median_interval([0.0, 1.0, 2.0], 2000, 0.6, seed=seed) == (0.0, 2.0)


def test_a_full_confidence_interval_spans_the_smallest_and_the_largest_resampled_median():
    legs = [float(i) for i in range(1001)]
    lo, hi = bootstrap_median_interval(legs, 2, 1.0, seed=0)   # two resamples, two different medians
    assert 0 <= lo < hi <= 1000
    assert bootstrap_median_interval([0.0, 1.0, 2.0], 2000, 1.0, seed=0) == (0.0, 2.0)


def test_the_seed_decides_the_interval_and_the_a_b_draws_with_the_seed_and_confidence_it_reports():
    legs = [float(i) for i in range(1001)]
    assert bootstrap_median_interval(legs, 20, 0.5, seed=1) == bootstrap_median_interval(legs, 20, 0.5, seed=1)
    assert bootstrap_median_interval(legs, 20, 0.5, seed=1) != bootstrap_median_interval(legs, 20, 0.5, seed=2)
    ab = PairedMedianAB("busy", [0.0] * 1001, legs, resamples=20, confidence=0.5, seed=2)
    assert ab.interval == bootstrap_median_interval(legs, 20, 0.5, seed=2) and ab.as_dict()["seed"] == 2


def test_a_leg_exactly_three_scaled_mads_out_is_kept_quiet_and_one_beyond_is_named():
    """Median 0 and MAD 1: the bound is 3 x 1.4826, and the rule says further than that."""
    bound = 3 * 1.4826
    assert outliers([-1, -1, 0, 0, 0, 1, bound]) == []
    beyond = math.nextafter(bound, math.inf)
    assert outliers([-1, -1, 0, 0, 0, 1, beyond]) == [{"leg": 6, "value": 4.4478, "median": 0, "mads": 3.0}]


def test_with_no_spread_every_other_leg_is_named_with_its_median_rounded_to_4_places():
    assert outliers([1.234567] * 3 + [9.0]) == [{"leg": 3, "value": 9.0, "median": 1.2346, "mads": "inf"}]


# sync legs with leg 6 collapsed, async exactly 0.125 below each: behind, leg 6 named in both.
SYNC = [0.5, 0.5625, 0.53125, 0.5, 0.5625, 0.53125, 0.25]
BEHIND = ("async median 0.4062, sync median 0.5312, median difference -0.125, 95% interval [-0.125, -0.125] "
          "over 7 legs; outliers named: sync leg 6 = 0.25, async leg 6 = 0.125")


def test_a_busy_regression_is_told_in_full_with_its_figures_and_outliers():
    ab = PairedMedianAB("busy", SYNC, [v - 0.125 for v in SYNC], min_effect=0.01)
    assert judge_busy("graph", ab, 0.6) == [
        f"the async runner keeps the GPU less busy than the sync runner: graph arm: {BEHIND}",
        f"the async runner's busy level 0.406 is under the threshold 0.6: graph arm: {BEHIND}"]
    assert judge_busy("eager", ab, None) == [
        f"the async runner keeps the GPU less busy than the sync runner: eager arm: {BEHIND}"]


def test_a_graph_arm_at_the_level_but_without_a_gain_is_red_for_the_gain_alone():
    ab = PairedMedianAB("busy", [0.495] * 5, [0.5] * 5, min_effect=0.01)
    assert judge_busy("graph", ab, 0.5) == [
        "the async runner shows no busy-time gain over the sync runner beyond the floor (under the floor): "
        "graph arm: async median 0.5, sync median 0.495, median difference 0.005, 95% interval [0.005, 0.005] "
        "over 5 legs"]


def test_a_timed_leg_records_the_engine_host_phases_and_gives_the_clock_back(make_llm):
    """speed-ab's legs carry where the host's time went (a slower runner shows which phase), and
    the engine keeps no clock after the leg."""
    from engine import SamplingParams
    from engine.clock import NullClock
    llm = make_llm(spec="ngram", num_spec_tokens=4, max_num_seqs=2)
    leg = measure.timed_leg(llm, ["hello there", "the quick brown fox"], SamplingParams(temperature=0, max_tokens=6),
                            "async", 2, 1, True)
    phases = leg.host_ms_per_step
    assert set(phases) == {"plan", "upload", "launch", "completion", "completion_wait", "total"}
    assert phases["launch"] > 0 and phases["total"] >= phases["launch"]
    assert isinstance(llm.clock, NullClock)
