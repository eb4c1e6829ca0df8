"""Measurements for the speed gates: timed legs, the paired A/B with its floor, and GPU busy time.

A/B rule (PairedMedianAB): the runners' legs are interleaved and paired leg by leg; the floor is
the bootstrap interval of the median per-leg difference, which must clear a smallest effect to
count. A difference under the floor is reported as "under the floor" and never as a ratio,
because a ratio there would state noise as a result.
"""
import time
from dataclasses import dataclass

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
    host_ms_per_step: dict | None = None  # the engine's host phases (engine/bench/metrics.py StepPhases)

    @property
    def throughput(self) -> float:
        return self.output_tokens / self.seconds


def timed_leg(llm, prompts: list[str], params, arm: str, concurrency: int, index: int, warm: bool) -> TimedLeg:
    """One pass of the workload, stepping the engine by hand to time each request's first token
    and finish as the host sees them (the async runner learns both one step late). The engine's
    step clock records the host's time per phase meanwhile (perf_counter marks only: no CUDA
    event in a timed leg), so a slower runner shows where its host time went."""
    from engine.bench.metrics import StepPhases
    from engine.clock import NullClock
    phases = StepPhases(cuda=False)
    llm.clock = phases
    t0 = time.perf_counter()
    try:
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
    finally:
        llm.clock = NullClock()
    seconds = time.perf_counter() - t0
    per_token = [(done[r.request_id] - first[r.request_id]) / (len(r.output_token_ids) - 1)
                 for r in reqs if len(r.output_token_ids) > 1]
    tpot = 1000 * sum(per_token) / len(per_token) if per_token else None
    host = phases.as_dict()["host_ms_per_step"] if phases.steps else None
    return TimedLeg(arm, concurrency, index, warm, sum(len(r.output_token_ids) for r in reqs), seconds, tpot,
                    host_ms_per_step=host)


def submission_intervals(activities: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """One interval per host submission: activities are (start, end, correlation id) of the
    device's kernels, copies and sets; those of one host call (a CUDA graph replay launches
    hundreds of kernels under one correlation id) become [first start, last end]. Inside a replay
    the device dispatches the next kernel by itself, about 0.7 µs apart on the H200; those gaps
    are the device's, and no host could fill them. An activity without an id (0) stands alone."""
    spans: dict[int, tuple[float, float]] = {}
    alone = []
    for start, end, correlation in activities:
        if not correlation:
            alone.append((start, end))
        elif correlation in spans:
            first, last = spans[correlation]
            spans[correlation] = (min(first, start), max(last, end))
        else:
            spans[correlation] = (start, end)
    return [*spans.values(), *alone]


def busy_fraction(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Fraction of `window` covered by the union of `intervals` (device work), clipped to it."""
    start, end = window
    clipped = sorted((max(s, start), min(e, end)) for s, e in intervals if e > start and s < end)
    covered, cursor = 0.0, start
    for s, e in clipped:
        if e > cursor:
            covered += e - max(s, cursor)
            cursor = e
    return covered / (end - start) if end > start else 0.0


# ---- the paired A/B of the busy and speed gates ------------------------------------------------
# A range floor ((max - min) / mean of each runner's legs, the gates' first rule) lets one
# collapsed leg (a host hiccup) set the floor for the whole A/B: on the H200 a single leg in five
# turned a 35% busy-time gain into "under the floor", and one slow sync leg of three hid speed-ab's
# 8% TPOT gain at c=1 (2026-12-02, the compiled graph arm). The gates therefore pair the runners leg
# by leg (the legs are interleaved, so a leg's hiccup hits both) and bootstrap the median of the
# per-leg differences.
BOOTSTRAP = "percentile bootstrap of the median of per-leg differences (async - sync)"
RELATIVE_BOOTSTRAP = "percentile bootstrap of the median of per-leg relative differences (async / sync - 1)"
RESAMPLES, CONFIDENCE, OUTLIER_MADS, MIN_LEGS = 2000, 0.95, 3.0, 5
# The smallest busy-fraction difference that counts: one point of decode time. Paired legs resolve
# far smaller differences, and a consistent 0.2-point gap in the launch-bound eager arm is no
# regression worth holding the veto for (the graph arm's level has its own threshold).
BUSY_MIN_EFFECT = 0.01
# speed-ab's, relative: a 2% change in TPOT or throughput. The async runner exists for gains of
# 10% and more (the H200's graph arm: 8 to 42%); under 2% a gain is no reason to switch runners.
SPEED_MIN_EFFECT = 0.02
MAD_TO_SIGMA = 1.4826  # scales the median absolute deviation to a normal's standard deviation


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def bootstrap_median_interval(values: list[float], resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
                              *, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the median: `resamples` resamples with replacement from a
    generator seeded with `seed`, so the same legs always give the same interval."""
    import random
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]


def outliers(values: list[float], mads: float = OUTLIER_MADS) -> list[dict]:
    """Values further than `mads` scaled MADs from the median: named, never dropped."""
    mid = median(values)
    scale = MAD_TO_SIGMA * median([abs(v - mid) for v in values])
    if scale == 0:
        return [{"leg": i, "value": round(v, 4), "median": round(mid, 4), "mads": "inf"}
                for i, v in enumerate(values) if v != mid]
    return [{"leg": i, "value": round(v, 4), "median": round(mid, 4), "mads": round(abs(v - mid) / scale, 1)}
            for i, v in enumerate(values) if abs(v - mid) > mads * scale]


@dataclass
class PairedMedianAB:
    """Runner B against runner A over paired, interleaved legs (a[i] and b[i] ran back to back).

    B is ahead when the whole bootstrap interval of the median per-leg difference lies on B's
    better side of +-min_effect, behind when it lies beyond it on the worse side, and otherwise
    the difference is under the floor: reported as such, never as a ratio. `relative`: the
    differences are b / a - 1 (speed: TPOT, throughput), and a result beyond the floor carries
    the ratio 1 + their median. Legs beyond OUTLIER_MADS scaled MADs from their median are named
    in `outliers`; every leg stays in.
    """
    metric: str
    a: list[float]
    b: list[float]
    higher_is_better: bool = True
    resamples: int = RESAMPLES
    confidence: float = CONFIDENCE
    seed: int = 0
    min_effect: float = 0.0
    a_name: str = "sync"
    b_name: str = "async"
    relative: bool = False

    def __post_init__(self):
        if len(self.a) != len(self.b):
            raise ValueError(f"paired legs: {len(self.a)} {self.a_name} legs against {len(self.b)} {self.b_name} legs")
        if len(self.a) < MIN_LEGS:
            raise ValueError(f"{len(self.a)} legs: the median's bootstrap interval needs at least {MIN_LEGS}")
        self.differences = [b / a - 1 if self.relative else b - a for a, b in zip(self.a, self.b)]
        self.median_difference = median(self.differences)
        self.interval = bootstrap_median_interval(self.differences, self.resamples, self.confidence, seed=self.seed)

    @property
    def result(self) -> str:
        lo, hi = self.interval
        sign, m = (1 if self.higher_is_better else -1), self.min_effect
        if (lo > m and sign > 0) or (hi < -m and sign < 0):
            return "ahead"
        if (hi < -m and sign > 0) or (lo > m and sign < 0):
            return "behind"
        return UNDER_THE_FLOOR

    @property
    def b_is_worse(self) -> bool:
        return self.result == "behind"

    @property
    def b_is_better(self) -> bool:
        return self.result == "ahead"

    def as_dict(self) -> dict:
        a, b = self.a_name, self.b_name
        named = [{"runner": name, **o} for name, legs in ((a, self.a), (b, self.b)) for o in outliers(legs)]
        named += [{"runner": f"{b}-{a}", **o} for o in outliers(self.differences)]
        out = {"metric": self.metric, "statistic": RELATIVE_BOOTSTRAP if self.relative else BOOTSTRAP,
               "resamples": self.resamples, "confidence": self.confidence, "seed": self.seed, "legs": len(self.a),
               f"{a}_legs": [round(v, 4) for v in self.a], f"{b}_legs": [round(v, 4) for v in self.b],
               f"{a}_median": round(median(self.a), 4), f"{b}_median": round(median(self.b), 4),
               "median_difference": round(self.median_difference, 4),
               "interval": [round(v, 4) for v in self.interval], "min_effect": self.min_effect,
               "outlier_rule": f"beyond {OUTLIER_MADS:g} scaled MADs ({MAD_TO_SIGMA} x MAD) of the median; "
                               f"named, kept in every statistic",
               "outliers": named, "result": self.result}
        if self.relative and self.result != UNDER_THE_FLOOR:
            out["ratio"] = round(1 + self.median_difference, 4)
        return out


def judge_busy(arm: str, ab: PairedMedianAB, threshold: float | None) -> list[str]:
    """Why the busy gate is red for one arm ([] when it is green).

    Graph arm: the async runner's median busy fraction must reach `threshold` (the level), the
    sync runner's must not (the negative control: a level the blocking runner also reaches cannot
    tell a blocking host from a fed device), and the async runner must be busier than the sync
    runner beyond the floor (a host that blocks on each step's results is as idle as the sync
    runner). Eager arm (launch-bound on small models): the async runner must only not be less busy
    beyond the floor."""
    figures = ab.as_dict()
    named = "; outliers named: " + ", ".join(f"{o['runner']} leg {o['leg']} = {o['value']}"
                                             for o in figures["outliers"]) if figures["outliers"] else ""
    summary = (f"{arm} arm: async median {figures['async_median']}, sync median {figures['sync_median']}, "
               f"median difference {figures['median_difference']}, {ab.confidence:.0%} interval "
               f"{figures['interval']} over {figures['legs']} legs{named}")
    problems = []
    if ab.b_is_worse:
        problems.append(f"the async runner keeps the GPU less busy than the sync runner: {summary}")
    if arm == "graph":
        if threshold is not None and median(ab.b) < threshold:
            problems.append(f"the async runner's busy level {median(ab.b):.3f} is under the threshold "
                            f"{threshold}: {summary}")
        if threshold is not None and median(ab.a) >= threshold:
            problems.append(f"the negative control passed: the sync runner's busy level {median(ab.a):.3f} "
                            f"reaches the threshold {threshold} too, so the level cannot tell a host that "
                            f"blocks on each step on this model (pass a --busy-threshold between the sync "
                            f"and the async level): {summary}")
        if not ab.b_is_worse and not ab.b_is_better:
            problems.append(f"the async runner shows no busy-time gain over the sync runner beyond the "
                            f"floor ({UNDER_THE_FLOOR}): {summary}")
    return problems
