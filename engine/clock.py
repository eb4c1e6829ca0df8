"""The step clock: a hook the bench hands an LLM (`llm.clock = StepPhases(...)`, engine/bench/metrics.py)
to time each step's host phases and, on CUDA, its device work. The engine calls it at fixed
points of a step (start, plan, upload, launch, completion); outside the bench it is a NullClock,
which reads no clock and records no event, so serving pays nothing for it."""


class NullClock:
    """The step clock outside the bench: every call does nothing."""

    def now(self) -> float:
        return 0.0

    def start(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass

    def begin_gpu(self) -> None:
        return None

    def end_gpu(self, span) -> None:
        return None

    def launched(self) -> None:
        pass

    def add_completion(self, start: float, waited: float, span, replayed: bool) -> None:
        pass
