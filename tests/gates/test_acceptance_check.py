"""The acceptance gate's checks (gates/acceptance.py) without an engine: a leg's acceptance
recomputed from a hand-written trace in both oracle engines' units, the comparison with the
bench's record (and the identity that ties the units together), the warm-leg predicate and the
drafter's figures of the fold, traced_legs driving the bench's own run_bench on scripted
engines, and the seeded draw of the leg and warm-up counts the gate's cases run."""
import dataclasses

import pytest

from engine.bench import legs as bench
from engine.bench.workload import Workload
from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.trace import StepTrace
from gates.acceptance import (
    DEEP_MAX_EXTRA,
    DEEP_MAX_WARMUP,
    DEEP_SETTINGS,
    EXTRA_LEGS,
    RUNS,
    WARMUPS,
    FoldSetting,
    acceptance_difference,
    expected_acceptance,
    fold_difference,
    fold_settings,
    traced_legs,
    width0_beside_drafts,
)
from gates.compare import Difference
from helpers.traces import record

IDENTITY = "completion = prefills + verify steps + accepted - truncated"


def k1_leg():
    """k = 1, two requests. Request 0 (max_tokens 2): its draft accepted, the bonus token truncated,
    then the step the async runner launched past its end. Request 1 (max_tokens 3): its draft
    rejected, then a step without a draft."""
    trace = [StepTrace(0, "async/eager", requests=[record(0, 0, [7, 8, 9], sampled=[10], prefill=True),
                                                   record(1, 0, [5], sampled=[6], prefill=True)]),
             StepTrace(1, "async/eager", requests=[record(0, 3, [10, 11], [11], 1, [11, 12]),
                                                   record(1, 1, [6, 3], [3], 0, [6])]),
             StepTrace(2, "async/eager", requests=[record(0, 5, [12, 1], [1], 0, [2]),
                                                   record(1, 2, [6, 0], sampled=[4])])]
    outputs = [RequestOutput(0, None, [7, 8, 9], [10, 11], "", "length", RequestStats(
                   num_drafts=1, num_draft_tokens=1, num_accepted_tokens=1, verify_steps=1, num_prefills=1,
                   num_truncated=1, accepted_per_position=[1])),
               RequestOutput(1, None, [5], [6, 6, 4], "", "length", RequestStats(
                   num_drafts=1, num_draft_tokens=1, verify_steps=2, num_prefills=1))]
    return outputs, trace


K1_EXPECTED = {"num_requests": 2, "completion_tokens": 5, "verify_steps": 3, "num_drafts": 2, "num_draft_tokens": 2,
               "num_accepted_tokens": 1, "accepted_per_position": [1], "mean_acceptance_length": 1.5,
               "acceptance_rate": 0.5, "accept_length": 1.6667, "_prefills": 2, "_truncated": 1}


def test_a_leg_s_acceptance_is_recomputed_from_its_real_trace_records_in_both_units():
    assert expected_acceptance(*k1_leg()) == K1_EXPECTED


def test_a_resume_s_drafts_count_and_it_is_a_prefill_not_a_verify_step():
    """Request 1 of k1_leg preempted after its first verify step: its resume recomputes [5, 6, 6]
    and verifies the draft it held (rejected, the correction 4). The identity still holds."""
    outputs, trace = k1_leg()
    trace[2].requests[1] = record(1, 0, [5, 6, 6, 9], [9], 0, [4], prefill=True, draft_slots=1)
    outputs[1].stats = RequestStats(num_drafts=2, num_draft_tokens=2, verify_steps=1, num_prefills=2,
                                    num_preemptions=1)
    expected = {**K1_EXPECTED, "verify_steps": 2, "num_drafts": 3, "num_draft_tokens": 3,
                "mean_acceptance_length": 1.3333, "acceptance_rate": 0.3333, "accept_length": 2.5, "_prefills": 3}
    assert expected_acceptance(outputs, trace) == expected
    assert acceptance_difference(0, {k: v for k, v in expected.items() if not k.startswith("_")}, expected) is None


def test_a_request_that_decodes_without_drafts_counts_its_steps_as_the_engine_does():
    """A request whose sampling needs the host (a logits processor, a penalty) decodes with spec
    width 0 beside drafting ones: each such step is a verify step to the engine
    (Request.record_verify), so the recomputed units and their identity must count it too."""
    outputs, trace = k1_leg()
    outputs.append(RequestOutput(2, None, [4], [5, 6, 7], "", "length", RequestStats(verify_steps=2,
                                                                                       num_prefills=1)))
    trace[0].requests.append(record(2, 0, [4], sampled=[5], prefill=True))
    trace[1].requests.append(record(2, 1, [5], sampled=[6]))
    trace[2].requests.append(record(2, 2, [6], sampled=[7]))
    expected = expected_acceptance(outputs, trace)
    assert expected == {**K1_EXPECTED, "num_requests": 3, "completion_tokens": 8, "verify_steps": 5,
                        "accept_length": 1.6, "_prefills": 3}
    assert expected["verify_steps"] == sum(o.stats.verify_steps for o in outputs)
    assert acceptance_difference(0, {k: v for k, v in expected.items() if not k.startswith("_")}, expected) is None
    assert width0_beside_drafts(outputs, trace, 2) and not width0_beside_drafts(outputs, trace, 0)


def test_a_leg_without_verify_steps_has_the_units_empty_values():
    trace = [StepTrace(0, "sync/eager", requests=[record(0, 0, [7], sampled=[10], prefill=True)])]
    outputs = [RequestOutput(0, None, [7], [10], "", "length", RequestStats(num_prefills=1))]
    assert expected_acceptance(outputs, trace) == {
        "num_requests": 1, "completion_tokens": 1, "verify_steps": 0, "num_drafts": 0, "num_draft_tokens": 0,
        "num_accepted_tokens": 0, "accepted_per_position": [], "mean_acceptance_length": 1.0, "acceptance_rate": 0.0,
        "accept_length": 0.0, "_prefills": 1, "_truncated": 0}


K2 = {"num_requests": 1, "completion_tokens": 8, "verify_steps": 4, "num_drafts": 3, "num_draft_tokens": 6,
      "num_accepted_tokens": 3, "accepted_per_position": [2, 1], "mean_acceptance_length": 2.0,
      "acceptance_rate": 0.5, "accept_length": 2.0, "_prefills": 1, "_truncated": 0}


def reported(**changes) -> dict:
    """What the bench records for the K2 leg: the units' fields, none of the trace-only ones."""
    return {**{k: v for k, v in K2.items() if not k.startswith("_")}, **changes}


def test_the_bench_s_record_may_pad_per_position_counts_with_zeros_but_nothing_else():
    assert acceptance_difference(3, reported(accepted_per_position=[2, 1, 0, 0]), K2) is None
    assert acceptance_difference(3, reported(accepted_per_position=[2, 1, 1]), K2) == Difference(
        "leg acceptance accepted_per_position", 3, None, None, [2, 1], [2, 1, 1])
    assert acceptance_difference(3, reported(accepted_per_position=[2]), K2) == Difference(
        "leg acceptance accepted_per_position", 3, None, None, [2, 1], [2])


def test_every_field_of_the_record_is_compared_whatever_the_order_of_the_expected_fields():
    trace_only_first = dict(sorted(K2.items()))   # "_prefills" and "_truncated" sort first
    for name in reported():
        value = [9] if name == "accepted_per_position" else -1
        wrong = reported(**{name: value})
        want = Difference(f"leg acceptance {name}", 3, None, None, K2[name], value)
        assert acceptance_difference(3, wrong, K2) == acceptance_difference(3, wrong, trace_only_first) == want


def test_a_trace_whose_units_do_not_add_up_is_red_even_when_the_record_matches_it():
    outputs, trace = k1_leg()
    trace[2].requests[1].sampled.append(5)   # one token traced that no counter accounts for
    expected = expected_acceptance(outputs, trace)
    assert expected == {**K1_EXPECTED, "_truncated": 2}
    assert acceptance_difference(3, {k: v for k, v in expected.items() if not k.startswith("_")}, expected) == \
        Difference(IDENTITY, 3, None, None, 5, 4)


def test_a_leg_whose_trace_holds_no_record_is_red_against_the_bench_s_record_not_an_error():
    """The bench's record of k1_leg beside an empty trace (its steps not traced): every unit
    recomputes empty, and the check names the first field the record has and the trace does not."""
    outputs, _ = k1_leg()
    expected = expected_acceptance(outputs, [])
    assert expected["accepted_per_position"] == [] and expected["verify_steps"] == expected["_prefills"] == 0
    record_of_the_leg = {k: v for k, v in K1_EXPECTED.items() if not k.startswith("_")}
    assert acceptance_difference(3, record_of_the_leg, expected) == Difference(
        "leg acceptance verify_steps", 3, None, None, 0, 3)


@pytest.fixture(scope="module")
def bench_legs(scripted_bench) -> list:
    """Two concurrencies of three legs, one warm-up leg each, with a drafter's acceptance."""
    out = RequestOutput(0, None, [1], [2, 2, 2], "", "length", RequestStats(
        num_drafts=2, num_draft_tokens=3, num_accepted_tokens=1, verify_steps=2, num_prefills=1,
        accepted_per_position=[1]))
    return scripted_bench([1, 4], 3, 1, {(c, i): (0.5 + i, [out]) for c in (1, 4) for i in range(3)})


def test_a_leg_counted_against_the_warm_leg_predicate_is_named_with_its_concurrency(bench_legs):
    workload = Workload.uniform(["p"], 4)
    assert fold_difference(bench_legs, workload, "ngram") is None
    legs = [dataclasses.replace(leg, warm=False) if (leg.concurrency, leg.index) == (4, 1) else leg
            for leg in bench_legs]
    assert fold_difference(legs, workload, "ngram") == Difference("warm-leg predicate", None, None, 4, True, False)


def test_the_fold_check_reads_the_drafter_s_figures(bench_legs, monkeypatch):
    """A bench that plots the folded τ wrong: the figures only a run with a drafter has."""
    figures = bench.figures

    def wrong_tau(legs, spec):
        out = figures(legs, spec)
        for fig in out.values():
            if "tau_fold" in fig:
                fig["tau_fold"] += 1
        return out
    monkeypatch.setattr(bench, "figures", wrong_tau)
    assert fold_difference(bench_legs, Workload.uniform(["p"], 4), "ngram") == Difference(
        "folded figures.1.tau_fold (recomputed from the legs)", None, None, None, 1.5, 2.5)


class ScriptedLLM:
    """What bench.run_leg reads of an LLM; each generate call traces and returns k1_leg()."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.trace = kwargs, [], []
        self.runner = type("Runner", (), {"is_cuda": False})()
        self.config = type("Config", (), {"spec": kwargs.get("spec")})()

    def generate(self, prompts, params, arrival_steps=None):
        self.calls.append((prompts, arrival_steps))
        outputs, trace = k1_leg()
        self.trace += trace
        return outputs


WORKLOAD = Workload(("a", "b"), (2, 3), arrival_steps=(0, 2))


def test_traced_legs_runs_the_bench_s_legs_on_traced_engines_and_keeps_each_leg_s_trace(capsys):
    engines = []

    def make_llm(**kwargs):
        engines.append(ScriptedLLM(**kwargs))
        return engines[-1]
    legs, expected, traces = traced_legs(make_llm, WORKLOAD, spec="ngram")
    assert [e.kwargs for e in engines] == [dict(trace=True, max_num_seqs=c, spec="ngram") for c in (1, 4)]
    assert all(e.calls == [(["a", "b"], [0, 2])] * 3 for e in engines)
    assert [(leg.concurrency, leg.index, leg.warm) for leg in legs] == [
        (c, i, i >= 1) for c in (1, 4) for i in range(3)]
    assert expected == {(c, i): {**K1_EXPECTED, "_width0_beside_drafts": False} for c in (1, 4) for i in range(3)}
    assert traces == {(c, i): k1_leg()[1] for c in (1, 4) for i in range(3)}
    assert all(acceptance_difference(leg.index, leg.acceptance, K1_EXPECTED) is None for leg in legs)
    assert capsys.readouterr().err == "", "the bench's progress bar is off in a gate"


def test_traced_legs_refuses_a_bench_that_does_not_report_every_leg(monkeypatch):
    run_bench = bench.run_bench

    def forgetful(*args, on_leg, **kwargs):
        return run_bench(*args, on_leg=lambda leg: leg.index == 0 or on_leg(leg), **kwargs)
    monkeypatch.setattr(bench, "run_bench", forgetful)
    with pytest.raises(AssertionError) as refused:
        traced_legs(lambda **kwargs: ScriptedLLM(**kwargs), WORKLOAD, spec="ngram")
    assert str(refused.value).splitlines()[0] == "on_leg did not see every leg once, in order, as it finished"


def test_each_drafter_s_cases_draw_every_warm_up_count_and_cost_what_one_warm_up_leg_did():
    settings = fold_settings(("ngram", "block"))
    assert settings == fold_settings(("ngram", "block")), "the draw is seeded"
    assert list(settings) == [(d, *run) for d in ("ngram", "block") for run in RUNS]
    for drafter in ("ngram", "block"):
        mine = [s for (d, *_), ss in settings.items() if d == drafter for s in ss]
        assert sorted(s.warmup_legs for s in mine) == sorted(WARMUPS) == [0, 1, 2, 3]
        assert all(s.legs - s.warmup_legs in EXTRA_LEGS for s in mine)
    assert sum(s.legs for ss in settings.values() for s in ss) == 3 * len(settings)
    assert fold_settings(("ngram",), seed=1) != fold_settings(("ngram",)), "the seed orders the draw"


def test_the_deep_draw_adds_free_settings_to_each_case():
    ci, deep = fold_settings(("ngram",)), fold_settings(("ngram",), deep=True)
    assert ci.keys() == deep.keys()
    for key, settings in deep.items():
        assert settings[0] == ci[key][0] and len(settings) == 1 + DEEP_SETTINGS
    free = [s for settings in deep.values() for s in settings[1:]]
    assert {s.warmup_legs for s in free} == set(range(DEEP_MAX_WARMUP + 1))   # this seed's draw reaches both ends
    assert {s.legs - s.warmup_legs for s in free} == set(range(1, DEEP_MAX_EXTRA + 1))


@pytest.mark.parametrize("legs, warmup_legs", [(2, 2), (1, 3), (3, -1)])
def test_a_fold_setting_without_a_warm_leg_is_refused(legs, warmup_legs):
    with pytest.raises(ValueError, match="0 <= warmup_legs < legs"):
        FoldSetting(legs, warmup_legs)
    assert FoldSetting(legs + 3, max(warmup_legs, 0)).legs == legs + 3


def test_the_warm_leg_predicate_is_checked_at_the_warm_up_the_bench_ran(scripted_bench):
    out = RequestOutput(0, None, [1], [2, 2], "", "length", RequestStats(verify_steps=1, num_prefills=1))
    for warmup in (0, 2):
        legs = scripted_bench([1], 3, warmup, {(1, i): (1.0 + i, [out]) for i in range(3)})
        workload = Workload.uniform(["p"], 4)
        assert fold_difference(legs, workload, "ngram", warmup) is None
        other = 1 if warmup == 0 else 0
        assert fold_difference(legs, workload, "ngram", other).what == "warm-leg predicate"


def test_traced_legs_runs_the_legs_and_warm_up_asked_for():
    engines = []

    def make_llm(**kwargs):
        engines.append(ScriptedLLM(**kwargs))
        return engines[-1]
    legs, expected, _ = traced_legs(make_llm, WORKLOAD, 4, 2, spec="ngram")
    assert [(leg.concurrency, leg.index, leg.warm) for leg in legs] == [
        (c, i, i >= 2) for c in (1, 4) for i in range(4)]
    assert all(len(e.calls) == 4 for e in engines) and len(expected) == 8
    assert fold_difference(legs, WORKLOAD, "ngram", 2) is None


def test_the_fold_check_names_the_legs_each_axis_took_before_any_folded_field(bench_legs, monkeypatch):
    """An acceptance fold past the first leg whatever the warm-up: at warm-up 0 both the
    populations and the folded fields differ, and the populations are what is named."""
    fold = bench.fold

    def acceptance_past_the_first_leg(legs):
        out = fold(legs)
        for c, entry in out.items():
            mine = [dataclasses.replace(leg, warm=True) for leg in legs if str(leg.concurrency) == c][1:]
            entry["acceptance"] = fold(mine)[c]["acceptance"]
        return out
    every_leg_warm = [dataclasses.replace(leg, warm=True) for leg in bench_legs]
    monkeypatch.setattr(bench, "fold", acceptance_past_the_first_leg)
    assert fold_difference(bench_legs, Workload.uniform(["p"], 4), "ngram") is None
    assert fold_difference(every_leg_warm, Workload.uniform(["p"], 4), "ngram", 0) == Difference(
        "legs the acceptance axis folded at concurrency 1", None, None, None, [0, 1, 2], [[0, 1], [0, 2], [1, 2]])
