"""Where the device's idle time goes: the busy gate's profile, read per host phase.

Busy says how much of the decode window the device was fed; when it falls short, the question is
what the host was doing while the device waited. During the profiled window the engine's host
phases are marked as profiler ranges (`host_phase_ranges`), and each stretch of device idle time
is charged to the innermost host phase open at that moment (`idle_by_phase`). "outside" is idle
time during which the host was in none of the marked phases (the step's own Python between them,
the profiler's bookkeeping).

The phases, in the order a step runs them: schedule (the scheduler picks the batch), plan (the
step's rows and buckets), upload (the staging copy: filling the pinned buffer, queueing the
copies), launch (the graph replay or the eager kernels, and queueing the result download; upload
nests inside it), read (waiting for a launched step's results and unpacking them), apply (the
results reach their requests)."""
from contextlib import contextmanager
from functools import wraps

from torch.profiler import record_function

PREFIX = "specgate.host."
PHASES = ("schedule", "plan", "upload", "launch", "read", "apply")
OUTSIDE = "outside"


@contextmanager
def host_phase_ranges(llm):
    """Mark the engine's host phases as profiler ranges (named PREFIX + phase) while inside;
    the engine is left as it was on exit."""
    targets = {"schedule": (llm.scheduler, "schedule"), "plan": (llm.runner, "plan_step"),
               "upload": (llm.runner, "_upload"), "launch": (llm.runner, "launch"),
               "read": (llm.runner, "read"), "apply": (llm, "_apply")}

    def ranged(name, method):
        @wraps(method)
        def call(*args, **kwargs):
            with record_function(PREFIX + name):
                return method(*args, **kwargs)
        return call

    for name, (owner, attr) in targets.items():
        setattr(owner, attr, ranged(name, getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr in targets.values():
            del owner.__dict__[attr]  # the instance attribute set above; the class's method shows again


def host_ranges(events) -> list[tuple[str, int, int]]:
    """(phase, start ns, end ns) of the profiler's host events that host_phase_ranges marked."""
    return [(e.name().removeprefix(PREFIX), e.start_ns(), e.end_ns()) for e in events if e.name().startswith(PREFIX)]


def idle_gaps(busy: list[tuple[int, int]], span: tuple[int, int]) -> list[tuple[int, int]]:
    """The stretches of `span` that no busy interval covers."""
    gaps, cursor = [], span[0]
    for start, end in sorted(busy):
        if start > cursor:
            gaps.append((cursor, min(start, span[1])))
        cursor = max(cursor, end)
        if cursor >= span[1]:
            break
    if cursor < span[1]:
        gaps.append((cursor, span[1]))
    return [(s, e) for s, e in gaps if e > s]


def time_in_phase(ranges: list[tuple[str, int, int]], span: tuple[int, int]) -> dict[str, int]:
    """The host's time in each phase inside `span` (a nested phase counts in its parent too: launch
    includes upload). Beside the idle time charged to each phase it tells a host that is slow from
    a device that ran dry: under the profiler a phase may take longer than the bench measures it
    unprofiled (every CUDA call and graph launch goes through the profiler's callbacks)."""
    spent = dict.fromkeys(PHASES, 0)
    for phase, start, end in ranges:
        spent[phase] += max(0, min(end, span[1]) - max(start, span[0]))
    return spent


def idle_by_phase(gaps: list[tuple[int, int]], ranges: list[tuple[str, int, int]]) -> dict[str, int]:
    """Idle time (the units of the inputs) charged to the innermost host range open during it, or
    OUTSIDE. `ranges` are (phase, start, end); a range nested in another starts later, so the
    innermost open range is the open one that started last."""
    charged = dict.fromkeys((*PHASES, OUTSIDE), 0)
    for gap_start, gap_end in gaps:
        inside = [r for r in ranges if r[1] < gap_end and r[2] > gap_start]
        cuts = sorted({gap_start, gap_end, *(t for r in inside for t in r[1:] if gap_start < t < gap_end)})
        for a, b in zip(cuts, cuts[1:]):
            open_ = [r for r in inside if r[1] <= a and r[2] >= b]
            phase = max(open_, key=lambda r: r[1])[0] if open_ else OUTSIDE
            charged[phase] += b - a
    return charged
