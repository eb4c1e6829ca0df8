"""The bench's phase clock (engine/bench/metrics.py StepPhases): host time per step by phase and, on
CUDA, the GPU time between two timing events per step, as the report shows them. Driven by a
stand-in perf_counter ticking in 1/1024 s (so every sum is exact) and stand-in CUDA events that
keep CUDA's rules: elapsed_time needs both events created with enable_timing and recorded."""
import pytest
import torch

from engine.bench import metrics
from engine.bench.metrics import StepPhases
from engine.clock import NullClock

U = 1 / 1024  # one tick of the stand-in clock, in seconds


class FakeEvent:
    """torch.cuda.Event as the phase clock uses it, on a GPU clock the test sets (`gpu_now`, ms)."""
    gpu_now = 0.0

    def __init__(self, enable_timing: bool = False):
        self.enable_timing, self.at = enable_timing, None

    def record(self) -> None:
        self.at = FakeEvent.gpu_now

    def elapsed_time(self, end: "FakeEvent") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return end.at - self.at


def run_steps(monkeypatch, clock: StepPhases, steps: list[dict]) -> StepPhases:
    """Each step as LLM.step drives the clock: start, plan, upload, the device work between two
    events, launched, then its completion (which began at `done` and waited until `waited`)."""
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    for s in steps:
        ticks = iter(s["ticks"])
        monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(ticks))
        clock.start()
        clock.mark("plan")
        clock.mark("upload")
        FakeEvent.gpu_now = s["gpu"][0]
        span = clock.begin_gpu()
        FakeEvent.gpu_now = s["gpu"][1]
        span = clock.end_gpu(span)
        clock.launched()
        clock.add_completion(s["done"], s["waited"], span, replayed=s["replayed"])
    return clock


# Two steps, in ticks: plan 2+1, upload 3+1, launch 4+4, completion 5+3 (of which waiting 2+1);
# on the GPU 1.2345678 ms (launched kernel by kernel, as a graph arm's prefill) and 0.5 ms (one
# graph replay).
TWO_STEPS = [dict(ticks=[10.0, 10 + 2 * U, 10 + 5 * U, 10 + 9 * U, 10 + 15 * U], done=10 + 10 * U,
                  waited=10 + 12 * U, gpu=(0.0, 1.2345678), replayed=False),
             dict(ticks=[20.0, 20 + U, 20 + 2 * U, 20 + 6 * U, 20 + 10 * U], done=20 + 7 * U,
                  waited=20 + 8 * U, gpu=(2.0, 2.5), replayed=True)]
HOST = {"host_ms_per_step": {"plan": 1.4648, "upload": 1.9531, "launch": 3.9062, "completion": 3.9062,
                             "completion_wait": 1.4648, "total": 11.2305},
        "host_seconds": {"plan": 0.00293, "upload": 0.003906, "launch": 0.007812, "completion": 0.007812,
                         "completion_wait": 0.00293}}


def test_on_cuda_each_phase_sums_its_intervals_and_the_gpu_time_is_its_events_span(monkeypatch):
    """Per step: 1e3 x seconds / steps, to 4 decimals; the seconds to 6; the GPU's ms summed
    over the steps that recorded a span, and apart over those replayed as one CUDA graph."""
    got = run_steps(monkeypatch, StepPhases(cuda=True), TWO_STEPS).as_dict()
    assert got == {"steps": 2, "clock": "host perf_counter", **HOST,
                   "gpu_steps": 2, "gpu_ms": 1.7346, "gpu_ms_per_step": 0.8673,
                   "graph_steps": 1, "graph_gpu_ms": 0.5, "graph_gpu_ms_per_step": 0.5}


def test_on_the_cpu_there_is_no_gpu_time_and_the_clock_says_where_device_work_went(monkeypatch):
    got = run_steps(monkeypatch, StepPhases(cuda=False), TWO_STEPS).as_dict()
    assert got == {"steps": 2, "clock": "host perf_counter (CPU: device work runs inside launch)", **HOST,
                   "gpu_steps": 0, "gpu_ms": 0.0, "gpu_ms_per_step": None,
                   "graph_steps": 0, "graph_gpu_ms": 0.0, "graph_gpu_ms_per_step": None}


@pytest.mark.parametrize("cuda, clock", [(True, "host perf_counter"),
                                         (False, "host perf_counter (CPU: device work runs inside launch)")])
def test_a_clock_that_saw_no_step_has_no_per_step_figures(cuda, clock):
    assert StepPhases(cuda=cuda).as_dict() == {
        "steps": 0, "clock": clock,
        "host_ms_per_step": {"plan": None, "upload": None, "launch": None, "completion": None,
                             "completion_wait": None, "total": None},
        "host_seconds": {"plan": 0.0, "upload": 0.0, "launch": 0.0, "completion": 0.0, "completion_wait": 0.0},
        "gpu_steps": 0, "gpu_ms": 0.0, "gpu_ms_per_step": None,
        "graph_steps": 0, "graph_gpu_ms": 0.0, "graph_gpu_ms_per_step": None}


def test_outside_the_bench_the_phase_clock_does_nothing(monkeypatch):
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: pytest.fail("NullClock read the clock"))
    clock = NullClock()
    clock.start()
    clock.mark("plan")
    assert clock.begin_gpu() is None and clock.end_gpu(None) is None
    clock.launched()
    clock.add_completion(clock.now(), clock.now(), None, replayed=True)


class CallOrder(NullClock):
    """A step clock that writes down what the engine calls, in order."""

    def __init__(self):
        self.calls: list[str] = []
        self.replayed: list[bool] = []

    def mark(self, phase: str) -> None:
        self.calls.append(phase)

    def begin_gpu(self) -> None:
        self.calls.append("begin_gpu")

    def end_gpu(self, span) -> None:
        self.calls.append("end_gpu")

    def launched(self) -> None:
        self.calls.append("launched")

    def add_completion(self, start: float, waited: float, span, replayed: bool) -> None:
        self.replayed.append(replayed)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_steps_gpu_span_opens_after_the_host_staged_its_inputs(make_llm, graph):
    """Opened before the upload, a step's start event fires at once on an idle device and the
    host's staging counts as device time (in the bench's GPU ms and in busy's unprofiled level)."""
    from engine import SamplingParams
    llm = make_llm(spec="ngram", num_spec_tokens=3, async_runner=True, graph=graph)
    llm.clock = clock = CallOrder()
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    llm.generate(["the cat sat on the mat", "a b a b a b"], params)
    step = ["plan", "upload", "begin_gpu", "end_gpu", "launched"]
    steps = len(clock.calls) // len(step)
    assert steps > 1 and clock.calls == step * steps
    assert clock.replayed == [False] * steps  # the CPU replays no graph, whatever the arm planned
