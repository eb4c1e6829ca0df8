"""The environment of the child processes that the proof and the mutation runs start.

A child judges the tree it is given, so nothing of the caller's may steer it: not a lifted veto
(VT_ASYNC_RUNNER), not another model or device for the gates (SPECGATE_*), not a PYTHONPATH that
would import the working tree instead of the copy.
"""
import os

DROPPED_ENV = ("VT_ASYNC_RUNNER", "SPECGATE_MODEL", "SPECGATE_DRAFTER", "SPECGATE_DEVICE", "PYTHONPATH")


def child_env(**overrides: str) -> dict[str, str]:
    """os.environ without DROPPED_ENV, with `overrides` set."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(overrides)
    return env
