"""What EngineConfig's device-decided fields resolve to when left None: the fast path on CUDA (the
compiled forward, the graph arm, the paged attention kernel), the reference path on the CPU.
Each resolves once, in EngineConfig, so the runner, the veto and every report read the value run."""
from engine.attention import ATTENTION_BACKENDS
from engine.errors import SpecgateError


def resolve_compile(compile: bool | None, device: str) -> bool:
    """EngineConfig.compile as the engine runs it: as given, or by the device when None."""
    if compile is not None and not isinstance(compile, bool):
        raise SpecgateError(f"compile must be True, False or None (None: compiled on CUDA, the reference "
                            f"forward on the CPU), got {compile!r}")
    return device.startswith("cuda") if compile is None else compile


def resolve_attention_backend(backend: str | None, device: str) -> str:
    """EngineConfig.attention_backend as the engine runs it: as given, or by the device when None:
    the paged Triton kernel on CUDA (faster than sdpa's gather at every context measured, 64 to
    16k tokens: docs/benchmarks.md), sdpa on the CPU (where Triton runs only under its interpreter)."""
    if backend is None:
        return "paged" if device.startswith("cuda") else "sdpa"
    if backend not in ATTENTION_BACKENDS:
        raise SpecgateError(f"attention_backend must be one of {ATTENTION_BACKENDS} or None (None: paged on "
                            f"CUDA, sdpa on the CPU), got {backend!r}")
    return backend


def resolve_graph(graph: bool | None, device: str) -> bool:
    """EngineConfig.graph as the engine runs it: as given, or by the device when None."""
    if graph is not None and not isinstance(graph, bool):
        raise SpecgateError(f"graph must be True, False or None (None: the graph arm on CUDA, the eager arm on "
                            f"the CPU), got {graph!r}")
    return device.startswith("cuda") if graph is None else graph
