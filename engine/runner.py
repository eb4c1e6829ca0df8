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
from engine.host_sync import DeclaredSyncs
from engine.model import LlamaForCausalLM
from engine.proposers import ProposeInput
from engine.request import Request
from engine.scheduler import ScheduledBatch
from engine.tokenizer import PAD_ID
from engine.verify import verify

REFUSE_PREFILL, REFUSE_RESUMED, REFUSE_HOST_HISTORY = "prefill", "resumed", "host_history"


@dataclass
class StepPlan:
    """Host-side description of one step; every field is known without reading the device.
    Rows past len(requests) are padding (graph arm): they run, and their results are dropped."""
    step: int
    arm: str                        # "eager" or "graph"
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

    @property
    def num_rows(self) -> int:
        return len(self.slots)


@dataclass
class StepOutput:
    sampled: torch.Tensor           # [R, k+1] accepted drafts, then correction/bonus; -1 after
    num_accepted: torch.Tensor      # [R]
    num_draft: torch.Tensor         # [R] real drafts verified this step
    inputs: dict = field(default_factory=dict)  # device inputs, kept for the trace


class DeviceState:
    """Per-slot device buffers that carry a request from one step to the next. The last slot
    belongs to padding rows."""

    def __init__(self, num_slots: int, max_len: int, k: int, vocab_size: int, with_q: bool, device: str):
        self.token_ids = torch.full((num_slots, max_len), PAD_ID, dtype=torch.long, device=device)
        self.num_committed = torch.ones(num_slots, dtype=torch.long, device=device)
        self.draft_token_ids = torch.full((num_slots, k), PAD_ID, dtype=torch.long, device=device)
        self.num_draft = torch.zeros(num_slots, dtype=torch.long, device=device)
        self.draft_probs = (torch.zeros(num_slots, k, vocab_size, device=device) if with_q else None)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: LlamaForCausalLM, proposer):
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
        self.padding_slot = cfg.max_num_seqs
        self.state = DeviceState(cfg.max_num_seqs + 1, self.table_width * cfg.block_size + self.k + 1,
                                 self.k, mc.vocab_size, getattr(proposer, "has_q", False), cfg.device)
        self.is_cuda = cfg.device.startswith("cuda")
        self.copy_stream = torch.cuda.Stream() if self.is_cuda else None
        self.buckets = graph_buckets(cfg.max_num_seqs)
        self.graphs: dict[int, tuple] = {}
        self.declared_syncs = DeclaredSyncs()  # the engine's deliberate host waits (engine/host_sync.py)

    # ---- host: describe the step ------------------------------------------------------------
    def plan_step(self, batch: ScheduledBatch, spec_width, is_async: bool, graph: bool) -> StepPlan:
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
        max_context = max(len(r.block_ids) for r in batch.requests) * self.block_size  # batches are never empty
        plan = StepPlan(batch.step, "eager", list(batch.requests), list(batch.is_prefill),
                        [r.slot for r in batch.requests], widths, query_lens, num_logits, ids,
                        positions, seq_lens, device_fed, refusals, tables, max_context)
        if graph and self._fits_graph(plan):
            self._pad_to_bucket(plan)
        return plan

    def _fits_graph(self, plan: StepPlan) -> bool:
        """Graphs serve uniform decode steps: no prefill, every row verifying k drafts."""
        return not any(plan.is_prefill) and all(w == self.k for w in plan.spec_width) \
            and not any(r.params.logits_processors for r in plan.requests)

    def _pad_to_bucket(self, plan: StepPlan, bucket: int | None = None) -> None:
        bucket = bucket or next(b for b in self.buckets if b >= plan.num_rows)
        width = self.k + 1
        for _ in range(bucket - plan.num_rows):
            plan.slots.append(self.padding_slot)
            plan.is_prefill.append(False)
            plan.spec_width.append(self.k)
            plan.query_lens.append(width)
            plan.num_logits.append(width)
            plan.host_token_ids += [PAD_ID] * width
            plan.host_positions += range(width)
            plan.host_seq_lens.append(width)
            plan.device_fed.append(False)
            plan.refusals.append(None)
            plan.block_tables.append([self.sink_block] * self.table_width)
        plan.arm = "graph"
        plan.max_context_len = self.table_width * self.block_size

    # ---- device: run the step ----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        inputs = self._upload(plan)
        sizes = (max(plan.query_lens), plan.max_context_len, len(plan.host_token_ids), sum(plan.num_logits))
        processors = [(r, req) for r, req in enumerate(plan.requests) if req.params.logits_processors]
        if plan.arm == "graph" and self.is_cuda:
            out = self._replay(plan.num_rows, inputs, sizes)
        else:
            out = self.device_step(inputs, sizes, processors)
        real = len(plan.requests)
        return StepOutput(out["sampled"][:real], out["num_accepted"][:real], out["num_draft"][:real],
                          {name: out[name] for name in TRACED_INPUTS})

    def _upload(self, plan: StepPlan) -> dict[str, torch.Tensor]:
        def tensor(values, dtype=torch.long):
            t = torch.tensor(values, dtype=dtype, device="cpu", pin_memory=self.is_cuda)  # host staging
            return t.to(self.device, non_blocking=True)
        return dict(slots=tensor(plan.slots), query_lens=tensor(plan.query_lens),
                    spec_width=tensor(plan.spec_width), num_logits=tensor(plan.num_logits),
                    device_fed=tensor(plan.device_fed, torch.bool),
                    is_prefill=tensor(plan.is_prefill, torch.bool),
                    host_token_ids=tensor(plan.host_token_ids), host_positions=tensor(plan.host_positions),
                    host_seq_lens=tensor(plan.host_seq_lens), block_tables=tensor(plan.block_tables),
                    **dict(zip(("temperature", "top_k", "top_p", "keys"), self._sampling_params(plan, tensor))))

    def _sampling_params(self, plan: StepPlan, tensor):
        pad = plan.num_rows - len(plan.requests)
        reqs = plan.requests
        return (tensor([r.params.temperature for r in reqs] + [0.0] * pad, torch.float32),
                tensor([r.params.top_k for r in reqs] + [-1] * pad),
                tensor([r.params.top_p for r in reqs] + [1.0] * pad, torch.float32),
                tensor([r.rng_key for r in reqs] + [0] * pad))

    def device_step(self, inp: dict[str, torch.Tensor], sizes: tuple[int, int, int, int],
                    processors=()) -> dict[str, torch.Tensor]:
        """The whole step on the device, no host reads: capturable as one CUDA graph."""
        max_query_len, max_context_len, num_tokens, total_logits = sizes
        state, k, dev = self.state, self.k, self.device
        slots, spec_width = inp["slots"], inp["spec_width"]
        num_reqs = slots.numel()
        query_start_loc = torch.nn.functional.pad(inp["query_lens"].cumsum(0), (1, 0))
        is_verify = ~inp["is_prefill"]

        # Combine: device-fed rows take ids and positions from the state the last step wrote;
        # every verify row takes its drafts from the draft buffer the last propose wrote.
        query_req = torch.repeat_interleave(torch.arange(num_reqs, device=dev), inp["query_lens"],
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
        fed_token = inp["device_fed"][query_req]
        takes_draft = is_verify[query_req] & (offset >= 1)
        input_ids = torch.where(fed_token | takes_draft, device_ids, inp["host_token_ids"])
        positions = torch.where(fed_token, committed - 1 + offset, inp["host_positions"])
        seq_lens = torch.where(inp["device_fed"], state.num_committed[slots] + spec_width, inp["host_seq_lens"])

        meta = build_attention_metadata(positions, query_start_loc, seq_lens, inp["block_tables"],
                                        self.block_size, max_query_len, max_context_len)
        hidden, aux = self.model(input_ids, positions, self.kv_caches, meta, self.proposer.aux_layers)
        state.token_ids[token_slot, positions] = input_ids

        # Gather logits only at logits_indices, derived from the real cu_num_logits.
        cu_num_logits = torch.nn.functional.pad(inp["num_logits"].cumsum(0), (1, 0))
        logits_indices, logit_row, logit_offset = build_logits_indices(query_start_loc, cu_num_logits,
                                                                       total_logits)
        width = k + 1
        logits = torch.zeros(num_reqs, width, self.vocab_size, device=dev)
        logits[logit_row, logit_offset] = self.model.compute_logits(hidden[logits_indices])
        for r, req in processors:  # host callables, only for requests that asked (eager arm)
            for proc in req.params.logits_processors:
                logits[r, 0] = proc(list(req.output_token_ids), logits[r, 0])

        params = (inp["temperature"], inp["top_k"], inp["top_p"], inp["keys"])
        num_draft = torch.where(is_verify, torch.minimum(state.num_draft[slots], spec_width), 0)
        drafts = state.draft_token_ids[slots]
        draft_probs = state.draft_probs[slots] if state.draft_probs is not None else None
        first_position = positions[logits_indices[cu_num_logits[:-1]]] + 1
        sampled, num_accepted = verify(logits, drafts, num_draft, draft_probs, *params, first_position)

        # Commit: the accepted drafts and the correction/bonus token join the request.
        out_pos = (first_position[:, None] + torch.arange(width, device=dev)).clamp(
            max=state.token_ids.shape[1] - 1)
        is_new = torch.arange(width, device=dev) <= num_accepted[:, None]
        row_slots = slots[:, None].expand(-1, width)
        state.token_ids[row_slots, out_pos] = torch.where(is_new, sampled, state.token_ids[row_slots, out_pos])
        state.num_committed[slots] = first_position + num_accepted + 1

        if k:
            self.proposer.observe(aux, meta, positions, token_slot)
            new_drafts, new_num_draft, q = self.proposer.propose(ProposeInput(
                state.token_ids[slots], state.num_committed[slots], *params, slots, inp["block_tables"]))
            state.draft_token_ids[slots] = new_drafts
            state.num_draft[slots] = torch.where(spec_width > 0, new_num_draft, 0)
            if q is not None:
                state.draft_probs[slots] = q

        return dict(sampled=sampled, num_accepted=num_accepted, num_draft=num_draft, input_ids=input_ids,
                    positions=positions, seq_lens=seq_lens, query_start_loc=query_start_loc,
                    cu_num_logits=cu_num_logits, logits_indices=logits_indices, draft_token_ids=drafts)

    def _replay(self, bucket: int, inputs: dict, sizes) -> dict[str, torch.Tensor]:
        """CUDA: capture one graph per bucket on first use, then copy inputs in and replay.
        Warm-up and capture run on an all-padding batch: a real batch would be executed twice,
        and a device-fed row would advance its state twice."""
        if bucket not in self.graphs:
            static_in = self._upload(self._padding_plan(bucket))
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.device_step(static_in, sizes)  # warm-up outside the graph
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # Capture synchronises once per bucket (and a sync inside a capture fails it anyway).
            with self.declared_syncs.allow("graph capture"), torch.cuda.graph(graph):
                static_out = self.device_step(static_in, sizes)
            self.graphs[bucket] = (graph, static_in, static_out)
        graph, static_in, static_out = self.graphs[bucket]
        for name, t in inputs.items():
            static_in[name].copy_(t)
        graph.replay()
        return {name: t.clone() for name, t in static_out.items()}

    def _padding_plan(self, bucket: int) -> StepPlan:
        plan = StepPlan(-1, "eager", [], [], [], [], [], [], [], [], [], [], [], [], 0)
        self._pad_to_bucket(plan, bucket)
        return plan


TRACED_INPUTS = ("input_ids", "positions", "seq_lens", "query_start_loc", "cu_num_logits",
                 "logits_indices", "draft_token_ids")


def graph_buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes a graph is captured for: powers of two up to max_num_seqs, and it."""
    return [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs] + [max_num_seqs]


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
