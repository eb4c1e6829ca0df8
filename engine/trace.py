"""The per-step trace: what every step fed, gathered, verified and emitted, per request.

Off by default and free when off: nothing here runs unless LLM(..., trace=True). The gates
read this trace. Beside what the device did, each step records the limits it was scheduled under
and the KV blocks every request held then (`ScheduleLimits`), so a gate can check, step by step,
that the scheduler kept its own token budget, its pool, and the reservations the writes need.
"""
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.scheduler import ScheduledBatch, Scheduler
from engine.step_io import StepOutputs
from engine.step_plan import StepPlan
from engine.step_result import StepResult


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
    slot: int = -1                # the device state slot the row ran in
    block_table: list[int] = field(default_factory=list)  # its KV blocks, padded with the sink block

    @property
    def emit_count(self) -> int:
        return self.num_accepted + 1


@dataclass(frozen=True)
class ScheduleLimits:
    """What a step was scheduled under, taken right after the scheduler decided it (before the
    step in flight, if any, is read): the limits, and every KV block holder at that moment."""
    max_num_batched_tokens: int
    max_num_seqs: int
    num_kv_blocks: int            # the pool; the cache's sink block (id num_kv_blocks) is not in it
    block_size: int
    blocks_held: dict[int, list[int]]  # request id -> its blocks: the running requests, and the
    #                                    aborted ones a step in flight still writes
    num_free_blocks: int
    deferred: list[int] = field(default_factory=list)   # requests the token budget left out
    preempted: list[int] = field(default_factory=list)  # requests preempted to schedule this step


def schedule_limits(cfg: EngineConfig, scheduler: Scheduler, batch: ScheduledBatch) -> ScheduleLimits:
    holders = scheduler.running + scheduler.held
    return ScheduleLimits(cfg.max_num_batched_tokens, cfg.max_num_seqs, cfg.total_kv_blocks, cfg.block_size,
                          {req.request_id: list(req.block_ids) for req in holders},
                          scheduler.block_manager.num_free_blocks, [req.request_id for req in batch.deferred],
                          [req.request_id for req in batch.preempted])


@dataclass
class StepTrace:
    step: int
    route: str                    # "sync/eager", "async/graph", ...
    num_padding_rows: int = 0
    requests: list[RequestTrace] = field(default_factory=list)
    launched_behind: int | None = None  # the step still unread when this one was launched (async)
    limits: ScheduleLimits | None = None  # what the scheduler held when it scheduled this step

    @property
    def num_reqs(self) -> int:
        return len(self.requests)


def trace_step(plan: StepPlan, out: StepOutputs, results: list[StepResult], route: str,
               launched_behind: int | None = None, limits: ScheduleLimits | None = None) -> StepTrace:
    """route: the runner policy's label ("sync" or "async"); the plan adds its arm;
    launched_behind: the step in flight when this one was launched; limits: what it was
    scheduled under (schedule_limits)."""
    qsl, cu = out.query_start_loc.tolist(), out.cu_num_logits.tolist()
    input_ids, positions, seq_lens = out.input_ids.tolist(), out.positions.tolist(), out.seq_lens.tolist()
    logits_indices, drafts = out.logits_indices.tolist(), out.draft_token_ids.tolist()
    real = plan.real_rows
    record = StepTrace(plan.step, f"{route}/{plan.arm}", plan.num_rows - len(real), launched_behind=launched_behind,
                       limits=limits)
    for r, (row, result) in enumerate(zip(real, results)):
        record.requests.append(RequestTrace(
            request_id=row.request.request_id, is_prefill=row.is_prefill, device_fed=row.device_fed,
            refusal=row.refusal, input_ids=input_ids[qsl[r]:qsl[r + 1]],
            positions=positions[qsl[r]:qsl[r + 1]], seq_len=seq_lens[r],
            logits_indices=logits_indices[cu[r]:cu[r + 1]], query_start=qsl[r],
            draft_token_ids=drafts[r][:result.num_draft], num_draft=result.num_draft,
            num_accepted=result.num_accepted, sampled=result.emitted, slot=row.slot,
            block_table=list(row.block_table)))
    return record
