"""The environment of the child processes that the proof and the mutation runs start.

A child judges the tree it is given, so nothing of the caller's may steer it: not a lifted veto
(VT_ASYNC_RUNNER), not another model, device or forward for the gates (SPECGATE_*), not a PYTHONPATH entry
that would import the working tree instead of the copy. PYTHONPATH entries outside the repository
stay: packages installed there with `pip install --target` (mutmut's wheels on the GPU machine,
which has no mutmut) are the caller's tools, not its code.
"""
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DROPPED_ENV = ("VT_ASYNC_RUNNER", "SPECGATE_MODEL", "SPECGATE_DRAFTER", "SPECGATE_DEVICE", "SPECGATE_FORWARDS",
               "PYTHONPATH")


def child_env(**overrides: str) -> dict[str, str]:
    """os.environ without DROPPED_ENV, with `overrides` set; PYTHONPATH keeps the caller's absolute
    entries outside the repository, after the override's."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(overrides)
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if _outside_repo(p)]
    paths = [p for p in (overrides.get("PYTHONPATH", ""), *kept) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _outside_repo(entry: str) -> bool:
    """An absolute path that is neither the repository nor inside it (a relative entry would
    name another folder in a child started elsewhere, so it is dropped too)."""
    if not entry or not os.path.isabs(entry):
        return False
    path = Path(entry).resolve()
    return path != REPO and REPO not in path.parents
