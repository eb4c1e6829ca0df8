"""The step-by-step comparison (gates/compare.py) that combine, emit-count and lossless rely on: it
goes red on a change to any device input, a verify step one run took and the other did not, an
output token changed, dropped or added, and each red result names the step, request, position and
both values; the steps it compares are every real verify step and none past a request's end."""
import copy
import dataclasses

import pytest

from gates.compare import Difference, runs_difference, step_of, token_difference, verify_steps
from gates.workloads import GRAPH_PADDING, run_pair

DEVICE_INPUTS = ("input_ids", "positions", "seq_len", "logits_window")


@pytest.fixture(scope="module")
def unpreempted_pair(make_llm):
    """Four requests of mixed lengths in one batch, ngram k=3, nothing preempted: both runs take
    the same verify steps, so a step one of them lacks is a difference."""
    sync, async_ = run_pair(make_llm, GRAPH_PADDING, spec="ngram", num_spec_tokens=3, max_num_seqs=4)
    assert sync.num_preemptions == async_.num_preemptions == 0 and len(sync.outputs) == 4
    assert runs_difference(sync, async_) is None
    return sync, async_


def _verify_records(run):
    return [(s, r) for s in run.trace for r in s.requests
            if not r.is_prefill and len(r.positions) >= 2 and r.positions[0] <= run.final_len[r.request_id] - 2]


@pytest.mark.parametrize("field", DEVICE_INPUTS)
def test_combine_goes_red_on_any_changed_device_input(unpreempted_pair, field):
    sync, async_ = unpreempted_pair
    trace = copy.deepcopy(async_.trace)
    step, rec = _verify_records(dataclasses.replace(async_, trace=trace))[0]
    if field == "input_ids":
        rec.input_ids[1] ^= 1
    elif field == "positions":
        rec.positions[1] += 1  # not the first: that is the step's key
    elif field == "seq_len":
        rec.seq_len += 1
    else:
        rec.logits_indices[0] -= 1
    diff = runs_difference(sync, dataclasses.replace(async_, trace=trace), fields=("device_inputs",))
    assert (diff.what, diff.step, diff.request_id, diff.position) == (
        "device_inputs", step.step, rec.request_id, rec.positions[0])
    assert set(diff.expected) == set(diff.actual) == set(DEVICE_INPUTS)
    assert [f for f in DEVICE_INPUTS if diff.expected[f] != diff.actual[f]] == [field]
    assert diff.actual["logits_window"] == [i - rec.query_start for i in rec.logits_indices]


@pytest.mark.parametrize("missing_from", ["async", "sync"])
def test_a_verify_step_only_one_run_took_is_red_without_preemption(unpreempted_pair, missing_from):
    sync, async_ = unpreempted_pair
    runs = {"sync": sync, "async": async_}
    trace = copy.deepcopy(runs[missing_from].trace)
    step, rec = _verify_records(dataclasses.replace(runs[missing_from], trace=trace))[-1]
    step.requests.remove(rec)
    runs[missing_from] = dataclasses.replace(runs[missing_from], trace=trace)
    diff = runs_difference(runs["sync"], runs["async"])
    assert diff == Difference("verify step taken", step.step, rec.request_id, rec.positions[0],
                              missing_from == "async", missing_from == "sync")


def test_the_compared_steps_are_every_real_verify_step_and_none_past_the_end(unpreempted_pair, refusals_pair):
    for run in (*unpreempted_pair, *refusals_pair):
        final = run.final_len
        expected = {(r.request_id, r.positions[0]): (s.step, r) for s in run.trace for r in s.requests
                    if not r.is_prefill and r.positions[0] <= final[r.request_id] - 2}
        assert verify_steps(run.trace, final) == expected
    # The boundary occurs: a request's last verify step starts two before its final length (it
    # emitted its last token alone), and the async runner's step past an end is dropped.
    last_alone = [r for run in unpreempted_pair for s in run.trace for r in s.requests
                  if not r.is_prefill and r.positions[0] == run.final_len[r.request_id] - 2]
    assert last_alone
    past_end = [r for s in refusals_pair[1].trace for r in s.requests
                if not r.is_prefill and r.positions[0] > refusals_pair[1].final_len[r.request_id] - 2]
    assert past_end and all((r.request_id, r.positions[0]) not in verify_steps(refusals_pair[1].trace,
                                                                               refusals_pair[1].final_len)
                            for r in past_end)


def test_each_output_position_is_named_with_the_step_that_emitted_it(unpreempted_pair):
    """A request's tokens come one from its prefill and emit_count from each verify step after it,
    in order: every position maps to the step that emitted it, and none past the end to a step."""
    sync, _ = unpreempted_pair
    for out in sync.outputs:
        emitting = [(s.step, r.emit_count) for s in sync.trace for r in s.requests if r.request_id == out.request_id]
        position = len(out.prompt_token_ids)
        for step, count in emitting:
            for _ in range(count):
                if position < sync.final_len[out.request_id]:
                    assert step_of(sync.trace, out.request_id, position) == step, (out.request_id, position)
                position += 1
        assert step_of(sync.trace, out.request_id, sync.final_len[out.request_id] + 5) is None


@pytest.mark.parametrize("change", ["changed", "extra", "missing"])
def test_lossless_names_a_changed_extra_or_missing_token(unpreempted_pair, change):
    sync, async_ = unpreempted_pair
    out = async_.outputs[1]
    expected = {o.request_id: list(o.token_ids) for o in sync.outputs}
    want = expected[out.request_id]
    n, prompt = len(want), len(out.prompt_token_ids)
    if change == "changed":
        want[2] ^= 1
        position, values = prompt + 2, (want[2], out.token_ids[2])
    elif change == "extra":  # async emitted a token past the expected run's end
        expected[out.request_id] = want[:-1]
        position, values = prompt + n - 1, ("end", out.token_ids[-1])
    else:  # async ended a token before the expected run
        want.append(7)
        position, values = prompt + n, (7, "end")
    diff = token_difference(expected, async_)
    assert diff == Difference("output token", step_of(async_.trace, out.request_id, position), out.request_id,
                              position, *values)
    assert change == "missing" or diff.step is not None
    doctored = dataclasses.replace(sync, outputs=[dataclasses.replace(o, token_ids=expected[o.request_id])
                                                  for o in sync.outputs])
    assert runs_difference(doctored, async_) == diff


def test_a_difference_records_every_field_as_evidence():
    diff = Difference("emit_count", 7, 2, 41, 3, 4)
    assert diff.as_dict() == dict(what="emit_count", step=7, request_id=2, position=41, expected=3, actual=4)
    assert str(diff) == "emit_count differs at step 7, request 2, position 41: expected 3, got 4"


def test_the_compared_steps_do_not_depend_on_the_order_of_a_step_s_rows():
    """A prefill row before a verify row in one step (an order the engine does not write, but a
    checker must not assume): the verify row is still compared."""
    from engine.trace import StepTrace
    from helpers.traces import record
    verify_row, prefill_row = record(0, 3, [10, 11], [11], 1, [11, 12]), record(1, 0, [7, 8], sampled=[9], prefill=True)
    for rows in ([verify_row, prefill_row], [prefill_row, verify_row]):
        trace = [StepTrace(4, "async/eager", requests=rows)]
        assert verify_steps(trace, {0: 8, 1: 3}) == {(0, 3): (4, verify_row)}
