"""Acceptance counters (engine/bench/metrics.py) and the per-step trace record (engine/trace.py), on
hand-built inputs so every field is exact."""
import pytest
import torch

from engine.bench.metrics import Acceptance
from engine.policy import ASYNC, SYNC
from engine.request import Request, RequestStats
from engine.sampling import SamplingParams
from engine.step_io import StepOutputs
from engine.step_plan import RowPlan, StepPlan
from engine.step_result import StepResult
from engine.trace import RequestTrace, StepTrace, trace_step


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


def step(is_async: bool, arm: str, num_rows: int):
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
                      draft_token_ids=torch.tensor([[0, 0], [41, 42]] + [[0, 0]] * pad))
    # each row: k + 1 sampled (accepted drafts, then the correction/bonus; -1 after), num_accepted, num_draft
    results = StepResult.unpack([[9, -1, -1, 0, 0], [41, 77, -1, 1, 2]] + [[5, -1, -1, 0, 0]] * pad)
    return trace_step(plan, out, results, (ASYNC if is_async else SYNC).route)


@pytest.mark.parametrize("is_async, arm, num_rows, route", [
    (False, "eager", 2, "sync/eager"), (True, "eager", 2, "async/eager"), (True, "graph", 4, "async/graph")])
def test_a_step_trace_records_route_padding_and_every_request(is_async, arm, num_rows, route):
    assert step(is_async, arm, num_rows) == StepTrace(7, route, num_rows - 2, [
        RequestTrace(request_id=11, is_prefill=True, device_fed=False, refusal="prefill", input_ids=[1, 2, 3],
                     positions=[0, 1, 2], seq_len=3, logits_indices=[2], query_start=0, draft_token_ids=[],
                     num_draft=0, num_accepted=0, sampled=[9], slot=0, block_table=[0]),
        RequestTrace(request_id=12, is_prefill=False, device_fed=True, refusal=None, input_ids=[40, 41, 42],
                     positions=[5, 6, 7], seq_len=8, logits_indices=[3, 4, 5], query_start=3,
                     draft_token_ids=[41, 42], num_draft=2, num_accepted=1, sampled=[41, 77], slot=1,
                     block_table=[1], draft_slots=2),
    ])
