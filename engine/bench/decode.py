"""Milliseconds per plain decode step, and the floor they are judged against.

A plain decode step reads every weight once (the embedding table only at the batch's rows) and
each request's keys and values up to its position. On a GPU that cannot go faster than those
bytes over the device's memory bandwidth: the HBM floor. The bandwidth is measured here as a
device-to-device copy (bytes read plus bytes written, per second), the rate a step's streaming
reads can reach.

The step time is measured on equal-length token-id prompts, all added at once, greedy and
without EOS: the requests prefill, then the decode window is timed from the first step after
every request has its first token to the step where the first of them finishes, and divided by
the tokens each request decoded in it (long prompts prefill one or a few a step, so the
requests start, and finish, a few steps apart; in the window every one decodes in every
step). A warm-up pass (allocation, graph capture) precedes the timed legs; the median is kept.
With the async runner the first decode step is already launched when the window opens (it is
how that runner learns the prefill's token), so its window is short by part of one step in
max_tokens - 1: under 1% at the default 128 tokens.
"""
import itertools
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from engine.config import ModelConfig
from engine.sampling import SamplingParams


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def copy_bandwidth(device: str, mib: int, iters: int = 10) -> float:
    """Bytes per second of a `mib`-MiB device-to-device copy, reads plus writes; best of `iters`."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    best = float("inf")
    for _ in range(iters):
        synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


@dataclass(frozen=True)
class StepBytes:
    weights: int     # every parameter once; the embedding table only at the batch's rows
    kv: int          # keys and values of every request up to its position, every layer
    batch: int
    context_len: float

    @property
    def total(self) -> int:
        return self.weights + self.kv


def plain_step_bytes(cfg: ModelConfig, dtype_bytes: int, batch: int, context_len: float) -> StepBytes:
    """Bytes a plain decode step of `batch` requests must read, at a mean context of `context_len`
    tokens (the KV writes of the new token and the activations are left out: they are small)."""
    h, d = cfg.hidden_size, cfg.dim_per_head
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size + 2 * h
    # the layers, the final norm, the head (whole), and the batch's rows of the embedding table
    # (a tied head is that table, already read whole)
    params = cfg.num_hidden_layers * per_layer + h + cfg.vocab_size * h + (0 if cfg.tie_word_embeddings else batch * h)
    kv_bytes = round(batch * context_len * cfg.num_hidden_layers * 2 * kv * dtype_bytes)
    return StepBytes(params * dtype_bytes, kv_bytes, batch, context_len)


def floor_ms(step_bytes: StepBytes, bandwidth: float) -> float:
    """The HBM floor of one step: its bytes over the measured bandwidth, in milliseconds."""
    return step_bytes.total / bandwidth * 1e3


def mean_context(prompt_len: int, max_tokens: int) -> float:
    """The mean position a decode step attends to over the window: the prompt, then one more
    token per step for max_tokens - 1 decode steps (the first token comes from the prefill)."""
    return prompt_len + max_tokens / 2


@dataclass
class DecodeLeg:
    seconds: float
    decode_tokens: int        # tokens each request decoded inside the window
    steps: int                # LLM.step calls inside the window
    ms_per_step: float
    tokens_per_s: float


def time_decode(llm, prompts: list[list[int]], max_tokens: int) -> DecodeLeg:
    """One timed decode window over `prompts` (see the module docstring)."""
    device = llm.config.device
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    reqs = [llm.add_request(list(p), params) for p in prompts]
    while not all(r.output_token_ids for r in reqs):
        llm.step()
    start = [len(r.output_token_ids) for r in reqs]
    synchronize(device)
    t0, steps = time.perf_counter(), 0
    while not any(r.is_finished for r in reqs):
        llm.step()
        steps += 1
    synchronize(device)
    seconds = time.perf_counter() - t0
    decoded = [len(r.output_token_ids) - s for r, s in zip(reqs, start)]
    while llm.has_unfinished():  # the rest, untimed
        llm.step()
    assert len(set(decoded)) == 1, f"the requests decoded different counts in the window: {decoded}"
    return DecodeLeg(round(seconds, 6), decoded[0], steps, round(seconds * 1e3 / decoded[0], 4),
                     round(sum(decoded) / seconds, 2))


def measure_decode(make_llm, prompts: list[list[int]], concurrencies: list[int], max_tokens: int,
                   legs: int, progress=None) -> dict:
    """{concurrency: {"ms_per_step": median, "tokens_per_s": median, "legs": [...]}} on one LLM
    (`make_llm()`, max_num_seqs at least max(concurrencies)); the first pass at each concurrency
    is warm-up and not kept."""
    llm = make_llm()
    out = {}
    for c in concurrencies:
        time_decode(llm, prompts[:c], max_tokens)  # warm-up: allocations, graph capture
        kept = [time_decode(llm, prompts[:c], max_tokens) for _ in range(legs)]
        out[str(c)] = {"ms_per_step": round(statistics.median(leg.ms_per_step for leg in kept), 4),
                       "tokens_per_s": round(statistics.median(leg.tokens_per_s for leg in kept), 2),
                       "legs": [asdict(leg) for leg in kept]}
        if progress is not None:
            progress(f"c={c}: {out[str(c)]['ms_per_step']} ms per step")
    return out


def decode_report(model_dir, device: str, runners: list[str], arm: str, concurrencies: list[int],
                  prompt_len: int, max_tokens: int, legs: int, seed: int = 0,
                  progress=None, attention_backends: tuple[str, ...] = ("sdpa",),
                  compile_modes: tuple[bool, ...] = (False,)) -> dict:
    """The bandwidth, the floor per concurrency, and ms per plain decode step per runner, attention
    backend and forward (arm keys "graph/async", "graph/async/flex", "graph/async/compiled"...):
    what `specgate bench-model decode` writes (engine/bench/summary.py reads it)."""
    from engine import LLM
    from engine.bench.models import bench_prompts
    cfg = ModelConfig.from_dir(model_dir)
    prompts = bench_prompts(max(concurrencies), prompt_len, seed)
    bandwidth = copy_bandwidth(device, mib=1024 if device.startswith("cuda") else 64)
    dtype = cfg.default_engine_dtype
    floor = {}
    for c in concurrencies:
        step = plain_step_bytes(cfg, torch.tensor([], dtype=getattr(torch, dtype)).element_size(), c,
                                mean_context(prompt_len, max_tokens))
        floor[str(c)] = {"bytes": step.total, "weights_bytes": step.weights, "kv_bytes": step.kv,
                         "context_len": step.context_len, "ms": round(floor_ms(step, bandwidth), 4)}
    report = {"model": str(model_dir), "device": device, "dtype": dtype, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
              "workload": {"prompt_len": prompt_len, "max_tokens": max_tokens, "num_prompts": max(concurrencies),
                           "prompt_seed": seed, "legs": legs},
              "bandwidth_bytes_per_s": round(bandwidth), "floor": floor, "arms": {}}
    max_model_len = min(cfg.max_position_embeddings, prompt_len + max_tokens + 16)
    for compiled, backend, runner in itertools.product(compile_modes, attention_backends, runners):
        def make_llm():
            return LLM(model_dir, device=device, graph=arm == "graph", async_runner=runner == "async",
                       max_num_seqs=max(concurrencies), max_model_len=max_model_len,
                       max_num_batched_tokens=max(2048, max_model_len), attention_backend=backend, compile=compiled)
        name = f"{arm}/{runner}" + ("" if backend == "sdpa" else f"/{backend}") + ("/compiled" if compiled else "")
        if progress is not None:
            progress(name)
        report["arms"][name] = measure_decode(make_llm, prompts, concurrencies, max_tokens, legs, progress)
    return report
