"""Acceptance metrics in the units both oracle engines use, so figures compare directly.

vLLM:   num_drafts, num_draft_tokens, num_accepted_tokens;
        mean acceptance length = 1 + accepted / drafts; acceptance rate = accepted / draft tokens.
SGLang: verify steps; accept length = completion tokens / verify steps.

Only real drafts count: padded draft slots never enter a denominator.
"""
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
