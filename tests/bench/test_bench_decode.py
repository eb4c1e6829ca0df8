"""The decode benchmark (engine/bench/decode.py) on a stand-in clock and stand-in engines, so every
figure is a known answer: the copy bandwidth, one timed decode window, the median over legs,
the report of every arm, and the floor's bytes and milliseconds. (The timer on the real engine:
tests/bench/test_bench_1b.py.)"""
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

import engine
from engine.bench import decode as bench_decode
from engine.bench.decode import (
    DecodeLeg,
    StepBytes,
    copy_bandwidth,
    decode_report,
    floor_ms,
    measure_decode,
    time_decode,
)
from engine.bench.models import SHAPES, bench_prompts, config_dict
from engine.sampling import SamplingParams


class Clock:
    """perf_counter: each reading `tick` after the one before, plus what the engine's steps took."""

    def __init__(self, tick: float = 0.0):
        self.now, self.tick = 100.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


class StubRequest(SimpleNamespace):
    @property
    def is_finished(self) -> bool:
        return len(self.output_token_ids) >= self.params.max_tokens


class Engine:
    """A stand-in LLM: the requests added together prefill in the first step (or `prefills_per_step`
    of them a step, as long prompts do), then every step gives each started, unfinished one a
    token. The steps of the i-th batch of requests take step_seconds[i] each on the clock (the
    last entry for any later batch)."""

    def __init__(self, clock: Clock, step_seconds: list[float], *args, prefills_per_step: int | None = None,
                 **kwargs):
        self.clock, self.step_seconds, self.batch, self.reqs = clock, step_seconds, -1, []
        self.prefills_per_step = prefills_per_step
        self.args, self.kwargs = args, kwargs
        self.config = SimpleNamespace(device=kwargs.get("device", "cpu"))

    def add_request(self, prompt: list[int], params: SamplingParams):
        if not self.has_unfinished():
            self.batch += 1
        self.reqs.append(StubRequest(prompt=prompt, params=params, output_token_ids=[]))
        return self.reqs[-1]

    def has_unfinished(self) -> bool:
        return not all(r.is_finished for r in self.reqs)

    def step(self) -> None:
        self.clock.now += self.step_seconds[min(self.batch, len(self.step_seconds) - 1)]
        waiting = [r for r in self.reqs if not r.output_token_ids]
        starting = waiting[:self.prefills_per_step] if self.prefills_per_step else waiting
        for r in self.reqs:
            if not r.is_finished and (r.output_token_ids or r in starting):
                r.output_token_ids.append(1)


@pytest.fixture
def clock(monkeypatch):
    def install(tick: float = 0.0) -> Clock:
        c = Clock(tick)
        monkeypatch.setattr(bench_decode, "time", c)
        return c
    return install


def test_the_copy_bandwidth_is_read_plus_written_bytes_over_the_fastest_of_ten_copies(clock):
    """The i-th copy takes 2^-(i+1) s: the tenth, 2^-10 s, is the fastest of ten (an eleventh
    would be faster still). 1 MiB read and 1 MiB written in 2^-10 s: 2^31 bytes/s. On the meta
    device: the bytes are counted, never allocated."""
    c = clock()
    readings = iter(x for i in range(20) for x in (100.0 * i, 100.0 * i + 2.0 ** -(i + 1)))
    c.perf_counter = lambda: next(readings)
    assert copy_bandwidth("meta", 1) == 2.0 ** 31


def test_a_decode_window_times_the_steps_after_every_request_has_its_first_token(clock):
    """3 requests of 5 tokens: the prefill step gives each its first; the window holds the 4
    steps after it, 1.23456 ms each: 4.93824 ms for 4 tokens a request, 12 in all."""
    c = clock()
    llm = Engine(c, [0.00123456])
    prompts = [[1, 2], [3, 4], [5, 6]]
    assert time_decode(llm, prompts, max_tokens=5) == DecodeLeg(seconds=0.004938, decode_tokens=4, steps=4,
                                                                ms_per_step=1.2346, tokens_per_s=2430.02)
    greedy = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    assert [(r.prompt, r.params) for r in llm.reqs] == [(p, greedy) for p in prompts]
    assert llm.reqs[0].prompt is not prompts[0]  # the caller's prompts are left alone


def test_a_decode_window_of_staggered_prefills_ends_where_the_first_request_finishes(clock):
    """Long prompts prefill one a step: the 3 requests get their first token in steps 1 to 3.
    The window opens then, and closes when the first finishes (its 5th token, step 5): 2 steps
    in which every request decoded a token; the 2 steps left to drain are not timed."""
    c = clock()
    llm = Engine(c, [0.002], prefills_per_step=1)
    leg = time_decode(llm, [[1, 2], [3, 4], [5, 6]], max_tokens=5)
    assert leg == DecodeLeg(seconds=0.004, decode_tokens=2, steps=2, ms_per_step=2.0, tokens_per_s=1500.0)
    assert all(r.is_finished for r in llm.reqs)


def test_the_decode_figures_are_medians_over_the_legs_after_a_warm_up_pass(clock):
    """Per concurrency one warm-up window (1 s a step, not kept), then two legs: 1.23451 and
    1.23458 ms a step. The median of two is their mean, kept to four digits (two for tokens/s)."""
    c, said = clock(), []
    llm = Engine(c, [1.0, 0.00123451, 0.00123458, 1.0, 0.00123451, 0.00123458])
    out = measure_decode(lambda: llm, [[1, 2], [3, 4]], [1, 2], max_tokens=3, legs=2, progress=said.append)
    one = [DecodeLeg(0.002469, 2, 2, 1.2345, 810.04), DecodeLeg(0.002469, 2, 2, 1.2346, 809.99)]
    two = [DecodeLeg(0.002469, 2, 2, 1.2345, 1620.08), DecodeLeg(0.002469, 2, 2, 1.2346, 1619.98)]
    assert out == {"1": {"ms_per_step": 1.2346, "tokens_per_s": 810.01, "legs": [asdict(x) for x in one]},
                   "2": {"ms_per_step": 1.2346, "tokens_per_s": 1620.03, "legs": [asdict(x) for x in two]}}
    assert said == ["c=1: 1.2346 ms per step", "c=2: 1.2346 ms per step"]


@pytest.fixture
def built(monkeypatch, clock):
    """The engines decode_report builds: stand-ins taking 2^-8 s a step, on a clock whose every
    reading is 2^-10 s after the last (so each copy of the bandwidth test takes 2^-10 s)."""
    c, engines = clock(2.0 ** -10), []

    def make(*args, **kwargs):
        engines.append(Engine(c, [2.0 ** -8], *args, **kwargs))
        return engines[-1]
    monkeypatch.setattr(engine, "LLM", make)
    return engines


def model_folder(path, shape: str):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config_dict(SHAPES[shape])))
    return path


def test_the_decode_report_times_every_arm_of_every_backend_and_forward_against_the_floor(tmp_path, built):
    folder, said = model_folder(tmp_path / "tiny", "tiny"), []
    report = decode_report(folder, "meta", ["sync", "async"], "graph", [1, 2], 8, 6, 1, progress=said.append,
                           attention_backends=("sdpa", "flex"), compile_modes=(False, True))
    arms = [(compiled, backend, runner) for compiled in (False, True) for backend in ("sdpa", "flex")
            for runner in ("sync", "async")]
    names = [f"graph/{r}" + ("/flex" if b == "flex" else "") + ("/compiled" if c else "") for c, b, r in arms]
    assert names[:4] == ["graph/sync", "graph/async", "graph/sync/flex", "graph/async/flex"]
    # Each window: 5 steps of 2^-8 s after the prefill, and one clock reading more: 0.0205078125 s.
    leg = {"seconds": 0.020508, "decode_tokens": 5, "steps": 5, "ms_per_step": 4.1016}
    timed = {"1": {"ms_per_step": 4.1016, "tokens_per_s": 243.81, "legs": [leg | {"tokens_per_s": 243.81}]},
             "2": {"ms_per_step": 4.1016, "tokens_per_s": 487.62, "legs": [leg | {"tokens_per_s": 487.62}]}}
    # tiny: 2 layers of 36,992 weights, the final norm (64), the head (260 x 64) and the batch's
    # embedding rows (64 each), 2 bytes each; KV: 2 layers x K, V x 32 x 11 positions (8 + 6 / 2).
    floor = {c: {"bytes": w + kv, "weights_bytes": w, "kv_bytes": kv, "context_len": 11.0, "ms": ms}
             for c, w, kv, ms in (("1", 181504, 2816, 0.0013), ("2", 181632, 5632, 0.0014))}
    assert report == {"model": str(folder), "device": "meta", "dtype": "bfloat16",
                      "torch": torch.__version__, "gpu": None,
                      "workload": {"prompt_len": 8, "max_tokens": 6, "num_prompts": 2, "prompt_seed": 0, "legs": 1},
                      "bandwidth_bytes_per_s": 2 ** 37,  # 64 MiB read and written in 2^-10 s
                      "floor": floor, "arms": dict.fromkeys(names, timed)}
    assert said == [line for name in names for line in (name, "c=1: 4.1016 ms per step", "c=2: 4.1016 ms per step")]
    # One engine per arm, holding both concurrencies and every prompt's 8 + 6 tokens, and 16 more.
    assert [(e.args, e.kwargs) for e in built] == [
        ((folder,), {"device": "meta", "graph": True, "async_runner": runner == "async", "max_num_seqs": 2,
                     "max_model_len": 30, "max_num_batched_tokens": 2048, "attention_backend": backend,
                     "compile": compiled}) for compiled, backend, runner in arms]
    prompts = bench_prompts(2, 8)
    assert [r.prompt for r in built[0].reqs] == [prompts[0]] * 2 + prompts * 2  # warm-up and leg, per c


def test_a_long_decode_gets_a_step_budget_of_its_context_within_the_models_positions(tmp_path, built):
    """2,048 + 2,048 tokens and 16 more, within the 1B shape's 4,096 positions: a prefill never
    waits for a second step. The eager arm builds no graphs; the prompts are the seed's."""
    folder = model_folder(tmp_path / "1b", "llama-1b")
    report = decode_report(folder, "meta", ["sync"], "eager", [1], 2048, 2048, 1, seed=3)
    assert list(report["arms"]) == ["eager/sync"] and report["workload"]["prompt_seed"] == 3
    (llm,) = built
    assert {k: llm.kwargs[k] for k in ("graph", "max_model_len", "max_num_batched_tokens")} == {
        "graph": False, "max_model_len": 4096, "max_num_batched_tokens": 4096}
    assert llm.reqs[0].prompt == bench_prompts(1, 2048, seed=3)[0]


def test_the_floor_is_the_steps_bytes_over_the_bandwidth_in_milliseconds():
    step = StepBytes(weights=3 * 2 ** 30, kv=2 ** 30, batch=4, context_len=10.5)
    assert step.total == 2 ** 32 and floor_ms(step, 2.0 ** 42) == 1e3 / 2 ** 10


def test_the_step_bytes_name_their_batch_and_context():
    cfg = engine.config.ModelConfig.from_dict(config_dict(SHAPES["tiny"]))
    assert bench_decode.plain_step_bytes(cfg, 2, batch=3, context_len=10.5) == StepBytes(
        weights=2 * (2 * 36992 + 64 + 260 * 64 + 3 * 64), kv=round(3 * 10.5 * 2 * 2 * 32 * 2),
        batch=3, context_len=10.5)


def test_a_named_gpu_is_the_one_synchronized(monkeypatch):
    """On cuda:N the copy is timed between waits on GPU N; the host devices have nothing to wait for."""
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    for device in ("cpu", "meta", "cuda:1"):
        bench_decode.synchronize(device)
    assert synced == ["cuda:1"]


def test_the_decode_report_on_a_named_gpu_copies_a_gibibyte_and_names_that_gpu(tmp_path, monkeypatch):
    """On a GPU the bandwidth comes from a copy of at least 1 GiB, where launch overhead is small,
    and the report names GPU N for cuda:N, not the current one (they differ on a mixed host)."""
    copied_mib = []
    monkeypatch.setattr(bench_decode, "copy_bandwidth",
                        lambda device, mib: copied_mib.append((device, mib)) or 2.0 ** 40)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"the GPU at {device}")
    report = decode_report(model_folder(tmp_path / "tiny", "tiny"), "cuda:1", [], "eager", [1], 8, 6, 1)
    (device, mib), = copied_mib
    assert device == "cuda:1" and mib >= 1024
    assert report["gpu"] == "the GPU at cuda:1" and report["bandwidth_bytes_per_s"] == 2 ** 40
