"""The gpt-fast-style peer (engine/bench/dense_peer.py) on the CPU, uncompiled: its greedy tokens
are specgate's on the same weights (the fixture target: MHA, untied head; the tiny benchmark
shape: GQA), at each concurrency, so the ratio the benchmark prints compares two decoders of one
model; and its report's figures, timed by difference as the transformers peer's are (on CUDA, each
decode fenced by a synchronize, checked with a stand-in GPU queue) and first tokens (specgate's first
16, as the transformers peer keeps them), what it asks torch.compile, and its state (the weights alone)."""
from types import SimpleNamespace

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


def test_on_cuda_each_timed_decode_waits_for_the_work_it_queued_on_the_gpu(monkeypatch):
    """A stand-in CUDA model whose decode of n tokens for c sequences only queues n x c / 100 s of
    GPU work, which the clock sees once torch.cuda.synchronize waits for it (the peer's generate
    reads no token on the host): the figures are the GPU's only when each timed decode is fenced by
    a synchronize on both sides. A step is then c x 10 ms, and each decode's seconds are kept to 0.1 ms."""
    clock, queued = [0.0], [0.0]

    def synchronize() -> None:
        clock[0] += queued[0]
        queued[0] = 0.0

    class QueuingPeer:
        def __init__(self, model, batch: int, max_len: int, compile: bool):
            pass

        def generate(self, prompts: list[list[int]], n: int) -> torch.Tensor:
            queued[0] += n * len(prompts) / 100
            return torch.zeros(len(prompts), n, dtype=torch.long)
    monkeypatch.setattr(dense_peer, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(dense_peer, "DensePeer", QueuingPeer)
    weight = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    got = dense_peer_figures(SimpleNamespace(lm_head=SimpleNamespace(weight=weight)), [[1, 2]] * 2, [1, 2],
                             short=2, long=6, repeats=2, compile=True)
    assert {c: (r["ms_per_step"], r["seconds_short"], r["seconds_long"]) for c, r in got["per_concurrency"].items()} \
        == {"1": (10.0, 0.02, 0.06), "2": (20.0, 0.04, 0.12)}


def test_compiled_the_decode_step_is_asked_of_torch_whole_and_replayed_as_a_cuda_graph(bench_tiny_dir, monkeypatch):
    """What DensePeer asks of torch.compile, checked on any machine (the compile is lazy): its
    decoder, as one graph (fullgraph), in a mode that turns inductor's CUDA graphs on, since the
    peer's figure is a replayed graph's (on CPU tensors inductor leaves CUDA graphs out)."""
    from torch._inductor import list_mode_options
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append((fn, kw)) or fn)
    model = load_model(bench_tiny_dir, dtype=torch.float32)
    assert DensePeer(model, 1, 8, compile=False).step is not None and asked == []
    peer = DensePeer(model, 1, 8, compile=True)
    [(fn, kw)] = asked
    assert fn is peer.decoder and kw.pop("fullgraph") is True
    assert list_mode_options(kw.pop("mode")).get("triton.cudagraphs") is True and kw == {}


def test_the_report_names_the_steps_it_divides_by_and_keeps_tokens_per_second_to_a_hundredth(monkeypatch):
    """A stand-in peer whose decode of n tokens takes 1 s + 3 ms x n whatever the concurrency: the
    method line names the steps between the two decodes (long - short) that the difference is
    divided by, and the throughput, c tokens a 3 ms step, keeps its hundredths (333.33, not 333)."""
    clock = [0.0]

    class SteadyPeer:
        def __init__(self, model, batch: int, max_len: int, compile: bool):
            pass

        def generate(self, prompts: list[list[int]], n: int) -> torch.Tensor:
            clock[0] += 1 + 3e-3 * n
            return torch.zeros(len(prompts), n, dtype=torch.long)
    monkeypatch.setattr(dense_peer, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    monkeypatch.setattr(dense_peer, "DensePeer", SteadyPeer)
    weight = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    got = dense_peer_figures(SimpleNamespace(lm_head=SimpleNamespace(weight=weight)), [[1, 2]] * 2, [1, 2],
                             short=2, long=6, repeats=2, compile=False)
    assert got["method"] == "(t(6 tokens) - t(2)) / 4, medians of 2"
    assert {c: (r["ms_per_step"], r["tokens_per_s"]) for c, r in got["per_concurrency"].items()} == {
        "1": (3.0, 333.33), "2": (3.0, 666.67)}


def test_the_report_whole_names_its_decoder_and_keeps_each_decode_s_seconds_to_a_tenth_of_a_ms(monkeypatch):
    """A stand-in peer whose decode of n tokens for c sequences takes 1 s + n x c / 7 ms: the report
    says what decoder it times, in which dtype, compiled or not, and by what method; a step is c / 7
    ms (0.1429 at c=1), c tokens a step make 7,000 tokens/s, and each decode's median seconds keep
    four decimals (1 + 6/7000 s is 1.0009), as the transformers peer's report does."""
    clock = [0.0]

    class SeventhsPeer:
        def __init__(self, model, batch: int, max_len: int, compile: bool):
            pass

        def generate(self, prompts: list[list[int]], n: int) -> torch.Tensor:
            clock[0] += 1 + n * len(prompts) / 7000
            return torch.arange(n).repeat(len(prompts), 1)
    monkeypatch.setattr(dense_peer, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    monkeypatch.setattr(dense_peer, "DensePeer", SeventhsPeer)
    weight = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16)
    got = dense_peer_figures(SimpleNamespace(lm_head=SimpleNamespace(weight=weight)), [[1, 2]] * 2, [1, 2],
                             short=2, long=6, repeats=2, compile=False)
    assert got == {
        "decoder": "gpt-fast style: fused qkv and gate/up, dense static KV cache, SDPA, greedy",
        "compiled": False, "dtype": "torch.bfloat16", "method": "(t(6 tokens) - t(2)) / 4, medians of 2",
        "per_concurrency": {
            "1": {"ms_per_step": 0.1429, "tokens_per_s": 7000.0, "seconds_short": 1.0003, "seconds_long": 1.0009,
                  "first_tokens": [0, 1, 2, 3, 4, 5]},
            "2": {"ms_per_step": 0.2857, "tokens_per_s": 7000.0, "seconds_short": 1.0006, "seconds_long": 1.0017,
                  "first_tokens": [0, 1, 2, 3, 4, 5]}}}


def test_on_a_cuda_device_the_peer_loads_the_folder_there_and_compiles_each_concurrency_s_decoder(
        bench_tiny_dir, monkeypatch):
    """`bench-model peer`'s dense peer on a CUDA device, run on any machine: the load (to the CPU)
    and torch.compile (eager) are stood in for. It loads the folder's weights on the device it is
    given, in the folder's own dtype, asks torch.compile for each concurrency's decoder, says it
    ran compiled, and decodes the folder's model: its tokens are the eager peer's."""
    from engine import loader
    real_load = loader.load_model
    loaded, asked = [], []

    def load_model(model_dir, **kwargs):
        loaded.append((model_dir, kwargs))
        return real_load(model_dir, dtype=torch.float32)
    monkeypatch.setattr(loader, "load_model", load_model)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(fn) or fn)
    prompts = bench_prompts(2, 5, seed=0)
    got = dense_peer.dense_peer(bench_tiny_dir, prompts, [1, 2], "cuda:0", short=1, long=3, repeats=1)
    assert loaded == [(bench_tiny_dir, {"device": "cuda:0"})]
    assert got["ran"] is True and got["compiled"] is True and got["dtype"] == "torch.float32"
    assert [type(fn).__name__ for fn in asked] == ["DenseDecoder", "DenseDecoder"]
    eager = DensePeer(real_load(bench_tiny_dir, dtype=torch.float32), 1, 8, compile=False).generate(prompts[:1], 3)
    assert [r["first_tokens"] for r in got["per_concurrency"].values()] == [eager[0].tolist()] * 2


def test_the_dense_decoder_is_frozen_like_the_loaded_model_and_records_no_autograd_graph(bench_tiny_dir):
    """The loaded model's weights ask for no gradient; the peer's fused matrices, new tensors, must
    not either: called outside torch.no_grad (as a user of DenseDecoder may), a decode then keeps no
    autograd graph, neither in the caches it writes nor in what it returns."""
    model = load_model(bench_tiny_dir, dtype=torch.float32)
    decoder = DensePeer(model, 1, 8, compile=False).decoder
    assert not any(p.requires_grad for p in decoder.parameters())
    tokens = decoder(torch.tensor(bench_prompts(1, 4, seed=0)), torch.arange(4))
    caches = [c for layer in decoder.layers for c in (layer.k_cache, layer.v_cache)]
    assert tokens.grad_fn is None and not any(c.requires_grad or c.grad_fn is not None for c in caches)


def test_the_report_keeps_specgate_s_first_sixteen_greedy_tokens_however_long_the_timed_decode(bench_tiny_dir):
    """The first tokens a report keeps are the first prompt's first 16, as the transformers peer's
    report keeps them (engine/bench/peer.py), whatever the long decode's length (17 here): they
    compare token for token with specgate's 16 greedy tokens and with the other peer's."""
    prompts = bench_prompts(2, 8, seed=3)
    want = LLM(bench_tiny_dir, dtype="float32", max_model_len=64).generate(
        prompts[:1], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].token_ids
    model = load_model(bench_tiny_dir, dtype=torch.float32)
    got = dense_peer_figures(model, prompts, [1, 2], short=2, long=17, repeats=1, compile=False)
    assert [r["first_tokens"] for r in got["per_concurrency"].values()] == [want] * 2


def test_the_decoder_s_state_is_its_weights_not_its_caches(bench_tiny_dir):
    """The static caches are scratch, sized for one batch and length, as the causal mask is: left
    out of the decoder's state_dict, so its state is the fused weights alone, the same whatever the
    batch and length, and one decoder's state loads into a decoder of another batch and length."""
    model = load_model(bench_tiny_dir, dtype=torch.float32)
    small, large = DensePeer(model, 1, 8, compile=False).decoder, DensePeer(model, 3, 20, compile=False).decoder
    state = small.state_dict()
    assert set(state) == {name for name, _ in small.named_parameters()}
    assert {n: t.shape for n, t in state.items()} == {n: t.shape for n, t in large.state_dict().items()}
    large.load_state_dict(state)
