"""The transformers peer's harness (engine/bench/peer.py) on the tiny folder on the CPU: every
figure of its report as a known answer on a stand-in clock, the calls it makes to `generate`
(one untimed warm-up, then the timed repeats), greedy whatever the folder's generation config
says, into one static cache of the long call's size."""
import json
from types import SimpleNamespace

import pytest
import torch

from engine import LLM, SamplingParams
from engine.bench import peer as bench_peer
from engine.bench.models import bench_prompts
from engine.bench.peer import is_compiled, peer_figures

transformers = pytest.importorskip("transformers")
SHORT, LONG = 2, 17
PER_TOKEN = {1: 3 / 256, 2: 7 / 256}  # stand-in seconds per generated token, by batch size
SPREAD = [0.0, 1 / 16]                # the timed calls around their median (of 1 here: a second is one too many)


def instrument(model, monkeypatch) -> tuple[list, list]:
    """`generate` on a stand-in clock: a warm-up call of each (batch, length) takes 4 s, the
    i-th timed one 1/8 s + length x PER_TOKEN[batch] + SPREAD[i]; the forward records its cache."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(bench_peer, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    calls, caches = [], []
    real_generate, real_forward = model.generate, model.forward

    def generate(ids, **kwargs):
        key = (ids.shape[0], kwargs["max_new_tokens"])
        index = calls.count(key)
        calls.append(key)
        out = real_generate(ids, **kwargs)
        clock.now += 4.0 if index == 0 else 1 / 8 + key[1] * PER_TOKEN[key[0]] + SPREAD[index - 1]
        return out

    def forward(*args, **kwargs):
        cache = kwargs.get("cache")
        caches.append((type(cache).__name__, cache.get_max_length()))
        return real_forward(*args, **kwargs)
    monkeypatch.setattr(model, "generate", generate)
    monkeypatch.setattr(model, "forward", forward)
    return calls, caches


def test_the_peer_s_report_per_concurrency(bench_tiny_dir, monkeypatch):
    """c=1: the long call's median 1/8 + 17 x 3/256 s, the short one's 1/8 + 2 x 3/256 s, so a
    step is 15 x 3/256 s / 15 = 11.71875 ms and 1,000 / 11.71875 = 85.33 tokens/s; c=2 likewise at
    7/256 s a token. The folder asks for sampling at a high temperature: the peer decodes greedily."""
    model = transformers.LlamaForCausalLM.from_pretrained(bench_tiny_dir, dtype=torch.float32).eval()
    model.generation_config.do_sample, model.generation_config.temperature = True, 50.0
    calls, caches = instrument(model, monkeypatch)
    prompts = bench_prompts(2, 8, seed=3)
    told = []
    torch.manual_seed(0)
    got = peer_figures(model, prompts, [1, 2], SHORT, LONG, repeats=1, progress=told.append)
    greedy = LLM(bench_tiny_dir, dtype="float32", max_model_len=64).generate(
        prompts[:1], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0].token_ids
    assert got == {"transformers": transformers.__version__, "device": "cpu", "dtype": "torch.float32",
                   "method": "(t(max_new_tokens=17) - t(2)) / 15, medians of 1",
                   "per_concurrency": {
                       "1": {"ms_per_step": 11.7188, "tokens_per_s": 85.33, "compiled": False,
                             "seconds_short": 0.1484, "seconds_long": 0.3242, "first_tokens": greedy},
                       "2": {"ms_per_step": 27.3438, "tokens_per_s": 73.14, "compiled": False,
                             "seconds_short": 0.1797, "seconds_long": 0.5898, "first_tokens": greedy}}}
    assert calls == [(1, SHORT)] * 2 + [(1, LONG)] * 2 + [(2, SHORT)] * 2 + [(2, LONG)] * 2
    assert set(caches) == {("StaticCache", len(prompts[0]) + LONG)}
    assert told == ["transformers c=1: 11.719 ms per step", "transformers c=2: 27.344 ms per step"]


def test_compiled_means_transformers_kept_a_compiled_forward():
    assert not is_compiled(SimpleNamespace()) and not is_compiled(SimpleNamespace(_compiled_call=None))
    assert is_compiled(SimpleNamespace(_compiled_call=lambda *args: None))


def timed_generate(monkeypatch) -> list[tuple[int, int, int, int]]:
    """bench_peer.time_generate on a stand-in clock: a call of n new tokens takes n ms and gives
    token 7 n times a prompt; records (batch, max_new_tokens, max_cache_len, repeats)."""
    calls = []

    def time_generate(model, prompts, max_new_tokens, max_cache_len, repeats):
        calls.append((len(prompts), max_new_tokens, max_cache_len, repeats))
        return max_new_tokens / 1e3, [[7] * max_new_tokens for _ in prompts]
    monkeypatch.setattr(bench_peer, "time_generate", time_generate)
    return calls


def test_the_prompt_ids_go_to_the_model_s_device():
    """On a GPU model, ids left on the host would be moved every forward, the logits brought back
    every step, and that transfer counted in the peer's ms per step."""
    devices = []

    def generate(ids, attention_mask, max_new_tokens, **kwargs):
        devices.append((ids.device, attention_mask.device))
        return torch.zeros(ids.shape[0], ids.shape[1] + max_new_tokens, dtype=torch.long)
    model = SimpleNamespace(device=torch.device("meta"), generation_config=SimpleNamespace(), generate=generate)
    _, tokens = bench_peer.time_generate(model, [[1, 2, 3], [4, 5, 6]], max_new_tokens=4, max_cache_len=8, repeats=2)
    assert devices == [(torch.device("meta"),) * 2] * 3 and tokens == [[0] * 4] * 2


def test_a_model_transformers_compiled_is_reported_compiled(monkeypatch):
    """bench_summary says the peer "did NOT compile its forward" from this figure."""
    timed_generate(monkeypatch)
    model = SimpleNamespace(device=torch.device("cuda:0"), dtype=torch.bfloat16, _compiled_call=lambda *args: None)
    got = peer_figures(model, [[1, 2]], [1], SHORT, LONG, repeats=1)
    assert got["per_concurrency"]["1"]["compiled"] is True


def test_the_peer_command_times_the_default_lengths_and_prints_each_figure(bench_tiny_dir, tmp_path, monkeypatch,
                                                                           capsys):
    """`specgate bench-model peer` passes no lengths: what it times, and what its report's method
    says, are the defaults (32 and 160 new tokens, medians of 3), and each figure is printed as it
    comes; the dense peer runs first, compiled, with the same defaults. Only the move to the GPU
    (and the dense peer's compiled timing) is stood in for."""
    import specgate_cli
    from engine import loader
    from engine.bench import dense_peer
    calls, moved_to = timed_generate(monkeypatch), []
    dense_calls = []

    def dense_figures(model, prompts, concurrencies, short, long, repeats, compile, progress=None):
        dense_calls.append((len(prompts), concurrencies, short, long, repeats, compile))
        progress("dense peer c=1: 0.500 ms per step")
        return {"per_concurrency": {"1": {"ms_per_step": 0.5}}}
    monkeypatch.setattr(dense_peer, "dense_peer_figures", dense_figures)
    cpu_load = loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda model_dir, device: cpu_load(model_dir))

    def to(self, device=None, **kwargs):
        moved_to.append(device)
        return torch.nn.Module.to(self, **kwargs)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "to", to)
    report = tmp_path / "peer.json"
    assert specgate_cli.main(["bench-model", "peer", "--model", str(bench_tiny_dir), "--device", "cuda",
                              "--concurrency", "1", "--prompt-len", "8", "--json", str(report)]) == 0
    assert moved_to == ["cuda"] and calls == [(1, 32, 8 + 160, 3), (1, 160, 8 + 160, 3)]
    written = json.loads(report.read_text())
    assert written["method"] == "(t(max_new_tokens=160) - t(32)) / 128, medians of 3"
    assert dense_calls == [(1, [1], 32, 160, 3, True)]
    assert written["dense"] == {"ran": True, "per_concurrency": {"1": {"ms_per_step": 0.5}}}
    err = capsys.readouterr().err
    assert "specgate: transformers c=1: 1.000 ms per step" in err and "specgate: dense peer c=1: 0.500 ms" in err
