"""Measurements for the speed gates: timed legs, the A/B with a noise floor, and GPU busy time.

A/B rule: each arm's spread over its warm legs, (max - min) / mean, is its noise; the floor is
the larger of the two arms' spreads. A relative delta smaller than the floor is reported as
"under the floor" and never as a ratio, because a ratio there would state noise as a result.
"""
import time
from dataclasses import dataclass, field

UNDER_THE_FLOOR = "under the floor"


@dataclass
class TimedLeg:
    arm: str
    concurrency: int
    index: int
    warm: bool
    output_tokens: int
    seconds: float
    tpot_ms: float | None            # mean over requests of (finish - first token) / (tokens - 1)
    order: int = 0                   # position of this leg in the run, to show interleaving

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds


def timed_leg(llm, prompts: list[str], params, arm: str, concurrency: int, index: int, warm: bool) -> TimedLeg:
    """One pass of the workload, stepping the engine by hand to time each request's first token
    and finish as the host sees them (the async runner learns both one step late)."""
    t0 = time.perf_counter()
    reqs = [llm.add_request(p, params) for p in prompts]
    first, done = {}, {}
    while llm.has_unfinished():
        llm.step()
        now = time.perf_counter()
        for r in reqs:
            if r.request_id not in first and r.output_token_ids:
                first[r.request_id] = now
            if r.request_id not in done and r.is_finished:
                done[r.request_id] = now
    seconds = time.perf_counter() - t0
    per_token = [(done[r.request_id] - first[r.request_id]) / (len(r.output_token_ids) - 1)
                 for r in reqs if len(r.output_token_ids) > 1]
    tpot = 1000 * sum(per_token) / len(per_token) if per_token else None
    return TimedLeg(arm, concurrency, index, warm, sum(len(r.output_token_ids) for r in reqs), seconds, tpot)


def spread(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / mean if mean else 0.0


@dataclass
class ABResult:
    metric: str
    concurrency: int
    higher_is_better: bool
    a: list[float]
    b: list[float]
    floor: float = field(init=False)
    delta: float = field(init=False)      # (mean b - mean a) / mean a

    def __post_init__(self):
        mean_a, mean_b = sum(self.a) / len(self.a), sum(self.b) / len(self.b)
        self.floor = max(spread(self.a), spread(self.b))
        self.delta = (mean_b - mean_a) / mean_a

    @property
    def under_floor(self) -> bool:
        return abs(self.delta) < self.floor

    @property
    def b_is_worse(self) -> bool:
        """B worse than A by more than the floor."""
        return not self.under_floor and (self.delta < 0) == self.higher_is_better

    def as_dict(self, a_name: str = "sync", b_name: str = "async") -> dict:
        out = {"metric": self.metric, "concurrency": self.concurrency,
               f"{a_name}_legs": [round(v, 4) for v in self.a], f"{b_name}_legs": [round(v, 4) for v in self.b],
               f"{a_name}_mean": round(sum(self.a) / len(self.a), 4),
               f"{b_name}_mean": round(sum(self.b) / len(self.b), 4),
               f"{a_name}_spread": round(spread(self.a), 4), f"{b_name}_spread": round(spread(self.b), 4),
               "noise_floor": round(self.floor, 4)}
        if self.under_floor:
            out["result"] = UNDER_THE_FLOOR
        else:
            out["result"] = f"{b_name}/{a_name} = {1 + self.delta:.3f}"
            out["ratio"] = round(1 + self.delta, 4)
        return out


def busy_fraction(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Fraction of `window` covered by the union of `intervals` (device kernels), clipped to it."""
    start, end = window
    clipped = sorted((max(s, start), min(e, end)) for s, e in intervals if e > start and s < end)
    covered, cursor = 0.0, start
    for s, e in clipped:
        if e > cursor:
            covered += e - max(s, cursor)
            cursor = e
    return covered / (end - start) if end > start else 0.0
