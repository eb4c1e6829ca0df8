"""Hypothesis strategies for batch compositions: several requests, mixed prompt lengths,
arrival steps and max_tokens. `None` for an argument means "let Hypothesis choose"."""
from dataclasses import dataclass

from hypothesis import strategies as st

from gates.workloads import MAX_TOKENS
from gates.workloads import PROMPTS as PROMPT_POOL


@dataclass
class BatchSpec:
    prompts: list[str]
    max_tokens: list[int]
    arrival_steps: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.prompts)


@st.composite
def batches(draw, min_reqs: int = 1, max_reqs: int = 8, long_prompts: bool = False) -> BatchSpec:
    n = draw(st.integers(min_reqs, max_reqs))
    pool = [p for p in PROMPT_POOL if len(p) > 60] if long_prompts else PROMPT_POOL
    prompts = [draw(st.sampled_from(pool)) for _ in range(n)]
    max_tokens = [draw(st.integers(1, MAX_TOKENS)) for _ in range(n)]
    arrivals = [draw(st.integers(0, 6)) for _ in range(n)]
    return BatchSpec(prompts, max_tokens, arrivals)
