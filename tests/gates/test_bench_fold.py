"""The bench's folded figures (engine/bench/legs.py: fold's `summary` and the plot's `figures`) against a
recomputation from the per-leg records written from scratch (gates/bench_fold.py, which the
acceptance gate also applies to real legs), over bench parameters Hypothesis draws: concurrencies
(in any order), legs, warm-up legs (none, some, all), each leg's time and its requests'
acceptance records, with and without a drafter. Checked on the JSON as `specgate bench` writes it;
and the populations each axis folded, read back from its figures (same_legs_difference, folded_legs)."""
import dataclasses
import json

from hypothesis import given
from hypothesis import strategies as st

from engine.bench import legs as bench
from engine.bench.workload import Workload
from engine.outputs import RequestOutput
from engine.request import RequestStats
from gates.bench_fold import fold_records, folded_legs, rate_fold, report_difference, same_legs_difference
from gates.compare import Difference
from helpers.strategies import examples


@st.composite
def request_outputs(draw, spec: bool) -> RequestOutput:
    completion = draw(st.integers(1, 40))
    stats = RequestStats()
    if spec:
        stats = RequestStats(num_drafts=draw(st.integers(0, 12)), num_draft_tokens=draw(st.integers(0, 40)),
                             num_accepted_tokens=draw(st.integers(0, 30)), verify_steps=draw(st.integers(0, 20)),
                             accepted_per_position=draw(st.lists(st.integers(0, 9), max_size=5)))
    return RequestOutput(0, None, [1] * draw(st.integers(1, 20)), [2] * completion, "", "length", stats)


@st.composite
def bench_runs(draw) -> tuple:
    """(concurrencies, legs, warmup_legs, spec, script) of one bench run."""
    concurrencies = draw(st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True))
    legs = draw(st.integers(1, 4))
    warmup_legs = draw(st.integers(0, legs))      # == legs: a concurrency without a warm leg
    spec = draw(st.booleans())
    script = {(c, i): (draw(st.floats(1e-3, 30.0)), draw(st.lists(request_outputs(spec), min_size=1, max_size=3)))
              for c in concurrencies for i in range(legs)}
    return concurrencies, legs, warmup_legs, spec, script


def request_record(out: RequestOutput, fields: dict) -> dict:
    """One request as an acceptance record: a counter field is the RequestStats field of the same
    name (num_requests and completion_tokens are the request's own)."""
    own = {"num_requests": 1, "completion_tokens": len(out.token_ids)}
    return {name: own[name] if name in own else getattr(out.stats, name)
            for name, kind in fields.items() if kind in (int, list)}


@given(run=bench_runs())
@examples(150)
def test_every_folded_field_equals_its_recomputation_from_the_legs(scripted_bench, run):
    concurrencies, legs, warmup_legs, spec, script = run
    got = scripted_bench(concurrencies, legs, warmup_legs, script)
    assert [(leg.concurrency, leg.index) for leg in got] == [(c, i) for c in concurrencies for i in range(legs)]
    assert [leg.warm for leg in got] == [i >= warmup_legs for _ in concurrencies for i in range(legs)]
    for leg in got:  # each leg's record is its requests' records folded (the same rule, one level down)
        fields = {k: type(v) for k, v in leg.acceptance.items()}
        outputs = script[leg.concurrency, leg.index][1]
        assert leg.acceptance == fold_records([request_record(o, fields) for o in outputs], fields)
        assert leg.completion_tokens == sum(len(o.token_ids) for o in outputs)
    report = bench.report(got, Workload.uniform(["p"], 4, 0.0), {"spec": "ngram" if spec else None})
    written = json.loads(json.dumps(report))
    assert report_difference(written) is None, report_difference(written)
    assert same_legs_difference(written) is None, same_legs_difference(written)
    for c in map(str, concurrencies):  # the warm legs fit both axes' figures, whatever else does
        warm = [i for i in range(legs) if i >= warmup_legs]
        assert all(warm in fitting for fitting in folded_legs(written, c).values())


def test_a_concurrency_without_a_warm_leg_folds_to_none_and_zero_counters(scripted_bench):
    out = RequestOutput(0, None, [1], [2, 2], "", "length", RequestStats(num_drafts=1, num_draft_tokens=2,
                                                                         num_accepted_tokens=1, verify_steps=1,
                                                                         accepted_per_position=[1]))
    got = scripted_bench([2], 2, 2, {(2, 0): (1.0, [out]), (2, 1): (1.0, [out])})
    report = bench.report(got, Workload.uniform(["p"], 4, 0.0), {"spec": "ngram"})
    assert report["summary"]["2"]["tokens_per_s_mean"] is None
    assert report["summary"]["2"]["acceptance"]["accepted_per_position"] == []
    assert report_difference(report) is None


def test_a_wrong_fold_is_a_difference_naming_the_field(scripted_bench):
    """The recomputation is not vacuous: one changed number, one field added without a
    recomputation, and one field dropped are each reported."""
    out = RequestOutput(0, None, [1], [2] * 6, "", "length", RequestStats(num_drafts=2, num_draft_tokens=4,
                                                                         num_accepted_tokens=3, verify_steps=3,
                                                                         accepted_per_position=[2, 1]))
    got = scripted_bench([1, 4], 3, 1, {(c, i): (0.5 + i, [out]) for c in (1, 4) for i in range(3)})
    report = json.loads(json.dumps(bench.report(got, Workload.uniform(["p"], 4, 0.0), {"spec": "block"})))
    assert report_difference(report) is None
    bad = json.loads(json.dumps(report))
    bad["summary"]["4"]["acceptance"]["accepted_per_position"] = [2, 1]
    assert "summary.4.acceptance.accepted_per_position" in report_difference(bad).what
    bad = json.loads(json.dumps(report))
    bad["figures"]["1"]["tau_fold"] = 2.0
    assert "figures.1.tau_fold" in report_difference(bad).what
    bad = json.loads(json.dumps(report))
    bad["summary"]["1"]["host_seconds_mean"] = 0.1
    assert "no recomputation" in report_difference(bad).what
    bad = json.loads(json.dumps(report))
    del bad["figures"]["4"]["acceptance_per_position"]
    assert report_difference(bad) is not None
    bad = json.loads(json.dumps(report))
    for leg in bad["legs"]:
        leg["acceptance"]["oracle_rate"] = 0.5
    assert "oracle_rate" in report_difference(bad).what


def distinct_legs(scripted_bench, legs: int, warmup_legs: int) -> list:
    """One concurrency (2) of `legs` legs whose every figure differs from leg to leg: leg i takes
    1 + i seconds and its one request has i + 1 accepted tokens, so each set of legs folds to
    figures of its own."""
    script = {}
    for i in range(legs):
        stats = RequestStats(num_drafts=i + 1, num_draft_tokens=2 * i + 2, num_accepted_tokens=i + 1,
                             verify_steps=i + 2, accepted_per_position=[i + 1])
        script[2, i] = (1.0 + i, [RequestOutput(0, None, [1], [2] * (i + 3), "", "length", stats)])
    return scripted_bench([2], legs, warmup_legs, script)


def bench_report(legs: list) -> dict:
    return json.loads(json.dumps(bench.report(legs, Workload.uniform(["p"], 4, 0.0), {"spec": "ngram"})))


def test_each_axis_s_population_is_read_back_from_its_own_figures(scripted_bench):
    report = bench_report(distinct_legs(scripted_bench, 4, 2))
    assert folded_legs(report, "2") == {"throughput": [[2, 3]], "acceptance": [[2, 3]]}
    assert same_legs_difference(report) is None
    every_leg_warm = bench_report(distinct_legs(scripted_bench, 3, 0))
    assert folded_legs(every_leg_warm, "2") == {"throughput": [[0, 1, 2]], "acceptance": [[0, 1, 2]]}


def test_legs_with_equal_figures_fit_as_several_sets(scripted_bench):
    """Equal legs (greedy legs run the same tokens): acceptance counters still tell how many legs
    were folded, equal rates fold to the same mean, min and max over any legs but none."""
    out = RequestOutput(0, None, [1], [2] * 4, "", "length", RequestStats(num_drafts=1, num_draft_tokens=2,
                                                                         num_accepted_tokens=1, verify_steps=2,
                                                                         accepted_per_position=[1]))
    report = bench_report(scripted_bench([1], 3, 1, {(1, i): (2.0, [out]) for i in range(3)}))
    assert folded_legs(report, "1") == {"throughput": [[0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]],
                                        "acceptance": [[0, 1], [0, 2], [1, 2]]}
    assert same_legs_difference(report) is None


def test_an_axis_that_cuts_its_own_legs_is_named_with_the_legs_it_took(scripted_bench, monkeypatch):
    """fold() with the acceptance loop past the first leg whatever the warm-up (a hard-coded
    one-leg warm-up): invisible at one warm-up leg, named at none and at two."""
    fold = bench.fold

    def acceptance_past_the_first_leg(legs):
        out = fold(legs)
        for c, entry in out.items():
            mine = [leg for leg in legs if str(leg.concurrency) == c][1:]
            entry["acceptance"] = fold([dataclasses.replace(leg, warm=True) for leg in mine])[c]["acceptance"]
        return out
    monkeypatch.setattr(bench, "fold", acceptance_past_the_first_leg)
    assert same_legs_difference(bench_report(distinct_legs(scripted_bench, 3, 1))) is None
    assert same_legs_difference(bench_report(distinct_legs(scripted_bench, 3, 0))) == Difference(
        "legs the acceptance axis folded at concurrency 2", None, None, None, [0, 1, 2], [[1, 2]])
    assert same_legs_difference(bench_report(distinct_legs(scripted_bench, 4, 2))) == Difference(
        "legs the acceptance axis folded at concurrency 2", None, None, None, [2, 3], [[1, 2, 3]])


def test_a_throughput_axis_over_other_legs_and_a_summary_naming_other_legs_are_differences(scripted_bench):
    report = bench_report(distinct_legs(scripted_bench, 4, 2))
    every_leg = json.loads(json.dumps(report))
    every_leg["summary"]["2"] |= rate_fold("tokens_per_s", [leg["tokens_per_s"] for leg in report["legs"]])
    assert every_leg["summary"]["2"]["tokens_per_s_mean"] == 2.04   # 3, 2, 1.67 and 1.5 tokens/s
    assert folded_legs(every_leg, "2")["throughput"] == [[0, 1, 2, 3]]
    assert same_legs_difference(every_leg) == Difference(
        "legs the throughput axis folded at concurrency 2", None, None, None, [2, 3], [[0, 1, 2, 3]])
    nothing_fits = json.loads(json.dumps(report))
    nothing_fits["summary"]["2"]["acceptance"]["num_requests"] = 7
    assert same_legs_difference(nothing_fits) == Difference(
        "legs the acceptance axis folded at concurrency 2", None, None, None, [2, 3], "no set of legs")
    misnamed = json.loads(json.dumps(report))
    misnamed["summary"]["2"]["legs"] = [1, 2, 3]
    assert same_legs_difference(misnamed) == Difference(
        "legs the fold names at concurrency 2 (summary.legs)", None, None, None, [2, 3], [1, 2, 3])
    unknown = json.loads(json.dumps(report))
    for leg in unknown["legs"]:
        leg["acceptance"]["oracle_rate"] = 0.5
    assert "oracle_rate" in same_legs_difference(unknown).what
