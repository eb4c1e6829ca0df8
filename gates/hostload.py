"""The host's CPU taken by other processes while a timed gate measures (Linux's /proc/stat).

busy and speed-ab time a loop whose host work per step is a large share of the device's step
(on the fixtures, 0.36 to 0.62 ms of host work on a 0.7 ms step): a host slowed by other work
leaves the device idle, and busy's level then reads the host, not the engine. On the H200
(2026-12-04) one round's fixture level fell to 0.9115 (red) where the next read 0.9722, and in
that window the same code's host phases ran 1.7 times slower; what else ran on the host was not
recorded. So the timed gates start on a quiet host (`wait_for_quiet_host`, before the timed
phase of `gates run` on CUDA) and busy records the other processes' share of each window
(`other_cores`), named beside a red level. Neither changes a verdict: a red measured on a busy
host stays red, with its cause written next to it.

"Other" is every CPU's busy time (user, nice, system, irq, softirq, steal: steal is a virtual
machine's neighbours) less this process's own and its reaped children's; a child still running
(pytest-xdist workers, inductor's compile workers) counts as other, which is what is meant.
"""
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from gates.measure import median

PROC_STAT = "/proc/stat"
# /proc/stat's aggregate cpu line: user nice system idle iowait irq softirq steal (guest time is
# already inside user and nice)
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
# Quiet: the other processes together use less than half a core (the gates' own process is one).
QUIET_CORES = 0.5
QUIET_PROBE_S = 1.0
QUIET_MAX_PROBES = 120  # two minutes of 1-s probes at most


@dataclass(frozen=True)
class CpuSample:
    busy_s: float  # every CPU's busy seconds since boot
    own_s: float   # this process's CPU seconds, its reaped children's included
    at: float      # time.monotonic()


def sample(stat_path: str = PROC_STAT) -> CpuSample | None:
    """The host's busy CPU time and our own, now; None where there is no /proc/stat."""
    try:
        with open(stat_path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:]]
    own = os.times()
    return CpuSample(sum(ticks[i] for i in BUSY_FIELDS if i < len(ticks)) / os.sysconf("SC_CLK_TCK"),
                     own.user + own.system + own.children_user + own.children_system, time.monotonic())


def other_cores(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """Cores' worth of CPU the other processes used between two samples (None without both)."""
    if before is None or after is None or after.at <= before.at:
        return None
    return max(0.0, (after.busy_s - before.busy_s) - (after.own_s - before.own_s)) / (after.at - before.at)


def probe(seconds: float = QUIET_PROBE_S) -> float | None:
    """The other processes' cores over the next `seconds` (this process sleeping)."""
    before = sample()
    time.sleep(seconds)
    return other_cores(before, sample())


def summary(values: list[float | None]) -> dict | None:
    """Other processes' cores over several windows: median and highest; None where none was read."""
    known = [v for v in values if v is not None]
    return {"median": round(median(known), 3), "max": round(max(known), 3)} if known else None


def during_windows(by_runner: dict[str, dict | None]) -> str:
    """The line a red timed figure is read beside: what other processes took of the host then."""
    parts = [f"{runner} median {load['median']} (max {load['max']})" for runner, load in by_runner.items() if load]
    return "; other processes on the host during the windows, in cores: " + ", ".join(parts) if parts else ""


@dataclass(frozen=True)
class QuietWait:
    quiet: bool              # the last probe was under the quiet level (or no /proc/stat to read)
    waited_s: float
    other_cores: float | None  # the last probe's figure
    probes: int

    def line(self) -> str:
        if self.other_cores is None:
            return "host load: not measured (no /proc/stat)"
        state = "quiet" if self.quiet else f"still busy after {self.waited_s:.0f} s, timed anyway"
        return (f"host load before the timed gates: other processes {self.other_cores:.2f} cores "
                f"({state}; quiet under {QUIET_CORES}, {self.probes} probes of {QUIET_PROBE_S:.0f} s)")


def wait_for_quiet_host(max_probes: int = QUIET_MAX_PROBES, quiet_cores: float = QUIET_CORES,
                        measure: Callable[[], float | None] = probe) -> QuietWait:
    """Probe until the other processes use under `quiet_cores`, at most `max_probes` probes."""
    t0 = time.monotonic()
    for probes in range(1, max_probes + 1):
        cores = measure()
        quiet = cores is None or cores < quiet_cores
        if quiet or probes == max_probes:
            return QuietWait(quiet, round(time.monotonic() - t0, 1), None if cores is None else round(cores, 3),
                             probes)
    raise ValueError(f"max_probes must be at least 1, not {max_probes}")
