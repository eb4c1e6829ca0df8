"""Gate depth: nothing that should not depend on how deep a request is in its context does.

Requests at depths from the start of the context to 4,096 positions, on a small random-weight
*decisive* folder with 8,192 positions (engine/bench/models.py's "tiny-deep", written at test
time): the async runner's speculative tokens equal the plain run's at every depth, and with the
oracle drafter (engine/bench/oracle.py), asked for a mean acceptance length tau, the tokens per
verify step in each depth bucket stay at tau. Acceptance that dies past a position while the
target stays coherent (reported past 32,768 positions on a public engine) is invisible to token
equality: only the per-bucket level sees it. The oracle's coins are a hash of (request, position),
so each bucket's level is deterministic; the band is a few standard errors of tau wide, and a
collapse to one token per step is far outside it.

On the CPU the deepest prefill is 4,032 tokens: attention there is dense (engine/attention.py's
sdpa path), so a deeper prefill costs more memory and seconds than the gate's budget. The 1B
shape past 32,768 positions is a CUDA run and is not in this gate.
"""
import math

import pytest

from engine import LLM, SamplingParams
from engine.bench.models import bench_prompts, write_bench_model
from engine.bench.oracle import OracleScript, acceptance_for_tau, oracle_proposer, tokens_per_step_moments
from gates.compare import Difference
from gates.workloads import Run, Workload

BUCKET = 1024                              # positions per depth bucket
PROMPT_LENS = (16, 1040, 2064, 3088, 4032)  # one request starting in each bucket (the last fills bucket 3)
MAX_TOKENS = 40
K, TAU = 4, 4.2                            # the oracle's drafts per step and requested tokens per step
BAND = 4.0                                 # standard errors of the mean allowed around TAU per bucket
MAX_MODEL_LEN = 4096 + 64
CLAIMS = ("async runner", "spec tokens equal plain at every depth", "acceptance at the requested level in every bucket",
          *(f"verify steps at depth {b * BUCKET}-{(b + 1) * BUCKET}" for b in range(len(PROMPT_LENS) - 1)))


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    return write_bench_model("tiny-deep", seed=0, folder=tmp_path_factory.mktemp("depth") / "tiny-deep")


def bucket_levels(trace) -> dict[int, tuple[int, float]]:
    """Depth bucket (of a verify step's last committed position) -> (verify steps with drafts,
    mean tokens per such step)."""
    steps: dict[int, list[int]] = {}
    for s in trace:
        for r in s.requests:
            if not r.is_prefill and r.num_draft:
                steps.setdefault(r.positions[0] // BUCKET, []).append(r.emit_count)
    return {b: (len(v), sum(v) / len(v)) for b, v in sorted(steps.items())}


def level_difference(levels: dict[int, tuple[int, float]]) -> Difference | None:
    """Each bucket's mean tokens per verify step within BAND standard errors of TAU."""
    mean, variance = tokens_per_step_moments(acceptance_for_tau(TAU, K), K)
    for b, (n, got) in levels.items():
        half = BAND * math.sqrt(variance / n)
        if abs(got - mean) > half:
            return Difference("tokens per verify step in a depth bucket", -1, -1, b * BUCKET,
                              f"{mean:.2f} +- {half:.2f} ({n} steps)", round(got, 3))
    return None


def test_spec_tokens_and_acceptance_hold_at_every_depth(gate_record, deep_dir, gate_device):
    prompts = tuple(tuple(bench_prompts(1, n, seed=i)[0]) for i, n in enumerate(PROMPT_LENS))
    engine = dict(max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=MAX_MODEL_LEN, max_num_seqs=2,
                  device=gate_device)
    gate_record.case(folder="tiny-deep", prompt_lens=list(PROMPT_LENS), k=K, tau=TAU, runner="async")
    # The plain run gives the tokens to match and the oracle's script (k more: the last step's drafts).
    plain = LLM(deep_dir, **engine).generate([list(p) for p in prompts],
                                             SamplingParams(temperature=0, max_tokens=MAX_TOKENS + K, ignore_eos=True))
    script = OracleScript.from_outputs(plain, TAU, str(deep_dir))
    llm = LLM(deep_dir, spec="oracle", proposer=oracle_proposer(script), num_spec_tokens=K, async_runner=True,
              trace=True, **engine)
    outputs = llm.generate([list(p) for p in prompts], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                                       ignore_eos=True))
    run = Run(Workload(prompts, (MAX_TOKENS,) * len(prompts)), engine, llm.is_async, outputs, llm.trace)
    for out, want in zip(outputs, plain):
        if out.token_ids != want.token_ids[:MAX_TOKENS]:
            i = next(j for j, (a, b) in enumerate(zip(out.token_ids, want.token_ids)) if a != b)
            gate_record.check(Difference("output token (spec vs plain)", -1, out.request_id,
                                         len(out.prompt_token_ids) + i, want.token_ids[i], out.token_ids[i]))
    levels = bucket_levels(run.trace)
    gate_record.measure(tau_asked=TAU, tokens_per_step_by_depth={b * BUCKET: {"verify_steps": n, "tau": round(m, 3)}
                                                                 for b, (n, m) in levels.items()})
    gate_record.check(level_difference(levels), "oracle acceptance by depth")
    gate_record.occurred("async runner", llm.is_async)
    gate_record.occurred("spec tokens equal plain at every depth",
                         all(o.token_ids == p.token_ids[:MAX_TOKENS] for o, p in zip(outputs, plain)))
    gate_record.occurred("acceptance at the requested level in every bucket", level_difference(levels) is None)
    for b in levels:
        gate_record.occurred(f"verify steps at depth {b * BUCKET}-{(b + 1) * BUCKET}")
