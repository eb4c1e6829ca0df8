"""Acceptance metrics in the units both oracle engines use, so figures compare directly.

vLLM:   num_drafts, num_draft_tokens, num_accepted_tokens;
        mean acceptance length = 1 + accepted / drafts; acceptance rate = accepted / draft tokens.
SGLang: verify steps; accept length = completion tokens / verify steps.

Only real drafts count: padded draft slots never enter a denominator.

StepPhases: the bench's host time per engine step by phase (plan, upload, launch, completion)
and, on CUDA, the GPU time of each step: the clock the bench hands an LLM (`llm.clock`);
engine/clock.py's NullClock stands in for it outside the bench.
"""
import time
from dataclasses import dataclass, field

from engine.request import RequestStats


@dataclass
class Acceptance:
    num_requests: int = 0
    completion_tokens: int = 0
    verify_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, stats: RequestStats, completion_tokens: int) -> None:
        self.num_requests += 1
        self.completion_tokens += completion_tokens
        self.verify_steps += stats.verify_steps
        self.num_drafts += stats.num_drafts
        self.num_draft_tokens += stats.num_draft_tokens
        self.num_accepted_tokens += stats.num_accepted_tokens
        for j, n in enumerate(stats.accepted_per_position):
            if j == len(self.accepted_per_position):
                self.accepted_per_position.append(0)
            self.accepted_per_position[j] += n

    def merge(self, other: "Acceptance") -> None:
        for name in ("num_requests", "completion_tokens", "verify_steps", "num_drafts",
                     "num_draft_tokens", "num_accepted_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for j, n in enumerate(other.accepted_per_position):
            if j == len(self.accepted_per_position):
                self.accepted_per_position.append(0)
            self.accepted_per_position[j] += n

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's τ: tokens per drafted verify step, the bonus included."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def accept_length(self) -> float:
        """SGLang's: completion tokens per verify step (the prefill's token included)."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else 0.0

    def as_dict(self) -> dict:
        return {
            "num_requests": self.num_requests, "completion_tokens": self.completion_tokens,
            "verify_steps": self.verify_steps, "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens, "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_position),
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "accept_length": round(self.accept_length, 4),
        }


PHASES = ("plan", "upload", "launch", "completion")


class StepPhases:
    """Host time per engine step by phase, and on CUDA the GPU time of each step's device work;
    for the bench only (an LLM's clock is a NullClock otherwise, which does nothing).

    plan: scheduling and the step plan; upload: host staging and the copies issued; launch:
    issuing the device work (kernels, or a graph replay) and the result download; completion:
    waiting for a step's results and committing them on the host (`completion_wait` is the
    waiting part). On the CPU the device work runs on the host inside launch, so there is no
    GPU time. gpu: the span between CUDA events recorded before and after the step's device work
    on the compute stream, opened once the host has staged the step's inputs (idle gaps inside
    the step included: in the eager arm, the host's launching between kernels), read after the
    step's results arrived, so measuring adds no host wait."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.completion_wait = 0.0
        self.steps = 0          # steps launched
        self.gpu_ms = 0.0
        self.gpu_steps = 0
        # The steps replayed as one CUDA graph apart: a graph arm's decode and verify steps. Its
        # prefills run eagerly, the host launching each kernel inside the span, several times a
        # replay's time, so a per-step mean over every step charges a workload with fewer steps
        # per prompt (speculative decoding) more per step.
        self.graph_gpu_ms = 0.0
        self.graph_steps = 0

    def now(self) -> float:
        return time.perf_counter()

    def start(self) -> None:
        self._mark = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Add the time since the last mark to `phase`."""
        now = time.perf_counter()
        self.seconds[phase] += now - self._mark
        self._mark = now

    def begin_gpu(self):
        """A started pair of timing events around a step's device work (CUDA), else None."""
        if not self.cuda:
            return None
        import torch
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        span[0].record()
        return span

    def end_gpu(self, span):
        if span is not None:
            span[1].record()
        return span

    def launched(self) -> None:
        """A step's device work and result download are issued."""
        self.mark("launch")
        self.steps += 1

    def add_completion(self, start: float, waited: float, span, replayed: bool) -> None:
        """A step's completion: it began at `start` and its wait ended at `waited` (perf_counter);
        `replayed`: its device work was one CUDA graph replay."""
        self.seconds["completion"] += time.perf_counter() - start
        self.completion_wait += waited - start
        if span is not None:  # both events are done: the step's results, recorded after them, arrived
            ms = span[0].elapsed_time(span[1])
            self.gpu_ms += ms
            self.gpu_steps += 1
            if replayed:
                self.graph_gpu_ms += ms
                self.graph_steps += 1

    def as_dict(self) -> dict:
        per_step = {p: round(1e3 * s / self.steps, 4) if self.steps else None for p, s in self.seconds.items()}
        total = sum(self.seconds.values())
        return {"steps": self.steps, "clock": "host perf_counter" + ("" if self.cuda else
                                                                    " (CPU: device work runs inside launch)"),
                "host_ms_per_step": per_step | {
                    "completion_wait": round(1e3 * self.completion_wait / self.steps, 4) if self.steps else None,
                    "total": round(1e3 * total / self.steps, 4) if self.steps else None},
                "host_seconds": {p: round(s, 6) for p, s in self.seconds.items()}
                | {"completion_wait": round(self.completion_wait, 6)},
                "gpu_steps": self.gpu_steps, "gpu_ms": round(self.gpu_ms, 4),
                "gpu_ms_per_step": round(self.gpu_ms / self.gpu_steps, 4) if self.gpu_steps else None,
                "graph_steps": self.graph_steps, "graph_gpu_ms": round(self.graph_gpu_ms, 4),
                "graph_gpu_ms_per_step": round(self.graph_gpu_ms / self.graph_steps, 4) if self.graph_steps else None}
