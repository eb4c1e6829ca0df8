"""What generate() returns."""
from dataclasses import dataclass

from engine.request import RequestStats


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    stats: RequestStats
    error: str | None = None  # set when finish_reason is "error": the request failed alone


@dataclass(frozen=True)
class RequestDelta:
    """What one step added to one request (LLM.stream, LLM.step_deltas): the tokens it
    committed, and on the request's last delta its finish reason ("stop", "length", "context",
    "error" or "abort"; None while it runs). An aborted request's last delta carries no tokens."""
    request_id: int
    token_ids: list[int]
    finish_reason: str | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None
