"""The busy gate's level measured without the profiler (gates/busy.py, span_busy and StepSpans):
the device's time inside each step's event pair over the window of steps, on synthetic event
timelines (CUDA events need a GPU; the arithmetic does not)."""
import pytest

from gates.busy import StepSpans, span_busy


class Event:
    """A CUDA event stand-in recorded at `ms` on the device's clock."""

    def __init__(self, ms: float):
        self.ms, self.recorded = ms, False

    def elapsed_time(self, later: "Event") -> float:
        return later.ms - self.ms

    def record(self) -> None:
        self.recorded = True


def spans(*steps: tuple[float, float]) -> list[tuple[Event, Event]]:
    return [(Event(start), Event(end)) for start, end in steps]


def test_steps_back_to_back_keep_the_device_busy_the_whole_window():
    assert span_busy(spans((5, 7), (7, 9), (9, 11))) == 1.0


def test_the_gaps_between_steps_are_the_idle_time_and_the_window_starts_at_the_first_step():
    # 3 steps of 2 ms with gaps of 0.5 and 1.5 ms: 6 of 8 ms busy; nothing before 10 ms counts.
    assert span_busy(spans((10, 12), (12.5, 14.5), (16, 18))) == pytest.approx(6 / 8)


def test_a_host_that_waits_for_each_step_shows_its_wait_as_idle():
    blocking = span_busy(spans(*[(3 * i, 3 * i + 2) for i in range(10)]))   # 1 ms of host per 2 ms step
    fed = span_busy(spans(*[(2 * i, 2 * i + 2) for i in range(10)]))
    assert blocking == pytest.approx(20 / 29) and fed == 1.0


def test_the_clock_keeps_every_steps_event_pair_and_records_its_end():
    clock = StepSpans()
    pairs = spans((0, 1), (1, 2))
    for pair in pairs:
        assert clock.end_gpu(pair) is pair
    assert clock.spans == pairs and all(end.recorded for _, end in pairs)
    assert clock.cuda  # its host phases are the bench's, with the GPU span per step


def test_a_step_launched_before_the_clock_was_handed_in_is_not_one_of_its_steps():
    """The async runner completes the step in flight when the window opens: it has no span, and
    neither its host time nor its GPU time is the window's."""
    clock = StepSpans()
    clock.add_completion(0.0, 0.0, None, replayed=False)
    assert clock.seconds["completion"] == 0.0 and clock.gpu_steps == 0
    clock.add_completion(0.0, 0.0, (Event(1.0), Event(3.5)), replayed=True)
    assert clock.gpu_steps == 1 and clock.gpu_ms == 2.5
    assert clock.graph_steps == 1 and clock.graph_gpu_ms == 2.5  # told on to the bench's clock
