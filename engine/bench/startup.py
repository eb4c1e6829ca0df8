"""What an engine costs before its first steady token: building it (the weights' load, the KV cache,
and with graph=True on CUDA every bucket's CUDA graph captured, compiling what the graphs run) and its
first request (where the rest compiles), against the same request run again. Measured in fresh
child processes, twice: with an empty inductor cache ("cold": every kernel built, as on a new
machine) and with the cache the first child filled ("warm": what every later start pays, the
engine keeping inductor's cache under specgate's, engine/compile_cache.py).

A child per measurement, because dynamo keeps what it compiled in the process: a second engine's
start-up in the same process would look free.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.compile_cache import INDUCTOR_CACHE_ENV
from engine.errors import SpecgateError

CACHE_STATES = ("cold", "warm")
# The request timed: every prompt of the engine's largest batch, a few decode steps each.
NUM_PROMPTS, PROMPT_LEN, MAX_TOKENS = 8, 32, 16


@dataclass(frozen=True)
class StartupMeasurement:
    """One engine's start-up in a fresh process (seconds unless said)."""
    engine_s: float            # LLM(...): the load, the KV cache, graph capture (with its compiles) on CUDA
    first_request_s: float     # the first generate: what was not compiled or captured yet is, here
    steady_request_s: float    # the same generate again
    compile_s: float           # dynamo and inductor's own share of both (torch._dynamo.utils.compile_times)
    graphs: int                # CUDA graphs captured
    cache_hits: int            # inductor's on-disk graph cache: kernels found ...
    cache_misses: int          # ... and kernels built
    cache_dir: str | None      # the inductor cache folder the process used

    @property
    def startup_s(self) -> float:
        """Start-up cost: the engine and its first request, less what that request costs once warm."""
        return self.engine_s + self.first_request_s - self.steady_request_s

    def as_dict(self) -> dict:
        return {**{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()},
                "startup_s": round(self.startup_s, 3)}


def measure_startup(model_dir: str | os.PathLike, engine_kwargs: dict, timeout: float = 1800,
                    cache_dir: str | os.PathLike | None = None) -> dict:
    """Cold then warm start-up of LLM(model_dir, **engine_kwargs), each in a child process, on one
    inductor cache folder (default: a new temporary one, emptied at the start, removed at the end)."""
    with tempfile.TemporaryDirectory(prefix="specgate-startup-") as tmp:
        folder = Path(cache_dir or tmp)
        if folder.is_dir() and any(folder.iterdir()):
            raise SpecgateError(f"the cold start-up needs an empty inductor cache folder, {folder} is not")
        runs = {state: run_child(model_dir, engine_kwargs, folder, timeout) for state in CACHE_STATES}
    return {"model": str(model_dir), "engine": engine_kwargs, "torch": torch.__version__,
            "inductor_cache": "a new folder for the cold run, filled by it for the warm run", **runs}


def run_child(model_dir, engine_kwargs: dict, cache_dir: Path, timeout: float) -> dict:
    """One start-up in a fresh process whose inductor (and Triton) cache is `cache_dir`."""
    repo = str(Path(__file__).resolve().parents[2])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}  # Triton's cache goes inside inductor's
    env.update({INDUCTOR_CACHE_ENV: str(cache_dir),
                "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))})
    request = json.dumps({"model": str(model_dir), "engine": engine_kwargs})
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; from engine.bench.startup import child_main; "
                               "child_main(sys.argv[1])", request], capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SpecgateError(f"the start-up measurement's child process did not finish in {timeout:g} s; "
                            f"it was stopped") from None
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output"
        raise SpecgateError(f"the start-up measurement's child process failed (exit {proc.returncode}): {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_main(request: str) -> None:
    """Build the engine, run the request twice, print one JSON line (StartupMeasurement.as_dict)."""
    args = json.loads(request)
    print(json.dumps(startup(args["model"], args["engine"]).as_dict()))


def startup(model_dir, engine_kwargs: dict) -> StartupMeasurement:
    """One engine's start-up, in this process (child_main's body)."""
    import torch._dynamo.utils as dynamo_utils

    from engine import LLM, SamplingParams
    from engine.bench.models import bench_prompts
    device = engine_kwargs.get("device", "cpu")
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # the CUDA context is any run's, not the engine's start-up

    def synchronize():
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    llm = LLM(model_dir, **engine_kwargs)
    synchronize()
    engine_s = time.perf_counter() - t0
    prompts = bench_prompts(NUM_PROMPTS, PROMPT_LEN)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = []
    for _ in range(2):
        t0 = time.perf_counter()
        llm.generate(prompts, params)
        synchronize()
        requests.append(time.perf_counter() - t0)
    inductor = dynamo_utils.counters["inductor"]
    return StartupMeasurement(engine_s, requests[0], requests[1],
                              compile_seconds(dynamo_utils.compilation_time_metrics), len(llm.runner.graphs),
                              inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"],
                              os.environ.get(INDUCTOR_CACHE_ENV))


def compile_seconds(metrics: dict[str, list[float]]) -> float:
    """dynamo's total compile time in this process, from its timing table (name -> seconds per call):
    the sum of its outermost frame's compiles (`_compile.compile_inner`: tracing, inductor and the
    cache lookups); 0 when nothing compiled."""
    return float(sum(metrics.get("_compile.compile_inner", ())))
