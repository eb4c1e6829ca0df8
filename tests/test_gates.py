"""The gates harness: the registry, `specgate gates list`, the report's statuses in JSON and
JUnit, and that every gate's checks go red when the trace they read is doctored (a copy of a
real trace with one emit count, draft, input or logits window changed)."""
import copy
import dataclasses
import json
import re
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from gates import registry, report
from gates.compare import Difference, runs_difference, token_difference
from gates.invariants import (acceptance_difference, logits_window_difference, mixed_refusals,
                              ngram_draft_difference, trace_consistency)
from gates.measure import UNDER_THE_FLOOR, ABResult, busy_fraction
from gates.workloads import MIXED_REFUSALS, MIXED_REFUSALS_ENGINE, run_pair


# ---- registry and CLI --------------------------------------------------------------------------
def test_registry_names_are_kebab_case_unique_and_each_has_a_module():
    names = [g.name for g in registry.GATES]
    assert len(names) == len(set(names))
    for g in registry.GATES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", g.name), g.name
        assert g.needs in registry.NEEDS and g.purpose
        assert g.file.is_file(), f"gate {g.name}: no module {g.file}"
        source = g.file.read_text()
        assert "CLAIMS = (" in source and "def test_" in source, f"gate {g.name} claims nothing or tests nothing"
        assert isinstance(g.proven_against, tuple) and all(isinstance(d, str) for d in g.proven_against)


def test_a_bad_gate_definition_is_refused():
    with pytest.raises(ValueError, match="kebab-case"):
        registry.Gate("Emit_Count", "emit_count", "x", "cpu")
    with pytest.raises(ValueError, match="needs must be one of"):
        registry.Gate("emit-count", "emit_count", "x", "tpu")


def test_proven_against_is_read_from_the_mutants_catalogue(monkeypatch):
    catalogue = types.ModuleType("mutants.catalogue")
    catalogue.DEFECTS = [types.SimpleNamespace(name="stale-drafts", gates=("emit-count", "combine")),
                         types.SimpleNamespace(name="reason-a-fallback", gates=("reason-a",))]
    monkeypatch.setitem(sys.modules, "mutants.catalogue", catalogue)
    gates = {g.name: g for g in registry.GATES}
    assert gates["emit-count"].proven_against == ("stale-drafts",)
    assert gates["reason-a"].proven_against == ("reason-a-fallback",)
    assert gates["busy"].proven_against == ()


def test_gates_list_shows_names_purposes_needs_and_proven_against(capsys):
    from gates.cli import main
    assert main(["gates", "list"]) == 0
    out = capsys.readouterr().out
    for g in registry.GATES:
        line = next(line for line in out.splitlines() if line.startswith(g.name + " "))
        assert f"needs {g.needs}" in line and f"proven against: {', '.join(g.proven_against) or '-'}" in line
        assert g.purpose in out


def test_gates_run_refuses_an_unknown_gate(capsys):
    from gates.cli import main
    assert main(["gates", "run", "emit-count", "no-such-gate"]) == 2
    assert "unknown gate(s) no-such-gate" in capsys.readouterr().err


def test_gate_examples_are_bounded_under_ci_and_deep_under_deep(monkeypatch):
    from hypothesis import Phase
    from gates.workloads import gate_settings
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    ci = gate_settings(3)
    assert ci.max_examples == 3 and Phase.shrink not in ci.phases
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "deep")
    from hypothesis import settings
    assert gate_settings(3).max_examples == settings.get_profile("deep").max_examples > 3


# ---- statuses ----------------------------------------------------------------------------------
def _test(outcome="passed", cases=1, message=None):
    return {"nodeid": "g.py::t", "outcome": outcome, "message": message, "seconds": 0.0,
            "cases": [{"params": {}, "evidence": []}] * cases, "measurements": []}


@pytest.mark.parametrize("tests, needs, has_cuda, claims, seen, status", [
    ([_test()], "cpu", False, ("a",), {"a"}, report.GREEN),
    ([_test(cases=0)], "cpu", False, (), set(), report.RED),                  # zero cases is red
    ([], "cpu", False, (), set(), report.RED),
    ([_test()], "cpu", False, ("a", "b"), {"a"}, report.RED),                 # a claim that never occurred
    ([_test("failed", message="x")], "cpu", False, (), set(), report.RED),
    ([_test("error", message="x"), _test()], "cpu", False, (), set(), report.ERROR),
    ([_test("skipped", 0, "needs CUDA")] * 2, "cuda", False, (), set(), report.SKIPPED),
    ([_test()], "cuda", False, (), set(), report.SKIPPED),                    # never green without CUDA
    ([_test()], "cuda", True, (), set(), report.GREEN),
])
def test_verdict(tests, needs, has_cuda, claims, seen, status):
    assert report.verdict(needs, tests, claims, seen, None, has_cuda)[0] == status


FAKE_GATES = {
    "green": '''
CLAIMS = ("ran",)
def test_ok(gate_record):
    gate_record.case(n=1)
    gate_record.case(n=2)
    gate_record.occurred("ran")
''',
    "empty": '''
CLAIMS = ()
def test_passes_but_checks_nothing(gate_record):
    pass
''',
    "red": '''
from gates.compare import Difference
CLAIMS = ()
def test_red(gate_record):
    gate_record.case(k=3)
    gate_record.check(Difference("emit_count", 7, 2, 41, 3, 1), "async vs sync")
''',
    "error": '''
CLAIMS = ()
def test_crashes(gate_record):
    gate_record.case()
    raise RuntimeError("engine exploded")
''',
    "cuda-pass": '''
CLAIMS = ()
def test_passes_anywhere(gate_record):
    gate_record.case()
''',
}


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory):
    """One `specgate gates run` over fake gates, the real (cheap) reason-a gate, and the real
    CUDA-only busy gate."""
    from gates.run import run_gates
    tmp = tmp_path_factory.mktemp("gates")
    fakes = []
    for name, source in FAKE_GATES.items():
        path = tmp / f"fake_{name.replace('-', '_')}.py"
        path.write_text(source)
        fakes.append(registry.Gate(f"fake-{name}", path.stem, f"fake gate {name}",
                                   "cuda" if name == "cuda-pass" else "cpu", path))
    real = registry.by_name(["reason-a", "busy"])
    json_path, junit_path = tmp / "gates.json", tmp / "gates.xml"
    result = run_gates(fakes + real, str(json_path), str(junit_path), quiet=True)
    return result, json.loads(json_path.read_text()), ET.parse(junit_path)


@pytest.mark.slow
def test_json_report_gives_status_cases_and_evidence(harness_run):
    result, written, _ = harness_run
    assert written == json.loads(json.dumps(result, default=str))
    gates = {g["name"]: g for g in written["gates"]}
    assert {n: g["status"] for n, g in gates.items()} == {
        "fake-green": "green", "fake-empty": "red", "fake-red": "red", "fake-error": "error",
        "fake-cuda-pass": "green" if torch.cuda.is_available() else "skipped",
        "reason-a": "green", "busy": "green" if torch.cuda.is_available() else "skipped"}
    assert gates["fake-green"]["num_cases"] == 2 and gates["fake-green"]["claims"] == {"ran": True}
    assert gates["fake-empty"]["reason"] == "ran zero cases"
    evidence = gates["fake-red"]["evidence"][0]
    assert evidence["case"] == {"k": 3}
    assert evidence["differences"] == [dict(what="emit_count", step=7, request_id=2, position=41, expected=3,
                                            actual=1, context="async vs sync")]
    assert "engine exploded" in gates["fake-error"]["reason"]
    assert gates["reason-a"]["num_cases"] > 0 and all(gates["reason-a"]["claims"].values())
    if not torch.cuda.is_available():
        assert "needs CUDA" in gates["busy"]["reason"]
    assert written["exit_status"] == 1 and written["summary"]["red"] == 2
    for g in written["gates"]:
        assert set(g) >= {"name", "purpose", "needs", "proven_against", "status", "reason", "num_cases",
                          "cases", "evidence", "measurements", "claims", "tests", "seconds"}


@pytest.mark.slow
def test_junit_report_is_well_formed_with_one_suite_per_gate(harness_run):
    result, _, tree = harness_run
    root = tree.getroot()
    assert root.tag == "testsuites"
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == [g["name"] for g in result["gates"]]
    verdict = {name: s.find("testcase[@name='verdict']") for name, s in suites.items()}
    assert verdict["fake-green"].find("failure") is None
    assert verdict["fake-empty"].find("failure").get("message") == "ran zero cases"
    assert verdict["fake-error"].find("error") is not None
    if not torch.cuda.is_available():
        assert verdict["busy"].find("skipped") is not None
        assert verdict["fake-cuda-pass"].find("skipped") is not None
    assert int(root.get("tests")) == sum(int(s.get("tests")) for s in suites.values())


def test_an_exit_status_is_non_zero_only_for_red_or_error():
    assert report.exit_status([{"status": "green"}, {"status": "skipped"}]) == 0
    assert report.exit_status([{"status": "green"}, {"status": "red"}]) == 1
    assert report.exit_status([{"status": "error"}]) == 1
    assert report.exit_status([]) == 1


# ---- each gate's checks go red on a doctored trace ---------------------------------------------
@pytest.fixture(scope="module")
def pair(make_llm):
    """A real sync/async pair with every refusal kind and preemption, ngram k=3."""
    sync, async_ = run_pair(make_llm, MIXED_REFUSALS, spec="ngram", num_spec_tokens=3, **MIXED_REFUSALS_ENGINE)
    assert runs_difference(sync, async_) is None
    return sync, async_


def _doctor(run, predicate, change):
    """A copy of `run` whose first trace record matching `predicate` is changed by `change`."""
    trace = copy.deepcopy(run.trace)
    step, rec = next((s, r) for s in trace for r in s.requests if predicate(r))
    change(rec)
    return dataclasses.replace(run, trace=trace), step.step, rec


def _verify_with_drafts(rec):
    return not rec.is_prefill and rec.num_draft >= 2 and rec.num_accepted < rec.num_draft and rec.device_fed


def test_real_runs_pass_every_single_run_check(pair):
    for r in pair:
        greedy = {o.request_id for o, p in zip(r.outputs, r.workload.params()) if not p.logits_processors}
        assert trace_consistency(r.outputs, r.trace) is None
        assert acceptance_difference(r.outputs, r.trace, greedy) is None
        assert ngram_draft_difference(r.outputs, r.trace) is None
        assert logits_window_difference(r.trace) is None


def test_emit_count_goes_red_on_one_changed_emit_count(pair):
    sync, async_ = pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: setattr(r, "num_accepted", r.num_accepted + 1))
    diff = runs_difference(sync, doctored, fields=("emit_count",))
    assert (diff.what, diff.step, diff.request_id, diff.position) == ("emit_count", step, rec.request_id, rec.positions[0])
    assert diff.actual == diff.expected + 1
    consistency = trace_consistency(doctored.outputs, doctored.trace)
    assert consistency is not None and consistency.request_id == rec.request_id
    greedy = acceptance_difference(doctored.outputs, doctored.trace, {rec.request_id})
    assert (greedy.step, greedy.actual) == (step, rec.num_accepted)


def test_emit_count_goes_red_on_a_stale_draft(pair):
    _, async_ = pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts,
                                  lambda r: r.draft_token_ids.__setitem__(0, (r.draft_token_ids[0] + 1) % 256))
    diff = ngram_draft_difference(doctored.outputs, doctored.trace)
    assert (diff.what, diff.step, diff.request_id) == ("ngram drafts", step, rec.request_id)
    assert diff.actual == rec.draft_token_ids


def test_emit_count_goes_red_when_a_counter_disagrees_with_the_trace(pair):
    _, async_ = pair
    out = copy.deepcopy(async_.outputs[0])
    out.stats.num_draft_tokens += 1
    doctored = dataclasses.replace(async_, outputs=[out] + async_.outputs[1:])
    diff = trace_consistency(doctored.outputs, doctored.trace)
    assert (diff.what, diff.request_id, diff.actual) == ("num_draft_tokens", out.request_id, out.stats.num_draft_tokens)


def test_combine_goes_red_on_one_changed_device_input(pair):
    sync, async_ = pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: r.input_ids.__setitem__(1, r.input_ids[1] ^ 1))
    diff = runs_difference(sync, doctored, fields=("device_inputs",))
    assert (diff.what, diff.step, diff.request_id) == ("device_inputs", step, rec.request_id)
    assert diff.actual["input_ids"] == rec.input_ids != diff.expected["input_ids"]


def test_reason_a_goes_red_on_a_window_that_falls_back_to_the_query_end(pair):
    _, async_ = pair

    def fallback(r):
        end = r.query_start + len(r.input_ids)
        r.logits_indices = [end - 1 + i for i in range(len(r.input_ids))]
    doctored, step, rec = _doctor(async_, _verify_with_drafts, fallback)
    diff = logits_window_difference(doctored.trace)
    assert (diff.what, diff.step, diff.request_id) == ("logits window", step, rec.request_id)
    assert diff.expected[0] == rec.query_start and diff.actual[0] == rec.query_start + len(rec.input_ids) - 1


def test_predicate_split_sees_mixed_steps_and_loses_them_when_nothing_is_device_fed(pair):
    _, async_ = pair
    assert set(mixed_refusals(async_.trace)) == {"prefill", "resumed", "host_history"}
    trace = copy.deepcopy(async_.trace)
    for step in trace:
        for r in step.requests:
            r.device_fed = False
    assert mixed_refusals(trace) == {}


def test_lossless_goes_red_on_one_changed_token(pair):
    sync, async_ = pair
    expected = {o.request_id: list(o.token_ids) for o in sync.outputs}
    expected[2][5] ^= 1
    diff = token_difference(expected, async_)
    assert (diff.what, diff.request_id) == ("output token", 2)
    assert diff.position == len(async_.outputs[2].prompt_token_ids) + 5 and diff.step is not None


def test_acceptance_goes_red_on_a_leg_that_disagrees_with_its_trace(make_llm):
    from engine import bench
    from gates.acceptance import WARMUP_LEGS, acceptance_difference as leg_difference, fold_difference, traced_legs
    workload = bench.Workload(["def main(", "x = 1\n" * 6], max_tokens=12, temperature=0.0)
    legs, expected, _ = traced_legs(make_llm, workload, spec="ngram", num_spec_tokens=3)
    assert all(leg_difference(leg.index, leg.acceptance, expected[(leg.concurrency, leg.index)]) is None for leg in legs)
    assert fold_difference(legs, expected) is None
    leg = legs[-1]
    doctored = dict(leg.acceptance, num_accepted_tokens=leg.acceptance["num_accepted_tokens"] + 1)
    diff = leg_difference(leg.index, doctored, expected[(leg.concurrency, leg.index)])
    assert diff.what == "leg acceptance num_accepted_tokens" and diff.actual == diff.expected + 1
    cold_counted = [dataclasses.replace(leg, warm=True) if leg.index < WARMUP_LEGS else leg for leg in legs]
    assert fold_difference(cold_counted, expected).what == "folded legs"


def test_speed_ab_reports_a_delta_under_the_floor_never_as_a_ratio():
    noisy = ABResult("output_tokens_per_s", 8, True, [100, 110, 105], [104, 112, 103])
    assert noisy.under_floor and not noisy.b_is_worse
    assert noisy.as_dict()["result"] == UNDER_THE_FLOOR and "ratio" not in noisy.as_dict()
    slower = ABResult("output_tokens_per_s", 8, True, [100, 101, 100], [90, 91, 90])
    assert slower.b_is_worse and slower.as_dict()["ratio"] == pytest.approx(0.9, abs=0.01)
    faster_tpot = ABResult("tpot_ms", 1, False, [10, 10.1, 10], [9, 9.05, 9])
    assert not faster_tpot.b_is_worse and not faster_tpot.under_floor


def test_busy_fraction_is_the_union_of_device_intervals_in_the_window():
    assert busy_fraction([(0, 2), (1, 3), (5, 6), (9, 12)], (0, 10)) == pytest.approx(0.5)
    assert busy_fraction([], (0, 10)) == 0.0
    assert busy_fraction([(-5, 20)], (0, 10)) == 1.0


def test_distribution_test_fails_on_non_uniform_pit_values():
    import numpy as np
    from gates.distribution import P_VALUE_THRESHOLD, uniformity_p_value
    rng = np.random.default_rng(0)
    assert uniformity_p_value(rng.random(4000)) > P_VALUE_THRESHOLD
    assert uniformity_p_value(rng.random(4000) ** 1.2) < P_VALUE_THRESHOLD
