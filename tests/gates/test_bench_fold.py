"""The bench's folded figures (engine/bench/legs.py: fold's `summary` and the plot's `figures`) against a
recomputation from the per-leg records written from scratch (gates/bench_fold.py, which the
acceptance gate also applies to real legs), over bench parameters Hypothesis draws: concurrencies
(in any order), legs, warm-up legs (none, some, all), each leg's time and its requests'
acceptance records, with and without a drafter. Checked on the JSON as `specgate bench` writes it."""
import json

from hypothesis import given
from hypothesis import strategies as st

from engine.bench import legs as bench
from engine.bench.workload import Workload
from engine.outputs import RequestOutput
from engine.request import RequestStats
from gates.bench_fold import fold_records, report_difference
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
