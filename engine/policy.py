"""The runner policy: everything the sync and async runners do differently, in one place.

The veto (engine/veto.py) decides which runner a run uses and hands out its policy. The async
runner keeps one step in flight: it launches step t+1 before it reads step t's results, so
the host learns every result one step late. That one fact decides, and only here:

- how many steps are in flight, hence how much KV a request may write ahead of what the host
  knows (`kv_lookahead`);
- which rows of a step are *device-fed* (their last token, positions and length come from the
  device state the previous step wrote), and why a row is refused that (`feed`);
- when a step's results are completed: right after it runs, or after the next launch;
- whether the in-flight step must be drained first because a request's sampling needs its
  full history on the host;
- the route label the trace records.
"""
from collections.abc import Iterable
from dataclasses import dataclass

from engine.request import Request

REFUSE_PREFILL, REFUSE_RESUMED, REFUSE_HOST_HISTORY = "prefill", "resumed", "host_history"
MAX_INFLIGHT_STEPS = 1  # the async runner's; the KV cache is sized for it


def kv_lookahead(k: int, num_inflight_steps: int) -> int:
    """KV positions a request may write beyond its host-known length: this step's k drafts,
    plus one whole verify step (k + 1 tokens) for each step still in flight whose results
    the host lacks."""
    return k + num_inflight_steps * (k + 1)


@dataclass(frozen=True)
class RunnerPolicy:
    is_async: bool

    @property
    def num_inflight_steps(self) -> int:
        return MAX_INFLIGHT_STEPS if self.is_async else 0

    @property
    def route(self) -> str:
        return "async" if self.is_async else "sync"

    @property
    def completes_late(self) -> bool:
        """Whether a step's results are read after the next step is launched (else at once)."""
        return self.is_async

    def kv_lookahead(self, k: int) -> int:
        return kv_lookahead(k, self.num_inflight_steps)

    def feed(self, req: Request, is_prefill: bool) -> tuple[bool, str | None]:
        """(device_fed, refusal): whether the row takes its inputs from the device state, and
        if not, why (the sync runner feeds every row from the host and gives no reason)."""
        if not self.is_async:
            return False, None
        refusal = (REFUSE_RESUMED if is_prefill and req.is_resumed else REFUSE_PREFILL if is_prefill
                   else REFUSE_HOST_HISTORY if req.needs_host_history else None)
        return refusal is None, refusal

    def drains_before_schedule(self, running: Iterable[Request]) -> bool:
        """Whether the step in flight must be completed before scheduling: a request whose
        sampling needs its full history on the host cannot wait a step for it."""
        return self.is_async and any(r.needs_host_history for r in running)


SYNC, ASYNC = RunnerPolicy(is_async=False), RunnerPolicy(is_async=True)
