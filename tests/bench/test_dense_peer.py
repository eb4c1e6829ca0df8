"""The gpt-fast-style peer (engine/bench/dense_peer.py) on the CPU, uncompiled: its greedy tokens
are specgate's on the same weights (the fixture target: MHA, untied head; the tiny benchmark
shape: GQA), at each concurrency, so the ratio the benchmark prints compares two decoders of one
model; and its report's figures, timed by difference as the transformers peer's are."""
import pytest
import torch

from engine import LLM, SamplingParams
from engine.bench import dense_peer
from engine.bench.dense_peer import DensePeer, dense_peer_figures
from engine.bench.models import bench_prompts
from engine.loader import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.mark.parametrize("folder", ["target_dir", "bench_tiny_dir"])
def test_the_dense_peer_decodes_what_specgate_decodes(request, folder):
    model_dir = request.getfixturevalue(folder)
    prompts = bench_prompts(3, 9, seed=1)
    want = [o.token_ids for o in LLM(model_dir, dtype="float32", max_model_len=64).generate(prompts, GREEDY)]
    model = load_model(model_dir, dtype=torch.float32)
    for c in (1, 3):
        got = DensePeer(model, c, 9 + GREEDY.max_tokens, compile=False).generate(prompts[:c], GREEDY.max_tokens)
        assert got.tolist() == want[:c]


def test_the_report_times_each_concurrency_by_difference(bench_tiny_dir, monkeypatch):
    """A stand-in clock where a decode of n tokens for c sequences takes 1 + n x c / 100 s: a step is
    c x 10 ms whatever the short and long lengths, after one untimed call of each."""
    clock = [0.0]
    monkeypatch.setattr(dense_peer, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    real = DensePeer.generate
    calls = []

    def generate(self, prompts, n):
        calls.append((len(prompts), n))
        clock[0] += 1 + n * len(prompts) / 100
        return real(self, prompts, n)
    monkeypatch.setattr(DensePeer, "generate", generate)
    model = load_model(bench_tiny_dir, dtype=torch.float32)
    prompts = bench_prompts(2, 5, seed=0)
    told = []
    got = dense_peer_figures(model, prompts, [1, 2], short=2, long=6, repeats=2, compile=False, progress=told.append)
    assert calls == [(c, n) for c in (1, 2) for n in (2, 6) for _ in range(3)]
    assert {c: r["ms_per_step"] for c, r in got["per_concurrency"].items()} == {"1": 10.0, "2": 20.0}
    assert got["per_concurrency"]["2"]["tokens_per_s"] == 100.0 and not got["compiled"]
    first = DensePeer(model, 1, 11, compile=False).generate(prompts[:1], 6)[0].tolist()
    assert got["per_concurrency"]["1"]["first_tokens"] == first
    assert told == ["dense peer c=1: 10.000 ms per step", "dense peer c=2: 20.000 ms per step"]


def test_the_dense_peer_runs_on_cuda_only(bench_tiny_dir):
    got = dense_peer.dense_peer(bench_tiny_dir, bench_prompts(1, 4), [1], "cpu")
    assert got == {"ran": False, "why": "the dense peer runs on CUDA only (device cpu): its figure is a compiled "
                                        "decode step replayed as a CUDA graph"}
