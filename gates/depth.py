"""Gate depth: nothing that should not depend on how deep a request is in its context does.

Requests start at depths from the start of the context to the plan's deepest, on a random-weight
*decisive* folder (engine/bench/models.py; its greedy choice is the same at any depth, so the
target stays coherent however deep it runs): the async runner's speculative tokens equal the
plain run's at every depth, and with the oracle drafter (engine/bench/oracle.py), asked for a mean
acceptance length tau, the tokens per verify step in each depth bucket stay at tau. Acceptance
that dies past a position while the target stays coherent (reported past 32,768 positions on a
public engine) is invisible to token equality: only the per-bucket level sees it. The oracle's
coins are a hash of (request, position), so each bucket's level is deterministic; the band is a
few standard errors of tau wide, and a collapse to one token per step is far outside it. The
ngram drafter's tokens per verify step per bucket are reported beside it (no level is asked of
it: its acceptance is the workload's).

Three plans (`plan_for`):
- CPU (`make gates`): "tiny-deep", requests to 4,072 positions in buckets of 1,024. Attention on
  the CPU is dense (engine/attention.py's sdpa path), so a deeper prefill costs more seconds than
  the gate's budget.
- CPU under `--deep` (`make gates-deep`): the same folder to 8,232 positions in buckets of 2,048.
- CUDA: the 1B benchmark shape with 40,960 positions ("llama-1b-deep", written once to the
  bench-model cache), one request from 32,720 to 33,808, past 32,768 + 1,024, in buckets of
  8,192, on CUDA's default attention backend (paged; the 32k prefill itself takes sdpa's read).
  On CUDA the step time is judged too: a plain
  decode step of the graph arm at each depth may grow over the shallowest by at most STEP_GROWTH_FACTOR times the
  time to read the keys and values it adds at the measured copy bandwidth (a per-position host
  loop or a quadratic gather is far above it).

The gate runs on its plan's folder, never on the session's target (the report environment's
`model` and `model_shape`: the fixture target unless --model names one): its result's `models`
names the folder, its shape and its keys (gates/plugin.py's Recorder.model). The verdict asks no
model-size gates of that folder (gates/verdict.py).
"""
import math
import os
from dataclasses import dataclass

import pytest
import torch

from engine import LLM, SamplingParams
from engine.bench.decode import copy_bandwidth, floor_ms, plain_step_bytes, time_decode
from engine.bench.models import bench_prompts, write_bench_model
from engine.bench.oracle import OracleScript, acceptance_for_tau, oracle_proposer, tokens_per_step_moments
from engine.config import ModelConfig
from gates.compare import Difference
from gates.workloads import Run, Workload

K, TAU = 4, 4.2       # the oracle's drafts per step and requested tokens per step
BAND = 4.0            # standard errors of the mean allowed around TAU per bucket
# A plain step's growth over the shallowest depth, at most this many times the added KV read at
# the copy bandwidth. The bytes the sdpa decode step moves per context position: the gather reads
# the keys and values and writes a copy (2), SDPA's math kernel expands a grouped-query model's
# heads (4 query heads per key head on the 1B shape: 4 written, 4 read), and the copy is padded
# to its context bucket (up to 2x): about 20. 24 leaves headroom; a per-position host loop or a
# quadratic gather is far above it at 32k. (8 was red at 8,208 positions on the H200: 9.7x,
# measured on the clean tree; 4.2x at 32,720.)
STEP_GROWTH_FACTOR = 24.0
STEP_DECODE_TOKENS = 48  # tokens each step-time request decodes (its window)
CLAIMS = ("async runner", "spec tokens equal plain at every depth",
          "acceptance at the requested level in every bucket", "verify steps in every depth bucket",
          "ngram acceptance per bucket reported")


@dataclass(frozen=True)
class DepthPlan:
    """Where the gate's requests start and how far each runs, and the buckets it judges."""
    name: str
    shape: str                        # engine/bench/models.py's shape of the decisive folder
    prompt_lens: tuple[int, ...]      # one request starting at each depth
    max_tokens: tuple[int, ...]       # how many tokens each of them generates
    bucket: int                       # positions per depth bucket

    @property
    def max_model_len(self) -> int:
        return max(p + m for p, m in zip(self.prompt_lens, self.max_tokens)) + K + 16

    @property
    def deepest(self) -> int:
        """The last position the deepest request reaches."""
        return max(p + m for p, m in zip(self.prompt_lens, self.max_tokens))

    @property
    def num_buckets(self) -> int:
        return -(-self.deepest // self.bucket)


PLANS = {
    "cpu": DepthPlan("cpu", "tiny-deep", (16, 1040, 2064, 3088, 4032), (40,) * 5, 1024),
    "cpu-deep": DepthPlan("cpu-deep", "tiny-deep", (16, 2064, 4112, 6160, 8160), (40, 40, 40, 40, 72), 2048),
    "cuda": DepthPlan("cuda", "llama-1b-deep", (16, 8208, 16400, 24592, 32720), (64, 64, 64, 64, 1088), 8192),
}


def plan_for(device: str, profile: str) -> DepthPlan:
    """The CUDA plan on a GPU, the deeper CPU plan under the deep Hypothesis profile."""
    if device.startswith("cuda"):
        return PLANS["cuda"]
    return PLANS["cpu-deep" if profile == "deep" else "cpu"]


@pytest.fixture(scope="module")
def plan(gate_device) -> DepthPlan:
    return plan_for(gate_device, os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="module")
def deep_dir(plan, tmp_path_factory):
    if plan.name == "cuda":  # 2.5 GB: written once to the bench-model cache, as bench1b does
        return write_bench_model(plan.shape, seed=0)
    return write_bench_model(plan.shape, seed=0, folder=tmp_path_factory.mktemp("depth") / plan.shape)


def bucket_levels(trace, bucket: int) -> dict[int, tuple[int, float]]:
    """Depth bucket (of a verify step's last committed position) -> (verify steps with drafts,
    mean tokens per such step)."""
    steps: dict[int, list[int]] = {}
    for s in trace:
        for r in s.requests:
            if not r.is_prefill and r.num_draft:
                steps.setdefault(r.positions[0] // bucket, []).append(r.emit_count)
    return {b: (len(v), sum(v) / len(v)) for b, v in sorted(steps.items())}


def level_difference(levels: dict[int, tuple[int, float]], bucket: int) -> Difference | None:
    """Each bucket's mean tokens per verify step within BAND standard errors of TAU."""
    mean, variance = tokens_per_step_moments(acceptance_for_tau(TAU, K), K)
    for b, (n, got) in levels.items():
        half = BAND * math.sqrt(variance / n)
        if abs(got - mean) > half:
            return Difference("tokens per verify step in a depth bucket", -1, -1, b * bucket,
                              f"{mean:.2f} +- {half:.2f} ({n} steps)", round(got, 3))
    return None


def step_growth_difference(ms_by_depth: dict[int, float], kv_ms_by_depth: dict[int, float]) -> Difference | None:
    """Each depth's plain step over the shallowest one's grows by at most STEP_GROWTH_FACTOR times
    the time its added keys and values take to read (kv_ms_by_depth: the KV read alone, in ms)."""
    base = min(ms_by_depth)
    for depth, ms in sorted(ms_by_depth.items()):
        allowed = STEP_GROWTH_FACTOR * (kv_ms_by_depth[depth] - kv_ms_by_depth[base])
        if ms - ms_by_depth[base] > allowed:
            return Difference("plain step growth over the shallowest depth (ms)", -1, -1, depth,
                              f"<= {allowed:.4f}", round(ms - ms_by_depth[base], 4))
    return None


def _prompts(plan: DepthPlan) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(bench_prompts(1, n, seed=i)[0]) for i, n in enumerate(plan.prompt_lens))


def _engine(plan: DepthPlan, device: str) -> dict:
    # The eager arm unless a run asks for the graph arm (CUDA's default): capturing every context
    # bucket up to the deep context costs start-up, and one run below judges the graph arm.
    return dict(max_model_len=plan.max_model_len, max_num_batched_tokens=plan.max_model_len,
                max_num_seqs=2 if plan.name != "cuda" else len(plan.prompt_lens), device=device, graph=False)


def _params(plan: DepthPlan, extra: int = 0) -> list[SamplingParams]:
    return [SamplingParams(temperature=0, max_tokens=m + extra, ignore_eos=True) for m in plan.max_tokens]


def test_spec_tokens_and_acceptance_hold_at_every_depth(gate_record, plan, deep_dir, gate_device):
    prompts, engine = _prompts(plan), _engine(plan, gate_device)
    gate_record.model(deep_dir, plan.shape)
    gate_record.case(plan=plan.name, folder=plan.shape, prompt_lens=list(plan.prompt_lens),
                     max_tokens=list(plan.max_tokens), bucket=plan.bucket, k=K, tau=TAU, runner="async")
    # The plain run gives the tokens to match and the oracle's script (k more: the last step's drafts).
    plain = LLM(deep_dir, **engine).generate([list(p) for p in prompts], _params(plan, extra=K))
    script = OracleScript.from_outputs(plain, TAU, str(deep_dir))
    llm = LLM(deep_dir, spec="oracle", proposer=oracle_proposer(script), num_spec_tokens=K, async_runner=True,
              trace=True, **engine)
    outputs = llm.generate([list(p) for p in prompts], _params(plan))
    run = Run(Workload(prompts, plan.max_tokens), engine, llm.is_async, outputs, llm.trace)
    for out, want, m in zip(outputs, plain, plan.max_tokens):
        if out.token_ids != want.token_ids[:m]:
            i = next(j for j, (a, b) in enumerate(zip(out.token_ids, want.token_ids)) if a != b)
            gate_record.check(Difference("output token (spec vs plain)", -1, out.request_id,
                                         len(out.prompt_token_ids) + i, want.token_ids[i], out.token_ids[i]))
    levels = bucket_levels(run.trace, plan.bucket)
    ngram = LLM(deep_dir, spec="ngram", num_spec_tokens=K, async_runner=True, trace=True, **engine)
    ngram_out = ngram.generate([list(p) for p in prompts], _params(plan))
    ngram_levels = bucket_levels(ngram.trace, plan.bucket)
    gate_record.measure(tau_asked=TAU, deepest_position=plan.deepest, tokens_per_step_by_depth={
        b * plan.bucket: {"verify_steps": n, "tau": round(m, 3)} for b, (n, m) in levels.items()},
        ngram_tokens_per_step_by_depth={b * plan.bucket: {"verify_steps": n, "tau": round(m, 3)}
                                        for b, (n, m) in ngram_levels.items()})
    gate_record.check(level_difference(levels, plan.bucket), "oracle acceptance by depth")
    # The ngram drafter is lossless too: its tokens are the plain run's at every depth.
    for out, want, m in zip(ngram_out, plain, plan.max_tokens):
        if out.token_ids != want.token_ids[:m]:
            i = next(j for j, (a, b) in enumerate(zip(out.token_ids, want.token_ids)) if a != b)
            gate_record.check(Difference("output token (ngram spec vs plain)", -1, out.request_id,
                                         len(out.prompt_token_ids) + i, want.token_ids[i], out.token_ids[i]))
    gate_record.occurred("async runner", llm.is_async and ngram.is_async)
    gate_record.occurred("spec tokens equal plain at every depth",
                         all(o.token_ids == p.token_ids[:m] for o, p, m in zip(outputs, plain, plan.max_tokens)))
    gate_record.occurred("acceptance at the requested level in every bucket",
                         level_difference(levels, plan.bucket) is None)
    gate_record.occurred("verify steps in every depth bucket", set(levels) == set(range(plan.num_buckets)))
    gate_record.occurred("ngram acceptance per bucket reported", bool(ngram_levels))


def test_plain_step_time_grows_no_faster_than_its_kv_read(gate_record, plan, deep_dir, gate_device):
    """On CUDA only: times on the CPU are not the GPU's, and the gates take none there."""
    if not gate_device.startswith("cuda"):
        pytest.skip("step time by depth is judged on CUDA only (absolute times come from the GPU)")
    cfg = ModelConfig.from_dir(deep_dir)
    gate_record.model(deep_dir, plan.shape)
    gate_record.case(plan=plan.name, depths=list(plan.prompt_lens), decode_tokens=STEP_DECODE_TOKENS)
    llm = LLM(deep_dir, **(_engine(plan, gate_device) | {"graph": True}))  # the graph arm: a GPU user's decode step
    bandwidth = copy_bandwidth(gate_device, mib=1024)
    dtype_bytes = torch.tensor([], dtype=getattr(torch, cfg.default_engine_dtype)).element_size()
    ms, kv_ms = {}, {}
    for depth, prompt in zip(plan.prompt_lens, _prompts(plan)):
        time_decode(llm, [list(prompt)], STEP_DECODE_TOKENS)  # warm-up: this depth's kernels and buckets
        ms[depth] = time_decode(llm, [list(prompt)], STEP_DECODE_TOKENS).ms_per_step
        step = plain_step_bytes(cfg, dtype_bytes, 1, depth + STEP_DECODE_TOKENS / 2)
        kv_ms[depth] = step.kv / bandwidth * 1e3
    floors = {d: round(floor_ms(plain_step_bytes(cfg, dtype_bytes, 1, d + STEP_DECODE_TOKENS / 2), bandwidth), 4)
              for d in ms}
    gate_record.measure(bandwidth_bytes_per_s=round(bandwidth), ms_per_plain_step_by_depth=ms, hbm_floor_ms=floors,
                        kv_read_ms_by_depth={d: round(v, 4) for d, v in kv_ms.items()},
                        growth_factor_allowed=STEP_GROWTH_FACTOR)
    assert len(ms) >= 3, "step time measured at fewer than 3 depths"
    gate_record.check(step_growth_difference(ms, kv_ms), "plain step time by depth")
