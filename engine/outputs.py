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
