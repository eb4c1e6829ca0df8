"""A stand-in for the `time` module's two clocks, set by the test (tests/conftest.py's bench runs,
tests/bench/test_bench_passes.py)."""
from dataclasses import dataclass


@dataclass
class Clock:
    wall: float = 1000.0
    perf: float = 10.0

    def time(self) -> float:
        return self.wall

    def perf_counter(self) -> float:
        return self.perf
