"""What loading a model folder costs, measured in a fresh child process: seconds, and the peak
resident host memory of the process that loads, beside the largest shard it reads.

A child, because a process's high-water mark only grows: one that built or loaded anything
before would report its own past. The child first imports torch (and on CUDA makes its context),
so the baseline it records is what any run pays before the first weight is read.

What the peak means: safetensors maps each shard and copies tensors out of the mapping. On CUDA
every page is read while the tensor goes to the device, then the shard is unmapped, so the peak
above the baseline stays near one shard. On the CPU the loaded tensors keep referring to the
mapped files and pages arrive when first read: the load itself is fast and small, and the child
then reads every parameter once (`touch_seconds`) so that `peak_rss_mib` is the weights resident.
"""
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.config import DTYPES
from engine.errors import SpecgateError
from engine.loader import load_model, weight_files

PROC_STATUS = Path("/proc/self/status")  # Linux's; elsewhere absent


@dataclass(frozen=True)
class LoadMeasurement:
    """What one load_model cost. The peaks are the process's resident high-water marks (getrusage),
    so only a fresh process (`specgate bench --measure-load`) shows the load's own peak."""
    seconds: float
    weights_mib: float                  # bytes of the loaded parameters
    peak_rss_mib_before: float          # the process's high-water mark before the load
    peak_rss_mib: float                 # ... after it
    device_peak_mib: float | None       # CUDA: torch.cuda.max_memory_allocated during the load

    def as_dict(self) -> dict:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


def measure_load(model_dir: str | os.PathLike, device: str = "cpu",
                 dtype: torch.dtype | None = None) -> tuple[LoadMeasurement, torch.nn.Module]:
    """Load time and peak host memory of load_model (the load figures in docs/checkpoints.md), and the
    model it loaded."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    before = rusage_peak_mib()
    t0 = time.perf_counter()
    model = load_model(model_dir, device, dtype)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    device_peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None
    return LoadMeasurement(seconds, weights, before, rusage_peak_mib(), device_peak), model


def measure_load_in_child(model_dir: str | os.PathLike, device: str, dtype: str | None, timeout: float = 600) -> dict:
    """The child's measurement (see `child_main`) and the folder's shard sizes (`shard_figures`)."""
    shards = shard_figures(model_dir)
    request = json.dumps({"model": str(model_dir), "device": device, "dtype": dtype})
    repo = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, "-c", "import sys; from engine.bench.load_cost import child_main; "
                               "child_main(sys.argv[1])", request], capture_output=True, text=True, env=env,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SpecgateError(f"the load measurement's child process did not finish in {timeout:g} s "
                            f"(loading {model_dir}); it was stopped") from None
    if proc.returncode != 0:
        raise SpecgateError(f"the load measurement's child process failed (exit {proc.returncode}): "
                            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no output'}")
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    added = measured["peak_rss_mib"] - measured["peak_rss_mib_before"]
    return {**measured, "load_added_mib": round(added, 3), **shards, "measured_in": "a fresh child process"}


def shard_figures(model_dir: str | os.PathLike) -> dict:
    """How many weight files the folder has, the largest and all of them together, in MiB."""
    sizes = sorted(p.stat().st_size for p in weight_files(model_dir))
    return {"num_shards": len(sizes), "largest_shard_mib": round(sizes[-1] / 2**20, 3),
            "files_mib": round(sum(sizes) / 2**20, 3)}


def rusage_peak_mib() -> float:
    """This process's high-water mark of resident memory by getrusage, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def memory_mib() -> dict:
    """This process's resident memory now and its high-water mark, in MiB: Linux's
    /proc/self/status (the mark, VmHWM, and now, split into anonymous and file-backed pages; None
    for a figure the kernel does not report); elsewhere, or without VmHWM, the mark is getrusage's."""
    mib = dict.fromkeys(("VmHWM", "VmRSS", "RssAnon", "RssFile"))
    if PROC_STATUS.is_file():
        fields = dict(line.split(":", 1) for line in PROC_STATUS.read_text().splitlines() if ":" in line)
        mib.update({name: int(fields[name].split()[0]) / 1024 for name in mib if name in fields})
    if mib["VmHWM"] is None:  # the load's cost is the difference of two marks: never without one
        mib["VmHWM"] = rusage_peak_mib()
    return {"peak": mib["VmHWM"], "now": mib["VmRSS"], "anon": mib["RssAnon"], "file": mib["RssFile"]}


def child_main(request: str) -> None:
    """Load once, print one JSON line: the loader's measurement, the touch time on the CPU, and
    the memory figures before and after."""
    args = json.loads(request)
    device = args["device"]
    if device.startswith("cuda"):
        torch.zeros(1, device=device)  # the CUDA context belongs to the baseline, not to the load
    dtype = DTYPES[args["dtype"]] if args["dtype"] else None
    before = memory_mib()
    m, model = measure_load(args["model"], device, dtype)
    touch_seconds = None
    if not device.startswith("cuda"):
        t0 = time.perf_counter()
        for p in model.parameters():  # page every weight in: the CPU load maps the files lazily
            p.view(-1)[:: max(1, 4096 // p.element_size())].sum()
        touch_seconds = round(time.perf_counter() - t0, 3)
    after = memory_mib()
    r = lambda v: None if v is None else round(v, 3)  # noqa: E731
    print(json.dumps({**m.as_dict(), "touch_seconds": touch_seconds,
                      "peak_rss_mib_before": r(before["peak"]), "peak_rss_mib": r(after["peak"]),
                      "rss_mib_after": r(after["now"]), "rss_anon_mib_after": r(after["anon"]),
                      "rss_file_mib_after": r(after["file"])}))
