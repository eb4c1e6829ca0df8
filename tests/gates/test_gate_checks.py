"""Every gate's checks go red when the trace they read is doctored: a copy of a real trace with
one emit count, draft, input or logits window changed, and the real runs pass them all."""
import copy
import dataclasses

import pytest

from gates.compare import Difference, runs_difference, token_difference
from gates.invariants import (
    acceptance_difference,
    limits_difference,
    logits_window_difference,
    mixed_refusals,
    ngram_draft_difference,
    trace_consistency,
)
from gates.measure import busy_fraction, submission_intervals
from gates.workloads import params


def _doctor(run, predicate, change):
    """A copy of `run` whose first trace record matching `predicate` is changed by `change`."""
    trace = copy.deepcopy(run.trace)
    step, rec = next((s, r) for s in trace for r in s.requests if predicate(r))
    change(rec)
    return dataclasses.replace(run, trace=trace), step.step, rec


def _verify_with_drafts(rec):
    return not rec.is_prefill and rec.num_draft >= 2 and rec.num_accepted < rec.num_draft and rec.device_fed


def test_real_runs_pass_every_single_run_check(refusals_pair):
    for r in refusals_pair:
        greedy = {o.request_id for o, p in zip(r.outputs, params(r.workload)) if not p.logits_processors}
        assert trace_consistency(r.outputs, r.trace) is None
        assert acceptance_difference(r.outputs, r.trace, greedy) is None
        assert ngram_draft_difference(r.outputs, r.trace) is None
        assert logits_window_difference(r.trace) is None
        assert limits_difference(r.trace) is None


def test_the_limits_check_goes_red_on_a_real_step_over_its_budget_or_past_its_blocks(refusals_pair):
    """The async run (a full pool: preemption): its busiest step with one token less of budget,
    and a device-fed row with one block less than it held."""
    _, async_ = refusals_pair
    trace = copy.deepcopy(async_.trace)
    busiest = max(trace, key=lambda s: sum(len(r.input_ids) for r in s.requests))
    tokens = sum(len(r.input_ids) for r in busiest.requests)
    busiest.limits = dataclasses.replace(busiest.limits, max_num_batched_tokens=tokens - 1)
    assert limits_difference(trace) == Difference("tokens scheduled <= max_num_batched_tokens", busiest.step, -1, -1,
                                                  f"<= {tokens - 1}", tokens)
    trace = copy.deepcopy(async_.trace)
    step, rec = next((s, r) for s in trace for r in s.requests
                     if r.device_fed and len(s.limits.blocks_held[r.request_id]) > 1
                     and max(r.positions) >= (len(s.limits.blocks_held[r.request_id]) - 1) * s.limits.block_size)
    held = step.limits.blocks_held[rec.request_id]
    sink = step.limits.num_kv_blocks
    step.limits.blocks_held[rec.request_id] = held[:-1]
    rec.block_table = held[:-1] + [sink] * (len(rec.block_table) - len(held) + 1)
    diff = limits_difference(trace)
    assert (diff.what, diff.step, diff.request_id) == ("KV blocks held + free = the pool", step.step, -1)
    step.limits = dataclasses.replace(step.limits, num_free_blocks=step.limits.num_free_blocks + 1)
    diff = limits_difference(trace)
    assert (diff.what, diff.step, diff.request_id, diff.expected) == (
        "KV reserved covers the positions written", step.step, rec.request_id, f"< {(len(held) - 1) * 16}")


def test_emit_count_goes_red_on_one_changed_emit_count(refusals_pair):
    sync, async_ = refusals_pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: setattr(r, "num_accepted", r.num_accepted + 1))
    diff = runs_difference(sync, doctored, fields=("emit_count",))
    assert (diff.what, diff.step, diff.request_id, diff.position) == ("emit_count", step, rec.request_id,
                                                                      rec.positions[0])
    assert diff.actual == diff.expected + 1
    consistency = trace_consistency(doctored.outputs, doctored.trace)
    assert consistency is not None and consistency.request_id == rec.request_id
    greedy = acceptance_difference(doctored.outputs, doctored.trace, {rec.request_id})
    assert (greedy.step, greedy.actual) == (step, rec.num_accepted)


def test_emit_count_goes_red_on_a_stale_draft(refusals_pair):
    _, async_ = refusals_pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts,
                                  lambda r: r.draft_token_ids.__setitem__(0, (r.draft_token_ids[0] + 1) % 256))
    diff = ngram_draft_difference(doctored.outputs, doctored.trace)
    assert (diff.what, diff.step, diff.request_id) == ("ngram drafts", step, rec.request_id)
    assert diff.actual == rec.draft_token_ids


def test_emit_count_goes_red_when_a_counter_disagrees_with_the_trace(refusals_pair):
    _, async_ = refusals_pair
    out = copy.deepcopy(async_.outputs[0])
    out.stats.num_draft_tokens += 1
    doctored = dataclasses.replace(async_, outputs=[out] + async_.outputs[1:])
    diff = trace_consistency(doctored.outputs, doctored.trace)
    assert (diff.what, diff.request_id, diff.actual) == ("num_draft_tokens", out.request_id, out.stats.num_draft_tokens)


def test_combine_goes_red_on_one_changed_device_input(refusals_pair):
    sync, async_ = refusals_pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: r.input_ids.__setitem__(1, r.input_ids[1] ^ 1))
    diff = runs_difference(sync, doctored, fields=("device_inputs",))
    assert (diff.what, diff.step, diff.request_id) == ("device_inputs", step, rec.request_id)
    assert diff.actual["input_ids"] == rec.input_ids != diff.expected["input_ids"]


def test_reason_a_goes_red_on_a_window_that_falls_back_to_the_query_end(refusals_pair):
    _, async_ = refusals_pair

    def fallback(r):
        end = r.query_start + len(r.input_ids)
        r.logits_indices = [end - 1 + i for i in range(len(r.input_ids))]
    doctored, step, rec = _doctor(async_, _verify_with_drafts, fallback)
    diff = logits_window_difference(doctored.trace)
    assert (diff.what, diff.step, diff.request_id) == ("logits window", step, rec.request_id)
    assert diff.expected[0] == rec.query_start and diff.actual[0] == rec.query_start + len(rec.input_ids) - 1


def test_predicate_split_sees_mixed_steps_and_loses_them_when_nothing_is_device_fed(refusals_pair):
    _, async_ = refusals_pair
    assert set(mixed_refusals(async_.trace)) == {"prefill", "resumed", "host_history"}
    trace = copy.deepcopy(async_.trace)
    for step in trace:
        for r in step.requests:
            r.device_fed = False
    assert mixed_refusals(trace) == {}


def test_lossless_goes_red_on_one_changed_token(refusals_pair):
    sync, async_ = refusals_pair
    expected = {o.request_id: list(o.token_ids) for o in sync.outputs}
    expected[2][5] ^= 1
    diff = token_difference(expected, async_)
    assert (diff.what, diff.request_id) == ("output token", 2)
    assert diff.position == len(async_.outputs[2].prompt_token_ids) + 5 and diff.step is not None


def test_acceptance_goes_red_on_a_leg_that_disagrees_with_its_trace(make_llm):
    from engine.bench import legs as bench
    from gates.acceptance import WARMUP_LEGS, fold_difference, traced_legs
    from gates.acceptance import acceptance_difference as leg_difference
    workload = bench.Workload.uniform(["def main(", "x = 1\n" * 6], max_tokens=12, temperature=0.0)
    legs, expected, _ = traced_legs(make_llm, workload, spec="ngram", num_spec_tokens=3)
    assert all(leg_difference(leg.index, leg.acceptance, expected[(leg.concurrency, leg.index)]) is None
               for leg in legs)
    assert fold_difference(legs, workload, "ngram") is None
    leg = legs[-1]
    doctored = dict(leg.acceptance, num_accepted_tokens=leg.acceptance["num_accepted_tokens"] + 1)
    diff = leg_difference(leg.index, doctored, expected[(leg.concurrency, leg.index)])
    assert diff.what == "leg acceptance num_accepted_tokens" and diff.actual == diff.expected + 1
    cold_counted = [dataclasses.replace(leg, warm=True) if leg.index < WARMUP_LEGS else leg for leg in legs]
    assert fold_difference(cold_counted, workload, "ngram").what == "warm-leg predicate"


def test_busy_counts_a_graph_replay_as_one_submission_from_its_first_kernel_to_its_last():
    # Two replays of three kernels each (correlation ids 7 and 9), with the device's dispatch gaps
    # inside them, a copy between them (id 8), and an activity without an id, which stands alone.
    activities = [(0, 1, 7), (2, 3, 7), (4, 5, 7), (5, 6, 8), (10, 11, 9), (12, 13, 9), (14, 16, 9), (18, 19, 0)]
    spans = sorted(submission_intervals(activities))
    assert spans == [(0, 5), (5, 6), (10, 16), (18, 19)]
    assert busy_fraction(spans, (0, 20)) == pytest.approx(0.65)      # gaps between submissions only
    assert busy_fraction([a[:2] for a in activities], (0, 20)) == pytest.approx(0.45)  # per kernel


def test_busy_fraction_is_the_union_of_device_intervals_in_the_window():
    assert busy_fraction([(0, 2), (1, 3), (5, 6), (9, 12)], (0, 10)) == pytest.approx(0.5)
    assert busy_fraction([], (0, 10)) == 0.0
    assert busy_fraction([(-5, 20)], (0, 10)) == 1.0
    # Activity wholly outside the window adds nothing (it would clip to a negative span), a window
    # that does not start at 0 is measured from its start, and an empty window is 0, not an error.
    assert busy_fraction([(0, 2), (12, 15), (-8, -6)], (0, 10)) == pytest.approx(0.2)
    assert busy_fraction([(10, 15)], (10, 20)) == pytest.approx(0.5)
    assert busy_fraction([(4, 6)], (5, 5)) == 0.0


def test_distribution_test_fails_on_non_uniform_pit_values():
    import numpy as np

    from gates.distribution import P_VALUE_THRESHOLD, uniformity_p_value
    rng = np.random.default_rng(0)
    assert uniformity_p_value(rng.random(4000)) > P_VALUE_THRESHOLD
    assert uniformity_p_value(rng.random(4000) ** 1.2) < P_VALUE_THRESHOLD


def test_each_red_check_names_its_step_request_position_and_both_values(refusals_pair):
    """A red gate's evidence is what a reviewer reads: the whole Difference, for every kind of
    single-run check, not only that one was found."""
    from gates.compare import Difference
    from gates.invariants import width
    _, async_ = refusals_pair
    late, step, rec = _doctor(async_, _verify_with_drafts, lambda r: r.positions.__setitem__(0, r.positions[0] + 1))
    start = rec.positions[0] - 1
    assert trace_consistency(late.outputs, late.trace) == Difference(
        "verify start position", step, rec.request_id, start + 1, start, start + 1)
    over, step, rec = _doctor(async_, _verify_with_drafts, lambda r: setattr(r, "num_accepted", r.num_draft + 1))
    assert trace_consistency(over.outputs, over.trace) == Difference(
        "0 <= num_accepted <= num_draft <= spec width", step, rec.request_id, rec.positions[0],
        f"<= {rec.num_draft} <= {width(rec)}", rec.num_draft + 1)
    extra, step, rec = _doctor(async_, _verify_with_drafts, lambda r: r.draft_token_ids.append(0))
    assert trace_consistency(extra.outputs, extra.trace) == Difference(
        "drafts and sampled tokens traced", step, rec.request_id, rec.positions[0],
        (rec.num_draft, rec.emit_count), (rec.num_draft + 1, rec.emit_count))
    seen = set()
    for s in async_.trace:  # a resumed prefill: a request's second prefill
        resumed = next((r for r in s.requests if r.is_prefill and r.request_id in seen), None)
        if resumed:
            break
        seen.update(r.request_id for r in s.requests)
    assert resumed is not None, "the workload preempts and resumes a request"
    longer, step, rec = _doctor(async_, lambda r: (r.request_id, r.is_prefill, r.input_ids) == (
        resumed.request_id, True, resumed.input_ids), lambda r: r.input_ids.append(0))
    history = len(rec.input_ids) - width(rec)  # the resume's query: its history, then the drafts it held
    assert trace_consistency(longer.outputs, longer.trace) == Difference(
        "resumed prefill length", step, rec.request_id, 0, history - 1, history)


def test_a_counter_or_token_count_off_by_one_is_named_at_the_request_s_last_step(refusals_pair):
    from gates.compare import Difference
    from gates.invariants import real_records
    _, async_ = refusals_pair
    out = async_.outputs[1]
    last_step = real_records(async_.trace, async_.outputs)[out.request_id][-1][0]
    for field in ("num_accepted_tokens", "num_draft_tokens", "verify_steps"):
        doctored_out = copy.deepcopy(out)
        setattr(doctored_out.stats, field, getattr(out.stats, field) + 1)
        doctored = dataclasses.replace(async_, outputs=[async_.outputs[0], doctored_out, *async_.outputs[2:]])
        assert trace_consistency(doctored.outputs, doctored.trace) == Difference(
            field, last_step, out.request_id, None, getattr(out.stats, field), getattr(out.stats, field) + 1)
    short = copy.deepcopy(out)
    short.token_ids = list(out.token_ids)[:-1]
    doctored = dataclasses.replace(async_, outputs=[async_.outputs[0], short, *async_.outputs[2:]])
    assert trace_consistency(doctored.outputs, doctored.trace) == Difference(
        "completion tokens = sum of emit counts - truncated", last_step, out.request_id, None,
        len(out.token_ids), len(out.token_ids) - 1)


def test_a_request_missing_from_the_trace_is_red_not_a_crash(refusals_pair):
    from gates.compare import Difference
    _, async_ = refusals_pair
    rid = async_.outputs[0].request_id
    trace = copy.deepcopy(async_.trace)
    for s in trace:
        s.requests = [r for r in s.requests if r.request_id != rid]
    diff = trace_consistency(async_.outputs, trace)
    assert diff == Difference("num_prefills", None, rid, None, 0, async_.outputs[0].stats.num_prefills)


def test_reason_a_and_greedy_acceptance_name_the_row_s_position_and_values(refusals_pair):
    _, async_ = refusals_pair
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: r.logits_indices.reverse())
    diff = logits_window_difference(doctored.trace)
    assert (diff.step, diff.request_id, diff.position) == (step, rec.request_id, rec.positions[0])
    assert diff.expected == sorted(rec.logits_indices) and diff.actual == rec.logits_indices
    doctored, step, rec = _doctor(async_, _verify_with_drafts, lambda r: setattr(r, "num_accepted", r.num_accepted + 1))
    diff = acceptance_difference(doctored.outputs, doctored.trace, {rec.request_id})
    assert (diff.what, diff.step, diff.request_id, diff.position, diff.expected, diff.actual) == (
        "num_accepted (greedy: matching draft prefix)", step, rec.request_id, rec.positions[0],
        rec.num_accepted - 1, rec.num_accepted)


def test_mixed_steps_are_counted_per_refusal_kind(refusals_pair):
    _, async_ = refusals_pair
    counts = mixed_refusals(async_.trace)
    assert all(type(n) is int and n > 0 for n in counts.values()), counts
