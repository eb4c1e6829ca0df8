"""The per-step trace: what every step fed, gathered, verified and emitted, per request.

Off by default and free when off: nothing here runs unless LLM(..., trace=True). The gates
read this trace.
"""
from dataclasses import dataclass, field

from engine.runner import StepOutput, StepPlan


@dataclass
class RequestTrace:
    request_id: int
    is_prefill: bool
    device_fed: bool
    refusal: str | None
    input_ids: list[int]
    positions: list[int]
    seq_len: int
    logits_indices: list[int]     # absolute rows of the step's flattened batch
    query_start: int
    draft_token_ids: list[int]    # the real drafts verified this step
    num_draft: int
    num_accepted: int
    sampled: list[int]            # accepted drafts then the correction/bonus token

    @property
    def emit_count(self) -> int:
        return self.num_accepted + 1


@dataclass
class StepTrace:
    step: int
    route: str                    # "sync/eager", "async/graph", ...
    num_padding_rows: int = 0
    requests: list[RequestTrace] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.requests)


def trace_step(plan: StepPlan, out: StepOutput, results: list[list[int]], is_async: bool) -> StepTrace:
    host = {name: t.tolist() for name, t in out.inputs.items()}
    record = StepTrace(plan.step, f"{'async' if is_async else 'sync'}/{plan.arm}", plan.num_rows - len(plan.requests))
    qsl, cu = host["query_start_loc"], host["cu_num_logits"]
    for r, req in enumerate(plan.requests):
        num_accepted, num_draft = results[r][-2:]  # each row: sampled..., num_accepted, num_draft
        record.requests.append(RequestTrace(
            request_id=req.request_id, is_prefill=plan.is_prefill[r], device_fed=plan.device_fed[r],
            refusal=plan.refusals[r], input_ids=host["input_ids"][qsl[r]:qsl[r + 1]],
            positions=host["positions"][qsl[r]:qsl[r + 1]], seq_len=host["seq_lens"][r],
            logits_indices=host["logits_indices"][cu[r]:cu[r + 1]], query_start=qsl[r],
            draft_token_ids=host["draft_token_ids"][r][:num_draft], num_draft=num_draft,
            num_accepted=num_accepted, sampled=results[r][:num_accepted + 1]))
    return record
