"""Acceptance counters (engine/bench/metrics.py) and the per-step trace record (engine/trace.py), on
hand-built inputs so every field is exact."""
import pytest
import torch

from engine.bench.metrics import Acceptance
from engine.config import EngineConfig
from engine.policy import ASYNC, SYNC
from engine.request import Request, RequestStats
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler
from engine.step_io import StepOutputs
from engine.step_plan import RowPlan, StepPlan
from engine.step_result import StepResult
from engine.trace import RequestTrace, ScheduleLimits, StepTrace, schedule_limits, trace_step


@pytest.mark.parametrize("mine, theirs, merged", [
    ([], [1, 1], [1, 1]),
    ([3, 1], [2, 2, 1], [5, 3, 1]),
    ([4, 2, 1], [1], [5, 2, 1]),
    ([2, 0], [0, 0, 0], [2, 0, 0]),
])
def test_merge_adds_counts_position_by_position(mine, theirs, merged):
    a = Acceptance(1, 10, 5, 4, 8, 3, list(mine))
    b = Acceptance(2, 20, 7, 6, 9, 4, list(theirs))
    a.merge(b)
    assert a == Acceptance(3, 30, 12, 10, 17, 7, merged)
    assert b.accepted_per_position == theirs, "the merged-in counters are left alone"


def test_merging_per_request_counters_equals_adding_them_all():
    stats = [RequestStats(num_drafts=2, num_draft_tokens=5, num_accepted_tokens=3, verify_steps=4,
                          accepted_per_position=[2, 1]),
             RequestStats(num_drafts=1, num_draft_tokens=3, num_accepted_tokens=3, verify_steps=2,
                          accepted_per_position=[1, 1, 1]),
             RequestStats(verify_steps=1)]
    whole, left, right = Acceptance(), Acceptance(), Acceptance()
    for i, s in enumerate(stats):
        whole.add(s, 6)
        (left if i < 1 else right).add(s, 6)
    left.merge(right)
    assert left == whole
    assert whole.as_dict()["accepted_per_position"] == [3, 2, 1]


def request(request_id: int) -> Request:
    return Request(request_id, [1, 2, 3], SamplingParams(), rng_key=0)


def step(is_async: bool, arm: str, num_rows: int, limits: ScheduleLimits | None = None):
    """Two requests (a prefill of 3 tokens, a verify of 1 + 2 drafts), then padding rows."""
    reqs = [request(11), request(12)]
    pad = num_rows - 2
    rows = [RowPlan(request=reqs[0], slot=0, is_prefill=True, spec_width=0, token_ids=[1, 2, 3],
                    positions=[0, 1, 2], seq_len=3, num_logits=1, block_table=[0], refusal="prefill"),
            RowPlan(request=reqs[1], slot=1, is_prefill=False, spec_width=2, token_ids=[0, 0, 0],
                    positions=[0, 0, 0], seq_len=0, num_logits=3, block_table=[1], device_fed=True)]
    rows += [RowPlan(request=None, slot=2 + i, is_prefill=False, spec_width=0, token_ids=[0], positions=[0],
                     seq_len=1, num_logits=1, block_table=[2]) for i in range(pad)]
    plan = StepPlan(step=7, arm=arm, rows=rows, max_context_len=8)
    out = StepOutputs(torch.zeros(num_rows, 3, dtype=torch.long), torch.zeros(num_rows, dtype=torch.long),
                      torch.zeros(num_rows, dtype=torch.long),
                      input_ids=torch.tensor([1, 2, 3, 40, 41, 42] + [0] * pad),
                      positions=torch.tensor([0, 1, 2, 5, 6, 7] + [0] * pad),
                      seq_lens=torch.tensor([3, 8] + [1] * pad),
                      query_start_loc=torch.tensor([0, 3, 6] + [6 + i + 1 for i in range(pad)]),
                      cu_num_logits=torch.tensor([0, 1, 4] + [4 + i + 1 for i in range(pad)]),
                      logits_indices=torch.tensor([2, 3, 4, 5] + [6 + i for i in range(pad)]),
                      draft_token_ids=torch.tensor([[0, 0], [41, 42]] + [[0, 0]] * pad),
                      packed=torch.zeros(num_rows, 5, dtype=torch.long))
    # each row: k + 1 sampled (accepted drafts, then the correction/bonus; -1 after), num_accepted, num_draft
    results = StepResult.unpack([[9, -1, -1, 0, 0], [41, 77, -1, 1, 2]] + [[5, -1, -1, 0, 0]] * pad)
    return trace_step(plan, out, results, (ASYNC if is_async else SYNC).route, 6, limits)


@pytest.mark.parametrize("is_async, arm, num_rows, route", [
    (False, "eager", 2, "sync/eager"), (True, "eager", 2, "async/eager"), (True, "graph", 4, "async/graph")])
def test_a_step_trace_records_route_padding_and_every_request(is_async, arm, num_rows, route):
    limits = ScheduleLimits(16, 4, 8, 16, {11: [0], 12: [1]}, 6)
    assert step(is_async, arm, num_rows, limits) == StepTrace(7, route, num_rows - 2, [
        RequestTrace(request_id=11, is_prefill=True, device_fed=False, refusal="prefill", input_ids=[1, 2, 3],
                     positions=[0, 1, 2], seq_len=3, logits_indices=[2], query_start=0, draft_token_ids=[],
                     num_draft=0, num_accepted=0, sampled=[9], slot=0, block_table=[0]),
        RequestTrace(request_id=12, is_prefill=False, device_fed=True, refusal=None, input_ids=[40, 41, 42],
                     positions=[5, 6, 7], seq_len=8, logits_indices=[3, 4, 5], query_start=3,
                     draft_token_ids=[41, 42], num_draft=2, num_accepted=1, sampled=[41, 77], slot=1,
                     block_table=[1], draft_slots=2),
    ], launched_behind=6, limits=limits)


def test_schedule_limits_hold_the_config_every_holder_and_what_the_budget_left_out():
    """Prompts of 40 and 30 tokens, a budget of 64 and 6 blocks of 16: step 0 admits the first
    (blocks 0-2) and defers the second; the first is aborted with its step in flight, so at step 1
    it still holds its blocks beside the second's (3-4)."""
    cfg = EngineConfig(model="unused", max_model_len=64, block_size=16, num_kv_blocks=6, max_num_batched_tokens=64,
                       max_num_seqs=3)
    sched = Scheduler(cfg, SYNC)
    a, b = (Request(i, list(range(n)), SamplingParams(max_tokens=4), rng_key=0) for i, n in ((0, 40), (1, 30)))
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert schedule_limits(cfg, sched, batch) == ScheduleLimits(64, 3, 6, 16, {0: [0, 1, 2]}, 3, [1], [])
    sched.abort(a, 1, in_flight=True)
    batch = sched.schedule()
    assert schedule_limits(cfg, sched, batch) == ScheduleLimits(64, 3, 6, 16, {1: [3, 4], 0: [0, 1, 2]}, 1, [], [])
    limits = schedule_limits(cfg, sched, batch)
    b.block_ids.append(5)
    assert limits.blocks_held[1] == [3, 4], "a copy, not the request's own list"


def test_schedule_limits_name_the_requests_preempted():
    cfg = EngineConfig(model="unused", max_model_len=32, block_size=8, num_kv_blocks=5, max_num_seqs=2,
                       max_num_batched_tokens=32)
    sched = Scheduler(cfg, SYNC)
    a, b = (Request(i, list(range(16)), SamplingParams(max_tokens=15), rng_key=0) for i in range(2))
    sched.add(a)
    sched.add(b)
    sched.schedule()
    a.output_token_ids += [7] * 8  # both grow to 24 tokens, 3 blocks each: 6 > 5, so b, the newer, goes
    b.output_token_ids += [7] * 8
    a.needs_prefill = b.needs_prefill = False
    batch = sched.schedule()
    assert batch.preempted == [b]
    assert schedule_limits(cfg, sched, batch).preempted == [1]


def test_the_limits_ride_with_every_traced_step_and_are_not_taken_without_the_trace(make_llm):
    llm = make_llm(trace=True, spec="ngram", num_spec_tokens=2, max_num_seqs=2, async_runner=True)
    llm.generate(["def main(", "import os"], SamplingParams(temperature=0, max_tokens=6))
    assert llm.trace and all(s.limits is not None and s.limits.max_num_batched_tokens == 1024
                             and s.limits.num_kv_blocks == llm.config.total_kv_blocks for s in llm.trace)
    off = make_llm(spec="ngram", num_spec_tokens=2, async_runner=True)
    off.add_request("def main(", SamplingParams(temperature=0, max_tokens=6))
    off.step()
    assert off.trace is None and off.in_flight_request_ids == [0] and off._in_flight.limits is None
