"""Hypothesis strategies for batch compositions: several requests, mixed prompt lengths,
arrival steps and max_tokens. `None` for an argument means "let Hypothesis choose"."""
import os
from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st

from gates.workloads import MAX_TOKENS
from gates.workloads import PROMPTS as PROMPT_POOL


def examples(n: int) -> settings:
    """n examples per test; under the mutation profile at most its bound, because a surviving
    mutant pays for every example of every test that covers it."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "mutation":
        n = min(n, settings.get_profile("mutation").max_examples)
    return settings(max_examples=n)


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
