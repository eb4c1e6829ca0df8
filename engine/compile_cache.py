"""Where what a run builds is kept for the next one: specgate's cache folder, and inductor's
compiled kernels inside it.

torch keeps inductor's kernels under the temporary folder by default (torchinductor_$USER in
/tmp), which a reboot, or a TMPDIR of its own per run (`specgate prove` gives each gate run one),
empties; the next compile then builds every kernel again. On two CPU cores the fixture engine's
compile=True start-up took 98 s with an empty cache and 28 s with a warm one; vLLM keeps its
compiled graphs under ~/.cache/vllm for the same reason.
"""
import os
from pathlib import Path

CACHE_ENV = "SPECGATE_CACHE"
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"  # inductor's own setting (torch._inductor.runtime.cache_dir_utils)


def specgate_cache() -> Path:
    """$SPECGATE_CACHE, else ~/.cache/specgate: benchmark model folders, inductor's kernels."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "specgate")


def inductor_cache_dir() -> Path:
    """The folder inductor keeps its kernels in: $TORCHINDUCTOR_CACHE_DIR when set (by the user,
    or by inductor itself once it compiled in this process), else specgate's cache's `inductor`
    folder, which this sets for the process (inductor reads the variable at each compile)."""
    given = os.environ.get(INDUCTOR_CACHE_ENV)
    if given:
        return Path(given)
    path = specgate_cache() / "inductor"
    os.environ[INDUCTOR_CACHE_ENV] = str(path)
    return path
