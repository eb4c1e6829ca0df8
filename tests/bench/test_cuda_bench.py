"""The benchmark code's CUDA branches, on a GPU only (skipped elsewhere): what on the GPU only
`scripts/gpu-check.sh` ran before. With these in the CUDA suite, the GPU machine's mutation run
(`specgate mutate --cuda-only`) can judge the mutants no CPU test tells apart: the oracle
proposer's tensors on the engine's device, the distribution checks' dense forward, the kernel
count's CUDA events, a bench leg's GPU time, the load measured in a child (and the child's body),
the copy bandwidth and the decode report's GPU,
the matmul timer's CUDA graph, and the transformers peer."""
import json
import math
import os

import numpy as np
import pytest
import torch

from conftest import TensorCopies  # tests/conftest.py
from engine import SamplingParams
from engine.bench.workload import Workload

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15]]


def test_the_oracle_engine_on_cuda_gives_the_plain_tokens(make_llm):
    from engine.bench.legs import oracle_script
    from engine.bench.oracle import oracle_proposer
    workload = Workload(PROMPTS, max_tokens=(24, 16, 30), arrival_steps=(0, 1, 3))
    plain = make_llm(device="cuda", max_num_seqs=4)
    outs = plain.generate(workload.prompt_list(), workload.params(ignore_eos=True), arrival_steps=workload.arrivals())
    oracle = make_llm(device="cuda", spec="oracle", num_spec_tokens=4, max_num_seqs=4, async_runner=True,
                      proposer=oracle_proposer(oracle_script(plain, workload, 4, 3.0)))
    got = oracle.generate(workload.prompt_list(), workload.params(ignore_eos=True), arrival_steps=workload.arrivals())
    assert [o.token_ids for o in got] == [o.token_ids for o in outs]
    assert sum(o.stats.num_accepted_tokens for o in got) > 0


def test_sequence_probs_of_a_cuda_model_are_the_cpu_model_s(make_llm):
    from gates.distribution import sequence_probs
    sp = SamplingParams(temperature=1.0, max_tokens=12, seed=3, ignore_eos=True)
    cpu = make_llm(dtype="float32")
    out = cpu.generate([PROMPTS[0]], [sp])[0]
    on_cuda = sequence_probs(make_llm(device="cuda", dtype="float32").model, out, sp)
    np.testing.assert_allclose(on_cuda, sequence_probs(cpu.model, out, sp), atol=1e-5)


def test_the_kernel_count_on_cuda_counts_the_kernels_of_each_decode_step(make_llm):
    from engine.bench.kernel_count import count_kernels
    llm = make_llm(device="cuda", spec="ngram", num_spec_tokens=2, max_num_seqs=3, async_runner=True)
    got = count_kernels(llm, Workload.uniform(PROMPTS, max_tokens=40), max_steps=4)
    assert (got["counted"], got["steps"], got["num_reqs"], got["k"]) == ("CUDA kernels", 4, 3, 2)
    assert got["kernels_per_step"] > 10 and got["kernel_us_per_step"]
    assert not llm.has_unfinished()


def test_the_load_on_cuda_is_measured_in_a_child_with_the_device_s_peak(target_dir):
    from engine.bench.load_cost import measure_load_in_child
    got = measure_load_in_child(target_dir, "cuda", None)
    assert got["touch_seconds"] is None  # the load copied every weight to the device: nothing left to page in
    assert got["device_peak_mib"] >= got["weights_mib"] > 0


def test_the_load_child_on_cuda_reads_onto_the_device_and_touches_nothing(target_dir, capsys):
    """child_main in this process (the child's body, which mutmut can follow): on CUDA the load's
    device peak is measured and no weight is paged in on the host."""
    from engine.bench.load_cost import child_main
    child_main(json.dumps({"model": str(target_dir), "device": "cuda", "dtype": None}))
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["touch_seconds"] is None
    assert got["device_peak_mib"] >= got["weights_mib"] > 0


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_bench_leg_on_cuda_times_every_step_s_device_work(make_llm, graph):
    """Every step's GPU time, and apart the steps replayed as one CUDA graph: in the graph arm its
    decode and verify steps, not the prefills (which run eagerly); in the eager arm none."""
    from engine.bench.legs import run_leg
    llm = make_llm(device="cuda", spec="ngram", num_spec_tokens=2, max_num_seqs=3, async_runner=True, graph=graph)
    leg = run_leg(llm, Workload(PROMPTS, max_tokens=(12, 8, 16), arrival_steps=(0, 1, 2)), 3, 0, 0)
    assert leg.phases["steps"] > 1 and leg.phases["gpu_steps"] == leg.phases["steps"]
    assert leg.phases["gpu_ms_per_step"] > 0 and "CPU" not in leg.phases["clock"]
    if graph:
        assert 0 < leg.phases["graph_steps"] < leg.phases["steps"] and leg.phases["graph_gpu_ms_per_step"] > 0
        assert leg.phases["graph_steps"] == llm.runner.num_graph_replays
    else:
        assert leg.phases["graph_steps"] == 0 and leg.phases["graph_gpu_ms_per_step"] is None


def test_the_copy_bandwidth_on_cuda_is_a_device_copy():
    """Told by where the bytes are, not by a speed: a host-timed figure measures whatever else
    shares the GPU (a mutation run's children: a floor of 200 GB/s made false kills)."""
    from engine.bench.decode import copy_bandwidth
    with TensorCopies() as copies:
        bandwidth = copy_bandwidth("cuda", mib=64)
    assert len(copies.calls) == 11  # the warm-up and the ten timed copies
    assert all(dst.is_cuda and src.is_cuda and src.nbytes == dst.nbytes == 64 * 2**20
               for dst, src, _ in copies.calls)
    assert math.isfinite(bandwidth) and bandwidth > 0


def test_the_decode_report_on_cuda_names_the_gpu(bench_tiny_dir):
    from engine.bench.decode import decode_report
    report = decode_report(bench_tiny_dir, "cuda", ["sync"], "eager", [1], prompt_len=8, max_tokens=8, legs=1)
    assert report["gpu"] == torch.cuda.get_device_name(0)
    assert math.isfinite(report["bandwidth_bytes_per_s"]) and report["bandwidth_bytes_per_s"] > 0
    assert set(report["arms"]) == {"eager/sync"}


def test_the_transformers_peer_runs_on_cuda(bench_tiny_dir):
    from engine.bench.models import bench_prompts
    from engine.bench.peer import transformers_peer
    got = transformers_peer(bench_tiny_dir, bench_prompts(1, 8, seed=0), [1], "cuda", short=2, long=6, repeats=1)
    assert got["ran"] is True and got["dtype"] == "torch.bfloat16" and got["device"] == "cuda:0"
    assert list(got["per_concurrency"]) == ["1"] and len(got["per_concurrency"]["1"]["first_tokens"]) == 6


def test_the_matmul_benchmark_times_each_variant_in_a_cuda_graph(tmp_path):
    from engine.bench.matmul import VARIANTS, matmul_report
    from engine.bench.models import SHAPES, config_dict
    from engine.config import ModelConfig
    (tmp_path / "config.json").write_text(json.dumps(config_dict(SHAPES["tiny"])))
    got = matmul_report(ModelConfig.from_dir(tmp_path), "cuda", rows=(1, 8), reps=10, repeats=2)
    assert got["gpu"] == torch.cuda.get_device_name(0) and len(got["timings"]) == 5 * 2 * len(VARIANTS)
    assert all(t["microseconds"] > 0 for t in got["timings"]) and set(got["per_step_us"]) == {"1", "8"}


def test_the_matmul_timer_reads_one_call_s_gpu_time():
    """time_call's CUDA figure (`reps` calls captured in one graph, the replay timed with CUDA
    events) against an independent one: the same matmul launched `reps` times eagerly between two
    events. The matrix (8192 x 8192 bf16, 128 MiB: tens of µs a call, several launches' time) keeps
    the eager loop GPU-bound, so the two agree within 1.5x; a timer that read the host's launch
    time, or scaled ms to s or per call wrongly, is off by 5x to 10^6."""
    import torch.nn.functional as F

    from engine.bench.matmul import time_call
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
    x = torch.randn(8, 8192, device="cuda", dtype=torch.bfloat16, generator=g)
    got = time_call(F.linear, x, w, reps=20, repeats=3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(20):
        F.linear(x, w)
    end.record()
    end.synchronize()
    eager = start.elapsed_time(end) / 1e3 / 20
    assert eager / 1.5 < got < eager * 1.5, (got, eager)


def test_the_dense_peer_compiled_on_cuda_decodes_specgate_s_tokens(bench_tiny_dir):
    """The gpt-fast-style peer compiled and replayed as a CUDA graph decodes specgate's greedy tokens
    (both in float32: two bf16 implementations may part at a near tie of random weights), and
    `bench-model peer` runs it in the folder's bf16."""
    from engine import LLM
    from engine.bench.dense_peer import dense_peer, dense_peer_figures
    from engine.bench.models import bench_prompts
    from engine.loader import load_model
    prompts = bench_prompts(2, 8, seed=0)
    model = load_model(bench_tiny_dir, device="cuda", dtype=torch.float32)
    got = dense_peer_figures(model, prompts, [1, 2], short=2, long=6, repeats=1, compile=True)
    want = LLM(bench_tiny_dir, device="cuda", dtype="float32", max_model_len=64).generate(
        prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [got["per_concurrency"][c]["first_tokens"] for c in ("1", "2")] == [want[0].token_ids] * 2
    # Timed by difference: 4 steps of a tiny model are within the clock's noise (the H200 read a
    # negative difference at short=2, long=6), 32 are not.
    bf16 = dense_peer(bench_tiny_dir, prompts, [1], "cuda", short=2, long=34, repeats=3)
    assert bf16["ran"] and bf16["compiled"] and bf16["dtype"] == "torch.bfloat16"
    assert all(r["ms_per_step"] > 0 for r in bf16["per_concurrency"].values())


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "mutation",
                    reason="the children import the tree, not mutmut's copy; dynamo cannot trace its trampolines")
def test_the_start_up_on_cuda_compiles_by_default_and_finds_its_kernels_warm(target_dir):
    """compile unset on CUDA: the compiled forward, graphs captured at start-up; the cold child builds
    kernels into the new cache folder, the warm child finds them there and builds none."""
    from engine.bench.startup import measure_startup
    got = measure_startup(target_dir, {"device": "cuda", "spec": "ngram", "num_spec_tokens": 3, "graph": True,
                                       "max_num_seqs": 4})
    cold, warm = got["cold"], got["warm"]
    assert cold["graphs"] == warm["graphs"] > 0 and cold["cache_dir"] == warm["cache_dir"]
    assert cold["cache_misses"] > 0 and warm["cache_misses"] == 0 and warm["cache_hits"] > 0
    assert 0 < warm["compile_s"] < cold["compile_s"]


def test_a_matmul_timing_reads_its_weight_from_memory_not_from_l2(tmp_path):
    """A weight read from memory cannot beat the memory's bandwidth: every matrix of the 1B shape
    (o_proj's 8 MB and down's 32 MB both under the H100's 50 MB L2) times at most 1.05x the copy
    bandwidth measured here. One weight called 100 times in a row read down at 3,368 GB/s against a
    copy bandwidth of about 2,970 on an H100 (2026-12-05): the L2 served it."""
    from engine.bench.decode import copy_bandwidth
    from engine.bench.matmul import matmul_report
    from engine.bench.models import SHAPES, config_dict
    from engine.config import ModelConfig
    (tmp_path / "config.json").write_text(json.dumps(config_dict(SHAPES["llama-1b"])))
    got = matmul_report(ModelConfig.from_dir(tmp_path), "cuda", rows=(1,), variants=("eager",))
    copy_gbps = copy_bandwidth("cuda", mib=1024) / 1e9  # the decode floor's own reference, 1 GiB past any L2
    fastest = max(t["gb_per_s"] for t in got["timings"])
    assert fastest <= 1.05 * copy_gbps, (got["timings"], copy_gbps)
