"""Hypothesis settings for the tests. Batch compositions (several requests, mixed prompt lengths,
arrival steps and max_tokens) are the gates' `Workload`s, drawn by gates.workloads.workloads();
the prompt pool is the gates' too."""
import os

from hypothesis import settings

from gates.workloads import MAX_TOKENS  # noqa: F401 (the tests' bound, with the pool)
from gates.workloads import PROMPTS as PROMPT_POOL  # noqa: F401


def examples(n: int) -> settings:
    """n examples per test; under the mutation profile at most its bound, because a surviving
    mutant pays for every example of every test that covers it."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "mutation":
        n = min(n, settings.get_profile("mutation").max_examples)
    return settings(max_examples=n)
