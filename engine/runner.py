"""The model runner: turns a scheduled batch into device inputs, runs the target, verifies and
proposes, all on the device, and brings the results back. One step reads top to bottom:

    plan (host) -> launch: upload -> combine inputs -> forward -> gather logits -> verify
                   -> commit -> propose -> pack results -> results download queued
                -> read: wait for the download, unpack the results

Planning (host) lives in engine/step_plan.py. On the device, the sync and async runners differ
in one place only: which rows are *device-fed*, i.e. take their last committed token,
positions and sequence length from the device state written by the previous step instead of
from the host; the runner policy (engine/policy.py) decides that when the step is planned.
Drafts never leave the device.
"""
import gc
from dataclasses import dataclass

import torch

from engine.attention import build_attention_metadata, flex_kernels
from engine.clock import NullClock
from engine.combine import combine_inputs
from engine.config import EngineConfig
from engine.device_state import DeviceState
from engine.errors import SpecgateError
from engine.fused import FusedForward, compiled, compiled_kernels
from engine.host_sync import DeclaredSyncs
from engine.logits import gather_logits
from engine.model import LlamaForCausalLM
from engine.policy import RunnerPolicy
from engine.proposers import ProposeInput, Proposer
from engine.sampling import SamplingTensors, guarded_processors
from engine.scheduler import ScheduledBatch
from engine.staging import InputStaging
from engine.step_io import StepInputs, StepOutputs
from engine.step_plan import StepPlan, StepPlanner
from engine.step_result import ResultRing, StepResult
from engine.trace import ScheduleLimits
from engine.verify import verify


@dataclass
class InFlight:
    """A launched step: its plan, its results on their way to the host, and (trace) its outputs."""
    plan: StepPlan
    host: torch.Tensor                     # the packed results (engine/step_result.py), pinned on CUDA
    event: "torch.cuda.Event | None"       # CUDA: recorded when the results copy is done
    traced: StepOutputs | None = None      # a copy of what the step fed and gathered (trace=True)
    gpu_span: tuple | None = None          # the clock's timing events around the device work (bench, CUDA)
    launched_behind: int | None = None     # the step still in flight (unread) when this one was launched
    limits: ScheduleLimits | None = None   # what it was scheduled under (trace=True)
    ring_slot: int | None = None           # CUDA: the ResultRing buffer `host` views, freed when read


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: LlamaForCausalLM, proposer: Proposer):
        self.model = model
        # The forward the step runs: the reference modules, or the same arithmetic fused and compiled;
        # with it, the step's other pure pieces compiled too (the sampler's hashing alone is ~150 ops).
        # On CUDA its one-token steps' projections are Triton GEMVs (engine/gemv.py).
        self.forward = (FusedForward(model, compiled_kernels(gemv=torch.device(cfg.device).type == "cuda"))
                        if cfg.compile else model)
        self.verify = compiled(verify) if cfg.compile else verify
        self.combine = compiled(combine_inputs) if cfg.compile else combine_inputs
        self.gather_logits = compiled(gather_logits) if cfg.compile else gather_logits
        self.propose = (compiled(proposer.propose) if cfg.compile and proposer.pure_propose
                        else proposer.propose)
        self.build_metadata = (compiled(build_attention_metadata) if cfg.compile and cfg.attention_backend == "sdpa"
                               else build_attention_metadata)
        self.proposer = proposer
        self.device = cfg.device
        self.k = cfg.k
        self.block_size = cfg.block_size
        self.planner = StepPlanner(cfg)
        mc = model.config
        self.kv_caches = [torch.zeros(2, cfg.num_kv_slots, mc.num_key_value_heads, mc.dim_per_head,
                                      dtype=cfg.torch_dtype, device=cfg.device)
                          for _ in range(mc.num_hidden_layers)]
        self.state = DeviceState(cfg.max_num_seqs + 1, cfg.blocks_per_seq * cfg.block_size + self.k + 1,
                                 self.k, mc.vocab_size, proposer.has_q, cfg.device)
        self.is_cuda = cfg.device.startswith("cuda")
        self.results = ResultRing(cfg.max_num_seqs, self.k + 3) if self.is_cuda else None
        self.graphs: dict[tuple[int, int], tuple] = {}  # (batch bucket, context bucket) -> graph
        self.declared_syncs = DeclaredSyncs()  # the engine's deliberate host waits (engine/host_sync.py)
        self.staging = InputStaging(cfg.max_num_seqs, max(cfg.max_num_batched_tokens, cfg.max_num_seqs * (self.k + 1)),
                                    cfg.blocks_per_seq, cfg.device, self.declared_syncs)
        self.trace = cfg.trace
        self.graph_arm = cfg.graph
        if cfg.attention_backend == "flex" and self.is_cuda and mc.dim_per_head < 16:
            raise SpecgateError(f"attention_backend='flex' on CUDA needs a head dimension of at least 16 (torch's "
                                f"flex kernel), this model has {mc.dim_per_head}; use attention_backend='sdpa'")
        self.flex = flex_kernels(cfg.device, cfg.block_size) if cfg.attention_backend == "flex" else None
        self.paged_kernel = paged_kernel_module() if cfg.attention_backend == "paged" else None
        self.kv_heads = mc.num_key_value_heads
        self.group = mc.num_attention_heads // mc.num_key_value_heads
        self.graph_pool = torch.cuda.graph_pool_handle() if self.is_cuda and cfg.graph else None
        self.num_graph_replays = 0
    def _paged_sizes(self, num_reqs: int, max_query_len: int, max_context_len: int):
        """The paged kernel's launch sizes for this step, or None where sdpa's read serves it (the
        sdpa backend, or a step whose queries are too long for the kernel: a prefill's)."""
        kernel = self.paged_kernel
        if kernel is None or not kernel.fits(max_query_len, self.group):
            return None
        return kernel.paged_sizes(num_reqs, self.kv_heads, self.group, max_query_len, max_context_len, self.block_size)

    def plan_step(self, batch: ScheduledBatch, policy: RunnerPolicy, graph: bool) -> StepPlan:
        return self.planner.plan(batch, policy, graph)

    # ---- launch a step, read its results -------------------------------------------------------
    @torch.inference_mode()
    def launch(self, plan: StepPlan, clock=NullClock()) -> InFlight:
        """Queue the step's device work and the download of its results; returns without waiting."""
        inputs = self._upload(plan, clock)
        # The step's GPU span opens after the host staged its inputs: opened before, its start
        # event fires at once on an idle device and the host's staging counts as device time.
        span = clock.begin_gpu()
        if plan.arm == "graph" and self.is_cuda:
            out = self._replay(plan, inputs)
        else:
            processors = [(r, req) for r, req in enumerate(plan.requests) if req.params.logits_processors]
            out = self.device_step(inputs, step_sizes(plan), processors, graph=plan.arm == "graph")
        span = clock.end_gpu(span)
        packed = out.packed_results(len(plan.requests))
        # Committed ids go to the host on every step, whatever else the step did. A CPU tensor is
        # already where the host reads it; on CUDA they are copied into the result ring.
        host, event, ring_slot = self.results.download(packed) if self.is_cuda else (packed, None, None)
        # The trace reads the step a step late (async runner), after a replay has overwritten it.
        return InFlight(plan, host, event, out.clone() if self.trace else None, span, ring_slot=ring_slot)

    def read(self, flight: InFlight, blocking: bool) -> list[StepResult]:
        """Wait for a launched step's results (the one place the host waits on the device) and
        unpack them. `blocking`: nothing is queued behind this step, so the device idles meanwhile."""
        with self.declared_syncs.allow(f"{'blocking' if blocking else 'deferred'} result read"):
            if flight.event is not None:
                flight.event.synchronize()
            results = StepResult.unpack(flight.host.tolist())
        if flight.ring_slot is not None:
            self.results.release(flight.ring_slot)
        return results

    # ---- device: run the step ----------------------------------------------------------------
    def _upload(self, plan: StepPlan, clock=NullClock()) -> StepInputs[torch.Tensor]:
        """The plan's columns, staged and copied to the device in one copy per dtype."""
        rows = plan.rows
        params = [row.request.params if row.request else None for row in rows]  # None: padding, greedy
        columns = StepInputs(slots=[r.slot for r in rows], query_lens=[r.query_len for r in rows],
                             spec_width=[r.spec_width for r in rows], num_logits=[r.num_logits for r in rows],
                             device_fed=[r.device_fed for r in rows], draft_slots=[r.draft_slots for r in rows],
                             host_seq_lens=[r.seq_len for r in rows],
                             top_k=[p.top_k if p else -1 for p in params],
                             keys=[r.request.rng_key if r.request else 0 for r in rows],
                             host_token_ids=[t for r in rows for t in r.token_ids],
                             host_positions=[p for r in rows for p in r.positions],
                             block_tables=[r.block_table for r in rows],
                             temperature=[p.temperature if p else 0.0 for p in params],
                             top_p=[p.top_p if p else 1.0 for p in params])
        inputs = self.staging.upload(columns, len(rows), len(columns.host_token_ids))
        clock.mark("upload")
        return inputs

    def device_step(self, inp: StepInputs[torch.Tensor], sizes: tuple[int, int, int, int],
                    processors=(), graph: bool = False) -> StepOutputs:
        """The whole step on the device, no host reads: capturable as one CUDA graph (`graph`:
        this step is a graph bucket's, its shapes fixed)."""
        max_query_len, max_context_len, num_tokens, total_logits = sizes
        state, k, dev = self.state, self.k, self.device
        slots, spec_width = inp.slots, inp.spec_width
        num_reqs = slots.numel()
        # Combine: device-fed rows take ids and positions from the state the last step wrote, and
        # draft slots take the drafts the last propose wrote (engine/combine.py).
        query_start_loc, token_slot, input_ids, positions, seq_lens = self.combine(
            slots, inp.query_lens, spec_width, inp.device_fed, inp.draft_slots, inp.host_token_ids,
            inp.host_positions, inp.host_seq_lens, state.num_committed, state.token_ids, state.draft_token_ids, k,
            num_tokens)

        flex = None if self.flex is None else self.flex.fixed_shapes if graph else self.flex.any_shapes
        paged = self._paged_sizes(num_reqs, max_query_len, max_context_len)
        meta = self.build_metadata(positions, query_start_loc, seq_lens, inp.block_tables,
                                   self.block_size, max_query_len, max_context_len, flex,
                                   self.kv_caches[0].shape[1], paged)
        hidden, aux = self.forward(input_ids, positions, self.kv_caches, meta, self.proposer.aux_layers)
        state.token_ids[token_slot, positions] = input_ids

        width = k + 1
        logits, logits_indices, cu_num_logits = self.gather_logits(hidden, query_start_loc, inp.num_logits,
                                                                   total_logits, width, self.model.compute_logits)
        for r, req in processors:  # host callables, only for requests that asked (eager arm)
            for proc in guarded_processors(req):  # one that raises fails its request alone
                logits[r, 0] = proc(list(req.output_token_ids), logits[r, 0])

        sampling = SamplingTensors(temperature=inp.temperature, top_k=inp.top_k, top_p=inp.top_p, keys=inp.keys)
        num_draft = torch.minimum(state.num_draft[slots], inp.draft_slots)
        drafts = state.draft_token_ids[slots]
        draft_probs = state.draft_probs[slots] if state.draft_probs is not None else None
        first_position = positions[logits_indices[cu_num_logits[:-1]]] + 1
        sampled, num_accepted = self.verify(logits, drafts, num_draft, draft_probs, sampling, first_position)

        # Commit: the accepted drafts and the correction/bonus token join the request.
        out_pos = (first_position[:, None] + torch.arange(width, device=dev)).clamp(
            max=state.token_ids.shape[1] - 1)
        is_new = torch.arange(width, device=dev) <= num_accepted[:, None]
        row_slots = slots[:, None].expand(-1, width)
        state.token_ids[row_slots, out_pos] = torch.where(is_new, sampled, state.token_ids[row_slots, out_pos])
        state.num_committed[slots] = first_position + num_accepted + 1

        if k:
            self.proposer.observe(aux, meta, positions, token_slot)
            new_drafts, new_num_draft, q = self.propose(ProposeInput(
                state.token_ids[slots], state.num_committed[slots], sampling, slots, inp.block_tables))
            state.draft_token_ids[slots] = new_drafts
            state.num_draft[slots] = torch.where(spec_width > 0, new_num_draft, 0)
            if q is not None:
                state.draft_probs[slots] = q

        return StepOutputs(sampled=sampled, num_accepted=num_accepted, num_draft=num_draft, input_ids=input_ids,
                           positions=positions, seq_lens=seq_lens, query_start_loc=query_start_loc,
                           cu_num_logits=cu_num_logits, logits_indices=logits_indices, draft_token_ids=drafts,
                           packed=StepResult.pack(sampled, num_accepted, num_draft))

    def _replay(self, plan: StepPlan, inputs: StepInputs[torch.Tensor]) -> StepOutputs:
        """CUDA: a graph's inputs are the staging buffer's device views for its bucket, so the
        upload (`inputs`) is all the input copying a replay needs. Its outputs are returned without a
        clone: `launch` packs the results for download right after the step is queued,
        stream-ordered before the next replay overwrites them."""
        key = (plan.num_rows, plan.max_context_len)
        if key not in self.graphs:
            raise RuntimeError(f"no CUDA graph for (rows, context) {key}: capture_graphs() runs at start-up")
        graph, static_in, static_out = self.graphs[key]
        if inputs.slots.data_ptr() != static_in.slots.data_ptr():
            raise RuntimeError(f"graph {key}: the staged inputs moved since capture")
        graph.replay()
        self.num_graph_replays += 1
        return static_out

    def capture_graphs(self) -> None:
        """The graph arm on CUDA: capture every (batch, context) bucket now, at start-up, not on
        a real step's first use. Largest first, so the smaller ones reuse the pool's memory."""
        if not (self.graph_arm and self.is_cuda):
            return
        # No garbage collection inside a capture: collecting an earlier engine's pinned buffers or
        # events makes CUDA calls a capture forbids, and the capture fails ("operation failed due
        # to a previous error during capture", seen once in three gate rounds on the H200).
        gc.collect()
        collecting = gc.isenabled()
        gc.disable()
        try:
            with torch.inference_mode():
                for rows in reversed(self.planner.buckets):
                    for context in reversed(self.planner.context_buckets):
                        self._capture((rows, context))
        finally:
            if collecting:
                gc.enable()

    def _capture(self, key: tuple[int, int]) -> None:
        """Warm up and capture the graph of a (batch, context) bucket on an all-padding batch (a
        real batch would be executed twice, and a device-fed row would advance its state twice);
        every graph allocates from one memory pool."""
        padding = self.planner.padding_plan(*key)
        static_in = self._upload(padding)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.device_step(static_in, step_sizes(padding), graph=True)  # warm-up (and compile) outside the graph
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Capture synchronises once per bucket (and a sync inside a capture fails it anyway).
        with self.declared_syncs.allow("graph capture"), torch.cuda.graph(graph, pool=self.graph_pool):
            static_out = self.device_step(static_in, step_sizes(padding), graph=True)
        self.graphs[key] = (graph, static_in, static_out)


def step_sizes(plan: StepPlan) -> tuple[int, int, int, int]:
    """The host-known sizes a step's device work is shaped by: (max query length, context
    length, tokens, logits). A graph bucket fixes all four."""
    query_lens = [row.query_len for row in plan.rows]
    return max(query_lens), plan.max_context_len, sum(query_lens), sum(row.num_logits for row in plan.rows)


def paged_kernel_module():
    """engine/paged_kernel.py, imported only for the paged backend: it needs Triton."""
    try:
        from engine import paged_kernel
    except ImportError as err:
        raise SpecgateError(f"attention_backend='paged' needs Triton ({err}); use attention_backend='sdpa'") from err
    return paged_kernel
