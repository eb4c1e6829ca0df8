"""`specgate bench` legs: what one leg runs and records (run_leg), which legs are warm (is_warm),
and the per-concurrency summary over the warm legs (fold).

run_leg is driven through a recording stand-in for LLM.generate and a fake clock, so every
field of the Leg is exact; one small leg on the fixture model checks the real engine end to end."""
from types import SimpleNamespace

import pytest

from engine.bench import legs as bench
from engine.bench.legs import Leg, fold, is_warm, run_leg
from engine.bench.metrics import Acceptance, StepPhases
from engine.bench.workload import Workload
from engine.clock import NullClock
from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.sampling import SamplingParams


class FakeClock:
    """time.time() is the wall start; LLM.generate advances perf_counter by `elapsed`."""

    def __init__(self, wall: float, perf: float):
        self.wall, self.perf = wall, perf

    def time(self) -> float:
        return self.wall

    def perf_counter(self) -> float:
        return self.perf


class RecordingLLM:
    def __init__(self, clock: FakeClock, elapsed: float, outputs: list[RequestOutput]):
        self.time, self.elapsed, self.outputs, self.calls = clock, elapsed, outputs, []
        self.config = SimpleNamespace(spec="ngram")
        self.runner = SimpleNamespace(is_cuda=False)
        self.clock = NullClock()  # where the bench hands its step clock

    def generate(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        self.time.perf += self.elapsed
        return self.outputs


def output(i: int, prompt_len: int, completion: int, stats: RequestStats) -> RequestOutput:
    return RequestOutput(i, None, list(range(prompt_len)), list(range(completion)), "", "length", stats)


OUTPUTS = [
    output(0, 7, 6, RequestStats(num_drafts=3, num_draft_tokens=7, num_accepted_tokens=3, verify_steps=4,
                                 accepted_per_position=[2, 1])),
    output(1, 4, 6, RequestStats(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=2, verify_steps=3,
                                 accepted_per_position=[1, 1, 0])),
]
ACCEPTANCE = {"num_requests": 2, "completion_tokens": 12, "verify_steps": 7, "num_drafts": 5,
              "num_draft_tokens": 11, "num_accepted_tokens": 5, "accepted_per_position": [3, 2, 0],
              "mean_acceptance_length": 2.0, "acceptance_rate": 0.4545, "accept_length": 1.7143}


@pytest.fixture
def leg_run(monkeypatch):
    clock = FakeClock(wall=1000.0, perf=50.0)
    monkeypatch.setattr(bench, "time", clock)
    llm = RecordingLLM(clock, elapsed=0.712345, outputs=OUTPUTS)
    return llm


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
def test_a_leg_runs_the_whole_workload_once_seeded_by_its_index(leg_run, temperature):
    """Every prompt, exactly max_tokens each (EOS ignored, so legs compare), at the workload's
    temperature; the leg index seeds the requests, so a sampled leg is reproducible."""
    workload = Workload.uniform(["a", "b"], max_tokens=6, temperature=temperature)
    run_leg(leg_run, workload, concurrency=4, index=3, warmup_legs=1)
    one = SamplingParams(temperature=temperature, max_tokens=6, seed=3, ignore_eos=True)
    assert leg_run.calls == [((["a", "b"], [one, one]), {"arrival_steps": [0, 0]})]


def test_a_leg_records_tokens_time_rate_and_acceptance(leg_run):
    leg = run_leg(leg_run, Workload.uniform(["a", "b"], 6, 0.0), concurrency=4, index=2, warmup_legs=1)
    assert leg == Leg(concurrency=4, index=2, prompt_tokens=11, completion_tokens=12, start=1000.0,
                      end=pytest.approx(1000.712345), seconds=0.7123, tokens_per_s=16.85,
                      acceptance=ACCEPTANCE, warm=True, spec="ngram", tokens_sha=bench.tokens_sha(OUTPUTS),
                      phases=StepPhases(cuda=False).as_dict())  # the stand-in ran no engine step


def test_the_tokens_digest_tells_outputs_apart():
    one, other = [output(0, 3, 4, RequestStats())], [output(0, 3, 4, RequestStats())]
    other[0].token_ids[2] = 99
    assert bench.tokens_sha(one) == bench.tokens_sha([output(0, 3, 4, RequestStats())]) != bench.tokens_sha(other)
    assert bench.tokens_sha(one + other) != bench.tokens_sha(other + one)  # request order counts
    # sha256 of "[[0, 1], [0]]", its first 16 hex digits
    assert bench.tokens_sha([output(0, 3, 2, RequestStats()), output(1, 3, 1, RequestStats())]) == "52fd94c3240753a4"


@pytest.mark.parametrize("index, warmup_legs, warm", [
    (0, 1, False), (1, 1, True), (2, 1, True), (0, 0, True), (1, 2, False), (2, 2, True)])
def test_the_first_warmup_legs_are_cold(leg_run, index, warmup_legs, warm):
    assert is_warm(index, warmup_legs) is warm
    assert run_leg(leg_run, Workload.uniform(["a"], 6, 0.0), 1, index, warmup_legs).warm is warm


def leg(concurrency: int, index: int, rate: float, warm: bool, accepted: int, per_position: list[int]) -> Leg:
    acc = {**Acceptance(num_requests=1, completion_tokens=10, verify_steps=5, num_drafts=4,
                        num_draft_tokens=8, num_accepted_tokens=accepted,
                        accepted_per_position=per_position).as_dict(), "unknown_field": 1}
    return Leg(concurrency, index, 3, 10, 0.0, 1.0, 1.0, rate, acc, warm)


def test_fold_summarises_only_the_warm_legs_of_each_concurrency():
    legs = [leg(1, 0, 99.0, False, 4, [4]),
            leg(1, 1, 10.456, True, 2, [1, 1]),
            leg(1, 2, 13.3333, True, 3, [2, 1, 0]),
            leg(1, 3, 12.0, True, 1, [1]),
            leg(2, 0, 50.0, False, 0, []),
            leg(2, 1, 20.0, False, 0, [])]
    merged = Acceptance(num_requests=3, completion_tokens=30, verify_steps=15, num_drafts=12,
                        num_draft_tokens=24, num_accepted_tokens=6, accepted_per_position=[4, 2, 0])
    no_phases = bench.fold_phases([])  # these legs carry none
    assert fold(legs) == {
        "1": {"legs": [1, 2, 3], "tokens_per_s_mean": 11.93, "tokens_per_s_min": 10.46,
              "tokens_per_s_max": 13.33, "acceptance": merged.as_dict(), "phases": no_phases},
        "2": {"legs": [], "tokens_per_s_mean": None, "tokens_per_s_min": None, "tokens_per_s_max": None,
              "acceptance": Acceptance().as_dict(), "phases": no_phases},
    }
    assert no_phases["steps"] == 0 and no_phases["gpu_ms_per_step"] is None
    assert merged.as_dict()["mean_acceptance_length"] == 1.5


def test_fold_rounds_the_mean_to_two_decimals():
    legs = [leg(4, i, rate, True, 0, []) for i, rate in enumerate([1.0, 2.0, 2.0])]
    summary = fold(legs)["4"]
    assert (summary["tokens_per_s_mean"], summary["tokens_per_s_min"], summary["tokens_per_s_max"]) == (1.67, 1.0, 2.0)


def test_a_real_leg_on_the_fixture_model(make_llm):
    """One small sampled ngram leg: the counts the Leg reports are the engine's own outputs, and
    its host phases cover every step it launched; after the leg the phase clock is off again."""
    llm = make_llm(spec="ngram", num_spec_tokens=2, max_num_seqs=2, max_model_len=64, trace=True)
    workload = Workload.uniform(["x = 1\nx = 1\n", "def f("], max_tokens=5, temperature=0.8)
    got = run_leg(llm, workload, concurrency=2, index=1, warmup_legs=1)
    outs = llm.generate(workload.prompt_list(), SamplingParams(temperature=0.8, max_tokens=5, seed=1, ignore_eos=True))
    acc = Acceptance()
    for o in outs:
        acc.add(o.stats, len(o.token_ids))
    assert (got.concurrency, got.index, got.warm) == (2, 1, True)
    assert got.prompt_tokens == sum(len(o.prompt_token_ids) for o in outs)
    assert got.completion_tokens == 10
    assert got.acceptance == acc.as_dict()
    assert got.seconds > 0 and got.end >= got.start and got.tokens_per_s > 0
    assert got.spec == "ngram" and got.tokens_sha == bench.tokens_sha(outs)  # same seed, same tokens
    phases = got.phases
    assert phases["steps"] == len(llm.trace) // 2 and phases["steps"] >= 3  # the leg's half of the trace
    assert all(phases["host_seconds"][p] > 0 for p in ("plan", "upload", "launch", "completion"))
    assert 0 < phases["host_seconds"]["completion_wait"] <= phases["host_seconds"]["completion"]
    assert phases["gpu_ms_per_step"] is None and "CPU" in phases["clock"]
    assert isinstance(llm.clock, NullClock)


def phases(steps: int, plan: float, upload: float, launch: float, completion: float, wait: float,
           gpu_ms: float = 0.0, gpu_steps: int = 0, graph_gpu_ms: float = 0.0, graph_steps: int = 0) -> dict:
    return {"steps": steps, "clock": "host perf_counter", "gpu_ms": gpu_ms, "gpu_steps": gpu_steps,
            "graph_gpu_ms": graph_gpu_ms, "graph_steps": graph_steps,
            "host_seconds": {"plan": plan, "upload": upload, "launch": launch, "completion": completion,
                             "completion_wait": wait}}


def test_fold_phases_weighs_each_step_once():
    """Summed times over summed steps: 4 + 6 steps, so the 6-step leg weighs 0.6."""
    folded = bench.fold_phases([phases(4, 0.004, 0.008, 0.012, 0.016, 0.008, gpu_ms=10.0, gpu_steps=4),
                                phases(6, 0.006, 0.002, 0.018, 0.004, 0.001, gpu_ms=30.0, gpu_steps=6)])
    assert folded["steps"] == 10
    assert folded["host_ms_per_step"] == {"plan": 1.0, "upload": 1.0, "launch": 3.0, "completion": 2.0,
                                          "completion_wait": 0.9, "total": 7.0}
    assert folded["gpu_ms_per_step"] == 4.0 and folded["host_over_gpu"] == 1.75
    assert folded["graph_gpu_ms_per_step"] is None  # no step replayed as a graph


def test_fold_phases_gives_the_graph_replays_gpu_time_apart():
    """Two legs of a graph arm, each with one eager prefill of 12 ms among replays of 1 to 2 ms:
    every step's mean counts the prefills (40 ms over 10 steps), the replays' leaves them out
    (16 ms over 8 replays), each summed over the legs."""
    folded = bench.fold_phases([phases(4, 0.004, 0.008, 0.012, 0.016, 0.008, gpu_ms=15.0, gpu_steps=4,
                                       graph_gpu_ms=3.0, graph_steps=3),
                                phases(6, 0.006, 0.002, 0.018, 0.004, 0.001, gpu_ms=25.0, gpu_steps=6,
                                       graph_gpu_ms=13.0, graph_steps=5)])
    assert (folded["gpu_ms_per_step"], folded["graph_gpu_ms_per_step"]) == (4.0, 2.0)


def test_fold_phases_gives_gpu_ms_to_four_digits_and_host_over_gpu_to_three():
    """7 ms of GPU time over 3 steps: 2.3333 ms a step; 4 ms of host time: 1.3333 ms a step,
    0.571 of the (rounded) GPU time."""
    folded = bench.fold_phases([phases(3, 0.001, 0.001, 0.001, 0.001, 0.0005, gpu_ms=7.0, gpu_steps=3)])
    assert folded == {"steps": 3, "clock": "host perf_counter", "gpu_ms_per_step": 2.3333, "host_over_gpu": 0.571,
                      "graph_gpu_ms_per_step": None,
                      "host_ms_per_step": {"plan": 0.3333, "upload": 0.3333, "launch": 0.3333, "completion": 0.3333,
                                           "completion_wait": 0.1667, "total": 1.3333}}


def test_fold_adds_phases_only_from_warm_legs():
    cold, warm = leg(1, 0, 5.0, False, 0, []), leg(1, 1, 5.0, True, 0, [])
    cold.phases, warm.phases = phases(2, 1.0, 1.0, 1.0, 1.0, 0.5), phases(5, 0.005, 0.005, 0.005, 0.005, 0.001)
    got = fold([cold, warm])["1"]["phases"]
    assert got["steps"] == 5 and got["host_ms_per_step"]["total"] == 4.0 and got["gpu_ms_per_step"] is None


def test_the_phase_clock_adds_each_interval_to_its_phase(monkeypatch):
    from engine.bench import metrics
    ticks = iter([10.0, 10.5, 11.0, 13.0, 20.0, 20.25])
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(ticks))
    clock = metrics.StepPhases(cuda=False)
    clock.start()              # 10.0
    clock.mark("plan")         # 10.5
    clock.mark("upload")       # 11.0
    clock.launched()           # 13.0
    clock.add_completion(19.0, 19.5, None, replayed=False)   # ends at 20.0
    assert clock.seconds == {"plan": 0.5, "upload": 0.5, "launch": 2.0, "completion": 1.0}
    assert clock.completion_wait == 0.5 and clock.steps == 1
    d = clock.as_dict()
    assert d["host_ms_per_step"]["total"] == 4000.0 and d["gpu_ms_per_step"] is None
