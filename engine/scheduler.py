"""Continuous batching: admit arrived requests, reserve KV blocks, preempt when the cache is full.

Plain Python over Request objects. Each step schedules the running requests first (oldest
first, one decode or verify query each), preempting the newest running request while the
cache cannot hold the next step, then admits waiting requests in arrival order while the
token budget, max_num_seqs and the cache allow. A preempted request goes back to the front of
the queue and is later resumed by recomputing its prompt plus output.
"""
from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.policy import RunnerPolicy
from engine.request import Request, Status


@dataclass
class ScheduledBatch:
    step: int
    requests: list[Request] = field(default_factory=list)
    is_prefill: list[bool] = field(default_factory=list)
    spec_width: list[int] = field(default_factory=list)  # drafts each row may verify (k, or 0)
    preempted: list[Request] = field(default_factory=list)
    # Left out by the token budget: running requests that wait a step, and the waiting request
    # whose admission it stopped (what the trace reads to tell that the budget bound).
    deferred: list[Request] = field(default_factory=list)


def spec_width(req: Request, k: int) -> int:
    """Drafts per verify step for this request: k, or 0 when its sampling needs the host."""
    return 0 if req.needs_host_history else k


class Scheduler:
    def __init__(self, cfg: EngineConfig, policy: RunnerPolicy):
        self.cfg = cfg
        self.block_manager = BlockManager(cfg.total_kv_blocks, cfg.block_size)
        self.lookahead = policy.kv_lookahead(cfg.k)  # KV reserved beyond the host-known length
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.free_slots = list(range(cfg.max_num_seqs - 1, -1, -1))
        # Aborted requests whose blocks and slot a step still in flight writes: released when
        # that step's results are read (release_held), not at abort time.
        self.held: list[Request] = []
        self.step = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def arrives_later(self, step: int) -> bool:
        """Whether a waiting request arrives after `step`."""
        return any(r.arrival_step > step for r in self.waiting)

    def query_len(self, req: Request) -> int:
        return req.num_tokens if req.needs_prefill else 1 + self.spec_width(req)

    def spec_width(self, req: Request) -> int:
        return spec_width(req, self.cfg.k)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch(step=self.step)
        self.step += 1
        budget = self.cfg.max_num_batched_tokens
        queue = list(self.running)
        kept: list[Request] = []
        while queue:
            req = queue.pop(0)
            need = req.num_tokens + self.lookahead
            while not self.block_manager.can_reserve(len(req.block_ids), need):
                victim = queue.pop() if queue else req
                self.preempt(victim)
                batch.preempted.append(victim)
                if victim is req:
                    break
            else:
                req.block_ids += self.block_manager.reserve(len(req.block_ids), need)
                kept.append(req)
                if self.query_len(req) <= budget:
                    budget -= self.query_len(req)
                    batch.requests.append(req)
                    batch.is_prefill.append(False)
                    batch.spec_width.append(self.spec_width(req))
                else:  # it stays running and waits a step
                    batch.deferred.append(req)
        self.running = kept
        while self.waiting and len(self.running) < self.cfg.max_num_seqs and self.free_slots:  # held slots count
            req = self.waiting[0]
            need = req.num_tokens + self.lookahead
            if (req.arrival_step > batch.step or req in batch.preempted
                    or not self.block_manager.can_reserve(len(req.block_ids), need)):
                break
            if self.query_len(req) > budget:
                batch.deferred.append(req)
                break
            self.waiting.popleft()
            req.block_ids += self.block_manager.reserve(len(req.block_ids), need)
            req.slot = self.free_slots.pop()
            req.status = Status.RUNNING
            req.needs_prefill = True
            budget -= self.query_len(req)
            self.running.append(req)
            batch.requests.append(req)
            batch.is_prefill.append(True)
            batch.spec_width.append(self.spec_width(req))
        return batch

    def preempt(self, req: Request) -> None:
        self.block_manager.free(req.block_ids)
        req.block_ids = []
        self.free_slots.append(req.slot)
        req.slot = None
        req.status = Status.WAITING
        req.needs_prefill = True
        req.is_resumed = True
        req.stats.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request, reason: str, step: int | None = None, num_truncated: int = 0) -> None:
        """End the request at `step` (`num_truncated`: tokens its last step produced past the end)
        and release its blocks and slot. Work already queued on the device for them runs before
        any later step that reuses them (one stream), so release is immediate."""
        req.status = Status.FINISHED
        req.finish_reason = reason
        req.finish_step = step
        req.stats.num_truncated += num_truncated
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self._release(req)

    def abort(self, req: Request, step: int, in_flight: bool) -> None:
        """End the request with finish reason "abort", whatever its status. `in_flight`: a
        launched step whose results are not yet read holds the request; its blocks and slot stay
        reserved (no admission can take them) until release_held() sees that step read."""
        req.status = Status.FINISHED
        req.finish_reason = "abort"
        req.finish_step = step
        if req in self.running:
            self.running.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if in_flight:
            self.held.append(req)
        else:
            self._release(req)

    def release_held(self, requests: list[Request]) -> None:
        """A step's results were read: the aborted requests it held give back blocks and slot."""
        done = [req for req in self.held if req in requests]
        for req in done:
            self.held.remove(req)
            self._release(req)

    def _release(self, req: Request) -> None:
        if req.block_ids:
            self.block_manager.free(req.block_ids)
            req.block_ids = []
        if req.slot is not None:
            self.free_slots.append(req.slot)
            req.slot = None
