"""The model runner: turns a scheduled batch into device inputs, runs the target, verifies and
proposes, all on the device. One step reads top to bottom:

    plan (host) -> combine inputs -> forward -> gather logits -> verify -> commit -> propose

Planning (host) lives in engine/step_plan.py. On the device, the sync and async runners differ
in one place only: which rows are *device-fed*, i.e. take their last committed token,
positions and sequence length from the device state written by the previous step instead of
from the host; the runner policy (engine/policy.py) decides that when the step is planned.
Drafts never leave the device.
"""
from dataclasses import dataclass, field

import torch

from engine.attention import build_attention_metadata
from engine.config import EngineConfig
from engine.host_sync import DeclaredSyncs
from engine.metrics import NoPhases
from engine.model import LlamaForCausalLM
from engine.policy import RunnerPolicy
from engine.proposers import ProposeInput
from engine.sampling import SamplingTensors, guarded_processors
from engine.scheduler import ScheduledBatch
from engine.step_plan import StepPlan, StepPlanner
from engine.tokenizer import PAD_ID
from engine.verify import verify


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
        self.planner = StepPlanner(cfg)
        mc = model.config
        self.kv_caches = [torch.zeros(2, cfg.num_kv_slots, mc.num_key_value_heads, mc.dim_per_head,
                                      dtype=cfg.torch_dtype, device=cfg.device)
                          for _ in range(mc.num_hidden_layers)]
        self.vocab_size = mc.vocab_size
        self.state = DeviceState(cfg.max_num_seqs + 1, cfg.blocks_per_seq * cfg.block_size + self.k + 1,
                                 self.k, mc.vocab_size, getattr(proposer, "has_q", False), cfg.device)
        self.is_cuda = cfg.device.startswith("cuda")
        self.copy_stream = torch.cuda.Stream() if self.is_cuda else None
        self.graphs: dict[int, tuple] = {}
        self.declared_syncs = DeclaredSyncs()  # the engine's deliberate host waits (engine/host_sync.py)
        self.step_phases = NoPhases()  # the bench sets a metrics.StepPhases: host time per step by phase

    def plan_step(self, batch: ScheduledBatch, policy: RunnerPolicy, graph: bool) -> StepPlan:
        return self.planner.plan(batch, policy, graph)

    # ---- device: run the step ----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepOutput:
        inputs = self._upload(plan)
        self.step_phases.mark("upload")  # the bench's phase clock (engine/metrics.py); a no-op otherwise
        query_lens = [row.query_len for row in plan.rows]
        sizes = (max(query_lens), plan.max_context_len, sum(query_lens), sum(row.num_logits for row in plan.rows))
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
        rows = plan.rows
        params = [row.request.params if row.request else None for row in rows]  # None: padding, greedy
        return dict(slots=tensor([r.slot for r in rows]), query_lens=tensor([r.query_len for r in rows]),
                    spec_width=tensor([r.spec_width for r in rows]),
                    num_logits=tensor([r.num_logits for r in rows]),
                    device_fed=tensor([r.device_fed for r in rows], torch.bool),
                    is_prefill=tensor([r.is_prefill for r in rows], torch.bool),
                    host_token_ids=tensor([t for r in rows for t in r.token_ids]),
                    host_positions=tensor([p for r in rows for p in r.positions]),
                    host_seq_lens=tensor([r.seq_len for r in rows]),
                    block_tables=tensor([r.block_table for r in rows]),
                    temperature=tensor([p.temperature if p else 0.0 for p in params], torch.float32),
                    top_k=tensor([p.top_k if p else -1 for p in params]),
                    top_p=tensor([p.top_p if p else 1.0 for p in params], torch.float32),
                    keys=tensor([r.request.rng_key if r.request else 0 for r in rows]))

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
            for proc in guarded_processors(req):  # one that raises fails its request alone
                logits[r, 0] = proc(list(req.output_token_ids), logits[r, 0])

        sampling = SamplingTensors(temperature=inp["temperature"], top_k=inp["top_k"], top_p=inp["top_p"],
                                   keys=inp["keys"])
        num_draft = torch.where(is_verify, torch.minimum(state.num_draft[slots], spec_width), 0)
        drafts = state.draft_token_ids[slots]
        draft_probs = state.draft_probs[slots] if state.draft_probs is not None else None
        first_position = positions[logits_indices[cu_num_logits[:-1]]] + 1
        sampled, num_accepted = verify(logits, drafts, num_draft, draft_probs, sampling, first_position)

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
                state.token_ids[slots], state.num_committed[slots], sampling, slots, inp["block_tables"]))
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
            static_in = self._upload(self.planner.padding_plan(bucket))
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


TRACED_INPUTS = ("input_ids", "positions", "seq_lens", "query_start_loc", "cu_num_logits",
                 "logits_indices", "draft_token_ids")


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
