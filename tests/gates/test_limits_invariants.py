"""The scheduler-limits check (gates/invariants.py, limits_difference) on traces written by hand:
the consistent run passes, each limit passes at its boundary and goes red one past it, naming the
check, step, request, position and both values.

The hand run: blocks of 4 positions, a pool of 6 blocks (the sink block is 6), a budget of 8
tokens, max_num_seqs 2. Step 0 prefills request 0 (3 tokens) and verifies request 1 (1 + 2
drafts from position 4); step 1 is launched while step 0 is in flight and verifies both with
2 drafts each, request 1 deferred once."""
from dataclasses import replace

import pytest

from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.trace import ScheduleLimits, StepTrace
from gates.compare import Difference
from gates.invariants import limits_difference, prefill_deferred_by_budget, tokens_scheduled
from gates.lifecycle import AbortEvent, LifecycleRun, kept_run
from gates.workloads import Run
from helpers.traces import record

SINK = 6


def table(*blocks: int) -> list[int]:
    return list(blocks) + [SINK] * (3 - len(blocks))


def limits(held: dict[int, list[int]], free: int, **kwargs) -> ScheduleLimits:
    return ScheduleLimits(max_num_batched_tokens=8, max_num_seqs=2, num_kv_blocks=6, block_size=4,
                          blocks_held=held, num_free_blocks=free, **kwargs)


def run() -> list[StepTrace]:
    """Step 1 writes request 0 at positions 3-5 and request 1 at 5-7. Had step 0 accepted every
    draft, request 0 would write up to 3 + 2 = 5 (its prefill commits position 3) and request 1
    up to 4 + 2 + 1 + 2 = 9: within 2 blocks (8 positions) and 3 blocks (12)."""
    step0 = StepTrace(0, "async/eager", requests=[
        replace(record(0, 0, [1, 2, 3], sampled=[9], prefill=True), block_table=table(0, 1)),
        replace(record(1, 4, [5, 6, 7], drafts=[6, 7], accepted=0, sampled=[8], query_start=3),
                block_table=table(2, 3))],
        limits=limits({0: [0, 1], 1: [2, 3]}, 2))
    step1 = StepTrace(1, "async/eager", requests=[
        replace(record(0, 3, [9, 1, 1], drafts=[1, 1], sampled=[4]), block_table=table(0, 1)),
        replace(record(1, 5, [8, 1, 1], drafts=[1, 1], sampled=[4], query_start=3), block_table=table(2, 3, 4))],
        launched_behind=0, limits=limits({0: [0, 1], 1: [2, 3, 4]}, 1))
    return [step0, step1]


def test_the_hand_written_run_passes():
    assert limits_difference(run()) is None


def test_tokens_scheduled_are_every_query_token_of_the_real_rows():
    assert [tokens_scheduled(s) for s in run()] == [6, 6]


def test_a_step_over_the_token_budget_is_red_and_one_at_it_is_not():
    trace = run()
    trace[0].limits = replace(trace[0].limits, max_num_batched_tokens=6)
    assert limits_difference(trace) is None
    trace[0].limits = replace(trace[0].limits, max_num_batched_tokens=5)
    assert limits_difference(trace) == Difference("tokens scheduled <= max_num_batched_tokens", 0, -1, -1,
                                                  "<= 5", 6)


def test_a_step_over_max_num_seqs_is_red():
    trace = run()
    trace[1].limits = replace(trace[1].limits, max_num_seqs=1)
    assert limits_difference(trace) == Difference("requests scheduled <= max_num_seqs", 1, -1, -1, "<= 1", 2)


def test_a_step_without_limits_is_red_not_skipped():
    trace = run()
    trace[1].limits = None
    assert limits_difference(trace) == Difference("scheduler limits traced", 1, -1, -1, "ScheduleLimits", None)


@pytest.mark.parametrize("block", [6, -1])
def test_a_block_held_outside_the_pool_is_red(block):
    trace = run()
    trace[0].limits = limits({0: [0, 1], 1: [2, block]}, 2)
    assert limits_difference(trace) == Difference("KV block held within the pool", 0, 1, -1, "in [0, 6)", block)


def test_the_last_block_of_the_pool_may_be_held():
    trace = run()
    trace[0].limits = limits({0: [0, 1], 1: [2, 5]}, 2)
    trace[0].requests[1].block_table = table(2, 5)
    assert limits_difference(trace) is None


@pytest.mark.parametrize("held", [{0: [0, 1], 1: [2, 1]}, {1: [2, 1], 0: [0, 1]}])
def test_a_block_held_by_two_requests_is_red_naming_both_in_request_order(held):
    trace = run()
    trace[0].limits = limits(held, 2)
    assert limits_difference(trace) == Difference("KV block held once", 0, 1, -1, "block 1 held by request 0 only",
                                                  "block 1 also held by request 1")


def test_a_block_held_twice_by_one_request_is_red():
    trace = run()
    trace[0].limits = limits({0: [0, 0], 1: [2, 3]}, 2)
    assert limits_difference(trace) == Difference("KV block held once", 0, 0, -1, "block 0 held by request 0 only",
                                                  "block 0 also held by request 0")


@pytest.mark.parametrize("free", [1, 3])
def test_held_plus_free_other_than_the_pool_is_red(free):
    trace = run()
    trace[0].limits = limits({0: [0, 1], 1: [2, 3]}, free)
    assert limits_difference(trace) == Difference("KV blocks held + free = the pool", 0, -1, -1, 6,
                                                  f"4 held + {free} free")


def test_an_aborted_request_s_blocks_count_as_held():
    trace = run()
    trace[0].limits = limits({0: [0, 1], 1: [2, 3], 7: [5]}, 1)
    assert limits_difference(trace) is None


def test_a_row_whose_table_is_not_what_its_request_held_is_red():
    trace = run()
    trace[1].requests[1].block_table = table(2, 3)
    assert limits_difference(trace) == Difference("block table = the blocks the request held", 1, 1, -1,
                                                  [2, 3, 4], [2, 3, SINK])


def test_a_row_of_a_request_that_held_nothing_is_red():
    trace = run()
    trace[0].limits = limits({0: [0, 1], 9: [2, 3]}, 2)
    assert limits_difference(trace) == Difference("block table = the blocks the request held", 0, 1, -1,
                                                  None, table(2, 3))


def test_a_write_past_the_reserved_blocks_is_red_at_its_position():
    """Request 1's step-0 row writes positions 4-6: 2 blocks hold 0-7; with the last position
    moved to 8 the write falls past them."""
    trace = run()
    trace[0].requests[1].positions = [6, 7, 8]
    assert limits_difference(trace) == Difference("KV reserved covers the positions written", 0, 1, 8, "< 8", 8)
    trace[0].requests[1].positions = [5, 6, 7]
    assert limits_difference(trace) is None


def test_the_step_in_flight_accepting_every_draft_must_fit_the_reservation():
    """Request 1 could reach position 9 behind step 0: 3 blocks (12) hold it, 2 blocks (8) do not,
    although what step 1 really wrote (5-7) fits in 2."""
    trace = run()
    trace[1].limits = limits({0: [0, 1], 1: [2, 3]}, 2)
    trace[1].requests[1].block_table = table(2, 3)
    assert limits_difference(trace) == Difference("KV reserved covers the step in flight accepting every draft",
                                                  1, 1, 9, "< 8", 9)


def test_the_worst_case_behind_a_verify_row_is_its_start_plus_its_drafts_plus_one():
    """Request 1 verified 2 drafts from position s in step 0, so it may have committed up to
    s + 3 and step 1 writes 2 more: from s = 2 that is position 7, inside 2 blocks; from s = 3, 8."""
    trace = run()
    trace[1].limits = limits({0: [0, 1], 1: [2, 3]}, 2)
    trace[1].requests[1].block_table = table(2, 3)
    trace[0].requests[1].positions = [2, 3, 4]
    assert limits_difference(trace) is None
    trace[0].requests[1].positions = [3, 4, 5]
    assert limits_difference(trace) == Difference("KV reserved covers the step in flight accepting every draft",
                                                  1, 1, 8, "< 8", 8)


def test_a_prefill_row_writes_its_own_query_whatever_the_step_in_flight_did():
    """Request 1 (a verify row in step 0, to position 7 at worst) prefilled again in step 1 over
    3 tokens: one block holds them; the step in flight does not move a prefill's positions."""
    trace = run()
    trace[1].limits = limits({0: [0, 1], 1: [2]}, 3)
    trace[1].requests[1] = replace(record(1, 0, [5, 6, 7], sampled=[8], prefill=True, query_start=3),
                                   block_table=table(2))
    assert limits_difference(trace) is None


def test_behind_a_prefill_the_worst_case_starts_at_the_token_it_commits():
    """Request 0 prefilled 3 tokens in step 0: step 1 may write up to position 3 + 2 = 5; one block
    (4 positions) is too few (the row's positions are doctored so that only the worst case is past)."""
    trace = run()
    trace[1].limits = limits({0: [0], 1: [2, 3, 4]}, 2)
    trace[1].requests[0].block_table = table(0)
    trace[1].requests[0].positions = [3, 3, 3]
    assert limits_difference(trace) == Difference("KV reserved covers the step in flight accepting every draft",
                                                  1, 0, 5, "< 4", 5)


def test_without_a_step_in_flight_only_the_real_writes_count():
    trace = run()
    trace[1].launched_behind = None
    trace[1].limits = limits({0: [0, 1], 1: [2, 3]}, 2)
    trace[1].requests[1].block_table = table(2, 3)
    assert limits_difference(trace) is None


def test_a_prefill_deferred_by_the_budget_beside_verify_rows_is_seen():
    trace = run()
    assert not prefill_deferred_by_budget(trace)
    trace[1].limits = replace(trace[1].limits, deferred=[1])  # a running request: not a prefill
    assert not prefill_deferred_by_budget(trace)
    trace[0].limits = replace(trace[0].limits, deferred=[5])  # waiting, but step 0 also prefills
    assert prefill_deferred_by_budget(trace)  # step 0 verifies request 1 beside it
    trace[0].requests = trace[0].requests[:1]  # a step of prefills only
    assert not prefill_deferred_by_budget(trace)
    trace[1].limits = replace(trace[1].limits, deferred=[5])
    assert prefill_deferred_by_budget(trace)


def test_a_kept_run_renumbers_the_limits_and_keeps_the_aborted_request_s_blocks_held():
    """Request 0 aborted: the kept run calls request 1 request 0, and request 0's blocks stay in
    the pool's count under an id no kept request has (-1 - 0)."""
    outputs = [RequestOutput(rid, None, [1, 2, 3], [9], "", "length", RequestStats()) for rid in (0, 1)]
    life = LifecycleRun(Run(None, {}, True, outputs, run()), [AbortEvent(0, 2, "running", False, 1, "abort")],
                        None, SINK)
    kept = kept_run(life, None)
    assert [s.limits.blocks_held for s in kept.trace] == [{-1: [0, 1], 0: [2, 3]}, {-1: [0, 1], 0: [2, 3, 4]}]
    assert [[r.request_id for r in s.requests] for s in kept.trace] == [[0], [0]]
    assert limits_difference(kept.trace) is None
    trace = run()
    trace[1].limits = replace(trace[1].limits, deferred=[0, 1], preempted=[1])
    life = LifecycleRun(Run(None, {}, True, outputs, trace), [AbortEvent(1, 2, "running", False, 1, "abort")],
                        None, SINK)
    assert [(s.limits.deferred, s.limits.preempted) for s in kept_run(life, None).trace] == [([], []), ([0, -2], [-2])]
