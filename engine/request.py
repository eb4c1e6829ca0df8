"""One request's host-side state. Plain Python: no torch, so scheduling is testable alone.

Two places write it: the scheduler (admission, preemption, finish: status, slot, blocks) and the
methods below (what a step did for it: its tokens and counters). Everything else reads it."""
import enum
from dataclasses import dataclass, field

from engine.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestStats:
    """Per-request acceptance counters, in the units vLLM and SGLang use (see engine/bench/metrics.py)."""
    num_drafts: int = 0            # steps that verified at least one draft token (a resume's too)
    num_draft_tokens: int = 0      # real (unpadded) draft tokens verified
    num_accepted_tokens: int = 0
    verify_steps: int = 0          # every forward that produced tokens for this request after prefill
    num_preemptions: int = 0
    num_prefills: int = 0          # forwards over the prompt (again after each preemption)
    num_truncated: int = 0         # produced tokens not emitted: past a stop token or max_tokens
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass
class Request:
    request_id: int
    prompt_token_ids: list[int]
    params: SamplingParams
    rng_key: int
    arrival_step: int = 0
    status: Status = Status.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    slot: int | None = None           # row of the device state buffers while running
    needs_prefill: bool = True        # new, or resumed after preemption: ids come from the host
    is_resumed: bool = False
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    first_token_step: int | None = None
    finish_step: int | None = None
    error: str | None = None          # why the request failed at run time (finish_reason "error")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def needs_host_history(self) -> bool:
        return bool(self.params.logits_processors)

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    # ---- what a step did for the request (LLM applies each step's results through these) ----
    def start_prefill(self) -> None:
        """Planned into a prefill step: after it the device holds the request's history."""
        self.needs_prefill = self.is_resumed = False

    def record_prefill(self, num_draft: int, num_accepted: int) -> None:
        """A forward over the history: it emits one token, and a resume also the drafts it held
        and accepted (so completion = prefills + verify steps + accepted - truncated holds)."""
        self.stats.num_prefills += 1
        self._record_drafts(num_draft, num_accepted)

    def record_verify(self, num_draft: int, num_accepted: int) -> None:
        self.stats.verify_steps += 1
        self._record_drafts(num_draft, num_accepted)

    def _record_drafts(self, num_draft: int, num_accepted: int) -> None:
        s = self.stats
        if num_draft:
            s.num_drafts += 1
            s.num_draft_tokens += num_draft
            s.num_accepted_tokens += num_accepted
            s.accepted_per_position += [0] * (num_draft - len(s.accepted_per_position))
            for j in range(num_accepted):
                s.accepted_per_position[j] += 1

    def append_output(self, token: int, step: int) -> None:
        self.output_token_ids.append(token)
        if self.first_token_step is None:
            self.first_token_step = step

    def fail(self, error: str) -> None:
        """Something of the request's own failed at run time (a logits processor): it ends alone
        with finish reason "error" when its step's results are read."""
        if self.error is None:
            self.error = error
