"""`specgate bench --measure-load` (engine/bench/load_cost.py): the figures the child prints, the memory
it reads (Linux's /proc/self/status, elsewhere getrusage), the folder's shard sizes, and how the
child is started and how its failure reads. The child's own code runs here in-process on the
tiny benchmark folder, with a stand-in status file and clock, so every figure is a known answer."""
import json
import os
import resource
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

import engine
from engine.bench import load_cost
from engine.bench.load_cost import LoadMeasurement, child_main, measure_load_in_child, memory_mib, shard_figures
from engine.bench.models import SHAPES, tensor_shapes
from engine.errors import SpecgateError
from engine.loader import INDEX_FILE

STATUS = """Name:\tpython3
Umask:\t0022
VmPeak:\t 9999999 kB
VmHWM:\t  525288 kB
VmRSS:\t  263144 kB
RssAnon:\t  132072 kB
RssFile:\t   66536 kB
RssShmem:\t       0 kB
Cpus_allowed_list:\t0-1
"""
OLD_KERNEL_STATUS = "Name:\tpython3\nVmHWM:\t2048 kB\nVmRSS:\t1024 kB\n"  # before Linux 4.5: no RssAnon/RssFile


@pytest.fixture
def status_file(tmp_path, monkeypatch):
    """`status_file(text)`: /proc/self/status as `text` for engine.bench.load_cost (None: no such file)."""
    def use(text: str | None) -> Path:
        path = tmp_path / "status"
        if text is not None:
            path.write_text(text)
        monkeypatch.setattr(load_cost, "PROC_STATUS", path)
        return path
    return use


def test_memory_is_read_from_proc_status_in_mib(status_file):
    status_file(STATUS)
    assert memory_mib() == {"peak": 512.9765625, "now": 256.9765625, "anon": 128.9765625, "file": 64.9765625}
    status_file(STATUS.replace("Name:\tpython3", "Name:\tspecgate: a::b"))  # a value may hold colons
    assert memory_mib()["peak"] == 512.9765625
    status_file(OLD_KERNEL_STATUS)
    assert memory_mib() == {"peak": 2.0, "now": 1.0, "anon": None, "file": None}  # not reported is not zero


@pytest.mark.parametrize("platform, unit", [("linux", 2**10), ("darwin", 2**20)])
@pytest.mark.parametrize("status", [None, "Name:\tpython3\nVmRSS:\t1024 kB\n"], ids=["no-file", "no-VmHWM"])
def test_without_proc_status_the_peak_is_getrusage_s_in_its_platform_s_unit(status_file, monkeypatch, platform, unit,
                                                                            status):
    """getrusage's ru_maxrss is in KiB on Linux and in bytes on macOS."""
    status_file(status)
    monkeypatch.setattr(load_cost, "sys", SimpleNamespace(platform=platform))
    low = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got = memory_mib()
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert low / unit <= got.pop("peak") <= high / unit
    assert got == {"now": None if status is None else 1.0, "anon": None, "file": None}


def tiny_weights_mib(element_size: int) -> float:
    return round(sum(torch.Size(s).numel() for shard in tensor_shapes(SHAPES["tiny"]) for _, s in shard)
                 * element_size / 2**20, 3)


def run_child(capsys, folder: Path, dtype: str | None) -> dict:
    child_main(json.dumps({"model": str(folder), "device": "cpu", "dtype": dtype}))
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_child_prints_the_load_the_touch_and_the_memory_before_and_after(bench_tiny_dir, status_file, monkeypatch,
                                                                           capsys):
    """A clock that advances 0.1234567 s a reading, and a fixed status file (so before and after
    read alike): every figure rounded to 3 decimals, the touch timed on the CPU."""
    status_file(STATUS)
    readings = iter(1000.0 + 0.1234567 * i for i in range(100))
    monkeypatch.setattr(time, "perf_counter", lambda: next(readings))
    assert tiny_weights_mib(2) == 0.205  # the folder's bfloat16
    assert run_child(capsys, bench_tiny_dir, None) == {
        "seconds": 0.123, "weights_mib": 0.205, "peak_rss_mib_before": 512.977, "peak_rss_mib": 512.977,
        "device_peak_mib": None, "touch_seconds": 0.123, "rss_mib_after": 256.977,
        "rss_anon_mib_after": 128.977, "rss_file_mib_after": 64.977}


def test_the_child_loads_in_the_asked_dtype_and_prints_null_for_what_the_platform_lacks(bench_tiny_dir, status_file,
                                                                                      capsys):
    status_file(None)
    low = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    got = run_child(capsys, bench_tiny_dir, "float32")
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    assert got["weights_mib"] == tiny_weights_mib(4) == 0.409
    assert round(low, 3) <= got["peak_rss_mib_before"] <= got["peak_rss_mib"] <= round(high, 3)
    assert got["rss_mib_after"] is got["rss_anon_mib_after"] is got["rss_file_mib_after"] is None
    assert isinstance(got["touch_seconds"], float) and got["seconds"] > 0


def test_on_a_gpu_the_child_makes_the_cuda_context_on_that_gpu_before_the_baseline(monkeypatch):
    """The CUDA context costs host memory that any run pays, so it belongs to the baseline, not to
    the load: it must exist on the named GPU before the first memory reading. torch.zeros, the
    reading and the load are recorded (this machine has no GPU); the tensor's size is no matter."""
    events = []
    monkeypatch.setattr(torch, "zeros", lambda *size, device=None: events.append(("context", device)))
    monkeypatch.setattr(load_cost, "memory_mib",
                        lambda: events.append("memory") or {"peak": 1.0, "now": 1.0, "anon": None, "file": None})

    def measure_load(model_dir, device, dtype):
        events.append(("load", device))
        return LoadMeasurement(0.5, 2.0, 1.0, 1.0, 2.0), None
    monkeypatch.setattr(engine.bench.load_cost, "measure_load", measure_load)
    child_main(json.dumps({"model": "unused", "device": "cuda:1", "dtype": None}))
    assert events == [("context", "cuda:1"), "memory", ("load", "cuda:1"), "memory"]


def test_the_shard_figures_are_the_count_the_largest_and_the_sum_in_mib(tmp_path):
    """Three shards of 1, 3.25 and 2.5 MiB of tensor data, each with a header of some 100 bytes:
    the largest is 3.250 MiB, the sum 6.750 MiB (the headers' 300 bytes are 0.0003 MiB)."""
    weight_map = {}
    for i, mib in enumerate((1, 3.25, 2.5)):
        name = f"model-{i + 1:05d}-of-00003.safetensors"
        save_file({f"t{i}": torch.zeros(int(mib * 2**20), dtype=torch.uint8)}, str(tmp_path / name))
        weight_map[f"t{i}"] = name
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    assert shard_figures(tmp_path) == {"num_shards": 3, "largest_shard_mib": 3.25, "files_mib": 6.75}


@pytest.fixture
def probe(tmp_path, monkeypatch, bench_tiny_dir):
    """`probe(code)`: run measure_load_in_child with a sitecustomize on PYTHONPATH that, as the
    child starts, records the child's environment and then runs `code`; returns the call's
    error and the recorded environment (None if the child was stopped before it wrote it)."""
    folder = tmp_path / "probe"
    folder.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(folder))
    monkeypatch.setenv("SPECGATE_PROBE_OUT", str(tmp_path / "env.json"))

    def run(code: str, timeout: float = 600) -> tuple[Exception, dict | None]:
        (folder / "sitecustomize.py").write_text(
            "import json, os, sys, time\n"
            "with open(os.environ['SPECGATE_PROBE_OUT'], 'w') as f:\n"
            "    json.dump(dict(os.environ), f)\n" + code)
        with pytest.raises(SpecgateError) as failed:
            measure_load_in_child(bench_tiny_dir, "cpu", None, timeout=timeout)
        out = tmp_path / "env.json"
        return failed.value, json.loads(out.read_text()) if out.is_file() else None
    return run


def test_the_child_inherits_the_environment_with_this_repository_first_on_pythonpath(probe):
    error, env = probe("sys.stderr.write('starting\\nstill starting\\nthe last line\\n'); sys.stderr.flush()\n"
                       "os._exit(3)\n")
    repo = Path(engine.__file__).resolve().parent.parent
    assert env["PYTHONPATH"] == os.pathsep.join([str(repo), os.environ["PYTHONPATH"]])
    assert env["SPECGATE_PROBE_OUT"] == os.environ["SPECGATE_PROBE_OUT"]
    assert str(error) == "the load measurement's child process failed (exit 3): the last line"


def test_a_child_that_fails_silently_or_hangs_is_reported(probe, bench_tiny_dir):
    error, _ = probe("os._exit(5)\n")
    assert str(error) == "the load measurement's child process failed (exit 5): no output"
    error, _ = probe("time.sleep(3)\nos._exit(4)\n", timeout=0.3)
    assert str(error) == (f"the load measurement's child process did not finish in 0.3 s (loading {bench_tiny_dir}); "
                          f"it was stopped")
