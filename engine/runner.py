"""The model runner: turns a scheduled batch into device inputs, runs the target, verifies and
proposes, all on the device. One step reads top to bottom:

    plan (host) -> combine inputs -> forward -> gather logits -> verify -> commit -> propose

The sync and async runners differ in one place only: which rows are *device-fed*, i.e. take
their last committed token, positions and sequence length from the device state written by
the previous step instead of from the host (see `plan_step`). Drafts never leave the device.
"""
from dataclasses import dataclass, field

import torch

from engine.attention import build_attention_metadata
from engine.config import EngineConfig
from engine.model import LlamaForCausalLM
from engine.proposers import ProposeInput
from engine.request import Request
from engine.scheduler import ScheduledBatch
from engine.tokenizer import PAD_ID
from engine.verify import verify

REFUSE_PREFILL, REFUSE_RESUMED, REFUSE_HOST_HISTORY = "prefill", "resumed", "host_history"


@dataclass
class StepPlan:
    """Host-side description of one step; every field is known without reading the device."""
    step: int
    requests: list[Request]
    is_prefill: list[bool]
    slots: list[int]
    spec_width: list[int]           # drafts this row's request may verify (k, or 0)
    query_lens: list[int]
    num_logits: list[int]
    host_token_ids: list[int]       # flattened; placeholders where the device supplies ids
    host_positions: list[int]
    host_seq_lens: list[int]
    device_fed: list[bool]
    refusals: list[str | None]      # why a row is fed from the host (async runner)
    block_tables: list[list[int]]
    max_context_len: int


@dataclass
class StepOutput:
    sampled: torch.Tensor           # [R, k+1] accepted drafts, then correction/bonus; -1 after
    num_accepted: torch.Tensor      # [R]
    num_draft: torch.Tensor         # [R] real drafts verified this step
    inputs: dict = field(default_factory=dict)  # device inputs, kept for the trace


class DeviceState:
    """Per-slot device buffers that carry a request from one step to the next."""

    def __init__(self, num_slots: int, max_len: int, k: int, device: str):
        self.token_ids = torch.full((num_slots, max_len), PAD_ID, dtype=torch.long, device=device)
        self.num_committed = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.draft_token_ids = torch.full((num_slots, k), PAD_ID, dtype=torch.long, device=device)
        self.num_draft = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.draft_probs: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: LlamaForCausalLM, proposer):
        self.cfg = cfg
        self.model = model
        self.proposer = proposer
        self.device = cfg.device
        self.k = cfg.k
        self.block_size = cfg.block_size
        self.table_width = cfg.blocks_per_seq
        self.sink_block = cfg.total_kv_blocks  # an extra block that padding writes into
        mc = model.config
        num_slots_kv = (cfg.total_kv_blocks + 1) * cfg.block_size
        self.kv_caches = [torch.zeros(2, num_slots_kv, mc.num_key_value_heads, mc.dim_per_head,
                                      dtype=cfg.torch_dtype, device=cfg.device)
                          for _ in range(mc.num_hidden_layers)]
        self.vocab_size = mc.vocab_size
        self.copy_stream = torch.cuda.Stream() if cfg.device.startswith("cuda") else None
        self.state = DeviceState(cfg.max_num_seqs + 1, self.table_width * cfg.block_size + self.k + 1,
                                 self.k, cfg.device)

    # ---- host: describe the step ------------------------------------------------------------
    def plan_step(self, batch: ScheduledBatch, spec_width, is_async: bool) -> StepPlan:
        ids, positions, seq_lens, query_lens, num_logits = [], [], [], [], []
        device_fed, refusals, widths, tables = [], [], [], []
        for req, prefill in zip(batch.requests, batch.is_prefill):
            width = spec_width(req)
            refusal = (REFUSE_RESUMED if prefill and req.is_resumed else REFUSE_PREFILL if prefill
                       else REFUSE_HOST_HISTORY if req.needs_host_history else None)
            fed = is_async and refusal is None
            if prefill:
                tokens = req.all_token_ids
                ids += tokens
                positions += range(len(tokens))
                seq_lens.append(len(tokens))
                query_lens.append(len(tokens))
                num_logits.append(1)
            else:
                n = req.num_tokens
                ids += [req.all_token_ids[-1] if not fed else PAD_ID] + [PAD_ID] * width
                positions += range(n - 1, n + width) if not fed else [0] * (1 + width)
                seq_lens.append(n + width if not fed else 0)
                query_lens.append(1 + width)
                num_logits.append(1 + width)
            widths.append(width)
            device_fed.append(fed)
            refusals.append(refusal if is_async else None)
            tables.append(req.block_ids + [self.sink_block] * (self.table_width - len(req.block_ids)))
        max_context = max((len(r.block_ids) for r in batch.requests), default=1) * self.block_size
        return StepPlan(batch.step, list(batch.requests), list(batch.is_prefill),
                        [r.slot for r in batch.requests], widths, query_lens, num_logits, ids,
                        positions, seq_lens, device_fed, refusals, tables, max_context)

    # ---- device: run the step ----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        dev, state, k = self.device, self.state, self.k

        def tensor(values, dtype=torch.long):
            return torch.tensor(values, dtype=dtype, device=dev)

        reqs = plan.requests
        num_reqs = len(reqs)
        slots = tensor(plan.slots)
        query_lens = tensor(plan.query_lens)
        query_start_loc = torch.nn.functional.pad(query_lens.cumsum(0), (1, 0))
        num_tokens = len(plan.host_token_ids)
        spec_width = tensor(plan.spec_width)
        device_fed = tensor(plan.device_fed, torch.bool)
        is_verify = ~tensor(plan.is_prefill, torch.bool)

        # Combine: device-fed rows take ids and positions from the state the last step wrote;
        # every verify row takes its drafts from the draft buffer the last propose wrote.
        query_req = torch.repeat_interleave(torch.arange(num_reqs, device=dev), query_lens,
                                            output_size=num_tokens)
        offset = torch.arange(num_tokens, device=dev) - query_start_loc[query_req]
        token_slot = slots[query_req]
        committed = state.num_committed[token_slot]
        last_token = state.token_ids[token_slot, (committed - 1).clamp_min(0)]
        if k:
            draft = state.draft_token_ids[token_slot, (offset - 1).clamp(0, k - 1)]
            device_ids = torch.where(offset == 0, last_token, draft)
        else:
            device_ids = last_token
        fed_token = device_fed[query_req]
        takes_draft = is_verify[query_req] & (offset >= 1)
        input_ids = torch.where(fed_token | takes_draft, device_ids, tensor(plan.host_token_ids))
        positions = torch.where(fed_token, committed - 1 + offset, tensor(plan.host_positions))
        seq_lens = torch.where(device_fed, state.num_committed[slots] + spec_width,
                               tensor(plan.host_seq_lens))

        block_tables = tensor(plan.block_tables)
        meta = build_attention_metadata(positions, query_start_loc, seq_lens, block_tables,
                                        self.block_size, max(plan.query_lens), plan.max_context_len)
        hidden, aux = self.model(input_ids, positions, self.kv_caches, meta, self.proposer.aux_layers)
        state.token_ids[token_slot, positions] = input_ids

        # Gather logits only at logits_indices, derived from the real cu_num_logits.
        cu_num_logits = torch.nn.functional.pad(tensor(plan.num_logits).cumsum(0), (1, 0))
        logits_indices, logit_row, logit_offset = build_logits_indices(
            query_start_loc, cu_num_logits, sum(plan.num_logits))
        width = k + 1
        logits = torch.zeros(num_reqs, width, self.vocab_size, device=dev)
        logits[logit_row, logit_offset] = self.model.compute_logits(hidden[logits_indices])
        for r, req in enumerate(reqs):  # host callables; only requests that asked for them
            for proc in req.params.logits_processors:
                logits[r, 0] = proc(list(req.output_token_ids), logits[r, 0])

        params = self._sampling_tensors(reqs)
        num_draft = torch.where(is_verify, torch.minimum(state.num_draft[slots], spec_width), 0)
        drafts = state.draft_token_ids[slots]
        draft_probs = state.draft_probs[slots] if state.draft_probs is not None else None
        first_position = positions[logits_indices[cu_num_logits[:-1]]] + 1
        sampled, num_accepted = verify(logits, drafts, num_draft, draft_probs, *params, first_position)

        # Commit: the accepted drafts and the correction/bonus token become part of the request.
        out_pos = (first_position[:, None] + torch.arange(width, device=dev)).clamp(
            max=state.token_ids.shape[1] - 1)
        is_new = torch.arange(width, device=dev) <= num_accepted[:, None]
        row_slots = slots[:, None].expand(-1, width)
        state.token_ids[row_slots, out_pos] = torch.where(is_new, sampled, state.token_ids[row_slots, out_pos])
        state.num_committed[slots] = first_position + num_accepted + 1

        if k:
            self.proposer.observe(aux, meta, positions, token_slot)
            new_drafts, new_num_draft, q = self.proposer.propose(ProposeInput(
                state.token_ids[slots], state.num_committed[slots], *params[:3], params[3],
                slots, block_tables))
            state.draft_token_ids[slots] = new_drafts
            state.num_draft[slots] = torch.where(spec_width > 0, new_num_draft, 0)
            if q is not None:
                if state.draft_probs is None:
                    state.draft_probs = torch.zeros(*state.draft_token_ids.shape, self.vocab_size, device=dev)
                state.draft_probs[slots] = q

        inputs = dict(input_ids=input_ids, positions=positions, seq_lens=seq_lens,
                      query_start_loc=query_start_loc, cu_num_logits=cu_num_logits,
                      logits_indices=logits_indices, draft_token_ids=drafts)
        return StepOutput(sampled, num_accepted, num_draft, inputs)

    def _sampling_tensors(self, reqs: list[Request]):
        dev = self.device
        return (torch.tensor([r.params.temperature for r in reqs], dtype=torch.float32, device=dev),
                torch.tensor([r.params.top_k for r in reqs], dtype=torch.long, device=dev),
                torch.tensor([r.params.top_p for r in reqs], dtype=torch.float32, device=dev),
                torch.tensor([r.rng_key for r in reqs], dtype=torch.long, device=dev))


def build_logits_indices(query_start_loc: torch.Tensor, cu_num_logits: torch.Tensor,
                         total_logits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row r's logits window is the last num_logits[r] tokens of its query: for a verify row
    (query = last committed token + k drafts) that starts at its query start; for a prefill
    row it is the last prompt token. Returns (logits_indices, row, offset in window)."""
    num_logits = cu_num_logits[1:] - cu_num_logits[:-1]
    num_reqs = num_logits.numel()
    row = torch.repeat_interleave(torch.arange(num_reqs, device=num_logits.device), num_logits,
                                  output_size=total_logits)
    offset = torch.arange(total_logits, device=num_logits.device) - cu_num_logits[row]
    window_start = query_start_loc[1:] - num_logits
    return window_start[row] + offset, row, offset
