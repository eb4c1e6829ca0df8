"""The veto: the one place that decides whether a run uses the async runner, and hands out
that runner's policy (engine/policy.py: what the two runners do differently).

Speculative decoding with the async runner is refused by default until `make gates` says it
is safe; VT_ASYNC_RUNNER=1 or LLM(..., async_runner=True) lifts the veto for a run, and
VT_ASYNC_RUNNER=0 forces the sync runner. Plain decoding runs async by default.
"""
import logging
import os

from engine.errors import SpecgateError
from engine.policy import RunnerPolicy

log = logging.getLogger("specgate")
ENV_VAR = "VT_ASYNC_RUNNER"


def use_async_runner(spec: str | None, requested: bool | None) -> bool:
    env = os.environ.get(ENV_VAR)
    if env not in (None, "", "0", "1"):
        raise SpecgateError(f"{ENV_VAR} must be 0 or 1, got {env!r}")
    if env == "0":
        return False
    if env == "1" or requested:
        return True
    if requested is False:
        return False
    if spec is not None:
        log.warning("async runner vetoed for speculative decoding (spec=%s): using the sync runner; "
                    "pass --async-runner (specgate generate/bench), set %s=1 or async_runner=True to "
                    "lift the veto once `specgate gates verdict` says LIFT",
                    spec, ENV_VAR)
        return False
    return True


def runner_policy(spec: str | None, requested: bool | None) -> RunnerPolicy:
    return RunnerPolicy(is_async=use_async_runner(spec, requested))
