"""The 1B benchmark's CPU-side logic (engine/bench/decode.py, bench_peer.py, bench_summary.py):
the HBM floor's arithmetic against issue 18's own figures and against a loaded model, the decode
timer's window on the tiny shape, the transformers peer's harness, and the summary's ratios,
targets, table and plot. The GPU figures themselves come from scripts/gpu-check.sh bench1b."""
import json

import pytest
import torch

from engine import LLM
from engine.bench.decode import floor_ms, mean_context, plain_step_bytes, time_decode
from engine.bench.models import SHAPES, bench_prompts, config_dict
from engine.bench.peer import time_generate, transformers_peer
from engine.bench.summary import plot, summarize, table
from engine.config import ModelConfig
from engine.loader import load_model

pytestmark = pytest.mark.xdist_group("hf-folders")


def test_the_floor_of_the_1b_shape_is_issue_18s():
    """1.95 GB per plain step at c=1; at the measured 4.27 TB/s, 0.456 ms."""
    cfg = ModelConfig.from_dict(config_dict(SHAPES["llama-1b"]))
    step = plain_step_bytes(cfg, 2, batch=1, context_len=mean_context(64, 128))
    assert step.weights / 1e9 == pytest.approx(1.947, abs=1e-3)
    assert step.kv == 128 * 16 * 2 * 8 * 64 * 2  # positions x layers x (K, V) x kv heads x head dim x bf16
    assert floor_ms(step, 4.27e12) == pytest.approx(0.457, abs=1e-3)
    eight = plain_step_bytes(cfg, 2, batch=8, context_len=128)
    assert eight.kv == 8 * step.kv and eight.weights - step.weights == 7 * 2048 * 2  # 7 more embedding rows


@pytest.mark.parametrize("tied", [False, True])
def test_the_floor_counts_every_loaded_weight_once(bench_tiny_dir, tmp_path, tied):
    folder = bench_tiny_dir
    if tied:  # the same shape with a tied head: the head is the embedding table, read once
        raw = {**config_dict(SHAPES["tiny"]), "tie_word_embeddings": True}
        cfg = ModelConfig.from_dict(raw)
    else:
        cfg = ModelConfig.from_dir(folder)
    model = load_model(folder)
    params = sum(p.numel() for p in model.parameters())
    embed = cfg.vocab_size * cfg.hidden_size
    expected = params - embed + 3 * cfg.hidden_size if not tied else params - embed
    assert plain_step_bytes(cfg, 4, batch=3, context_len=10).weights == 4 * expected


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_the_decode_window_counts_every_decoded_token(bench_tiny_dir, async_runner):
    llm = LLM(bench_tiny_dir, max_model_len=64, max_num_seqs=4, async_runner=async_runner)
    prompts = bench_prompts(3, 8)
    leg = time_decode(llm, prompts, max_tokens=12)
    # The first token comes from the prefill; the window holds the other 11 and closes when the
    # requests finish (the async runner's step launched past the end is drained untimed, though
    # the window's closing synchronize waits for its GPU work).
    assert leg.decode_tokens == 11
    assert leg.steps == 11 and leg.seconds > 0
    assert leg.ms_per_step == pytest.approx(leg.seconds * 1e3 / leg.decode_tokens, rel=1e-3)
    assert leg.tokens_per_s == pytest.approx(3 * leg.decode_tokens / leg.seconds, rel=1e-3)
    assert not llm.has_unfinished()


def test_the_peer_runs_on_cuda_only_and_its_harness_decodes_what_specgate_decodes(bench_tiny_dir):
    transformers = pytest.importorskip("transformers")
    assert transformers_peer(bench_tiny_dir, bench_prompts(1, 8), [1], "cpu") == {
        "ran": False, "why": "the peer runs on CUDA only (device cpu): transformers compiles a static-cache "
                             "generate only on a GPU"}
    # The same harness, uncompiled on the CPU in float32: the batch's greedy tokens are specgate's.
    prompts = bench_prompts(2, 10, seed=3)
    model = transformers.LlamaForCausalLM.from_pretrained(bench_tiny_dir, dtype=torch.float32).eval()
    seconds, tokens = time_generate(model, prompts, max_new_tokens=16, max_cache_len=40, repeats=1)
    llm = LLM(bench_tiny_dir, dtype="float32", max_model_len=64)
    from engine import SamplingParams
    ours = [o.token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))]
    assert seconds > 0 and tokens == ours


def _decode(ms: dict[str, dict[str, float]], floor=None) -> dict:
    floor = floor or {"1": 0.46, "8": 0.47}
    return {"model": "m", "device": "cuda", "dtype": "bfloat16", "torch": "2.11", "gpu": "H200",
            "workload": {"prompt_len": 64, "max_tokens": 128}, "bandwidth_bytes_per_s": 4.27e12,
            "floor": {c: {"ms": f} for c, f in floor.items()},
            "arms": {arm: {c: {"ms_per_step": v, "tokens_per_s": 1e3 / v} for c, v in per_c.items()}
                     for arm, per_c in ms.items()}}


def _bench(spec, c_rates: dict[str, tuple[float, float]]) -> dict:
    return {"spec": spec, "summary": {c: {"tokens_per_s_mean": rate, "acceptance": {"mean_acceptance_length": tau}}
                                      for c, (rate, tau) in c_rates.items()}}


def test_the_summary_states_each_target_met_or_missed():
    decode = _decode({"graph/sync": {"1": 4.2, "8": 4.65}, "graph/async/compiled": {"1": 0.874, "8": 1.0}})
    peer = {"ran": True, "transformers": "5.24.0",
            "per_concurrency": {"1": {"ms_per_step": 2.23, "compiled": True},
                                "8": {"ms_per_step": 2.58, "compiled": True}}}
    load = {"seconds": 1.5, "device": "cuda", "peak_rss_mib": 900.0, "peak_rss_mib_before": 400.0,
            "load_added_mib": 500.0, "largest_shard_mib": 465.0, "files_mib": 1858.0, "num_shards": 4}
    spec = {"plain": _bench(None, {"1": (1000.0, 1.0)}), "oracle-4.3": _bench("oracle", {"1": (3100.0, 4.3)}),
            "oracle-2.5": _bench("oracle", {"1": (2000.0, 2.5)})}
    s = summarize(decode, peer, load, spec)
    assert s["rows"]["1"]["graph/async/compiled"] == {
        "ms_per_step": 0.874, "floor_ratio": 1.9, "tokens_per_s": 1e3 / 0.874, "peer_speedup": round(2.23 / 0.874, 3)}
    assert s["rows"]["8"]["graph/sync"]["floor_ratio"] == round(4.65 / 0.47, 3)
    assert [(t["target"], t["met"]) for t in s["targets"]] == [
        ("graph/async/compiled c=1 at most 1.9x the HBM floor", True),
        ("graph/async/compiled c=1 at least 2.3x faster than transformers", True),
        ("graph/async/compiled c=8 at most 2.1x the HBM floor", False),
        ("graph/async/compiled c=8 at least 2.3x faster than transformers", True),
        ("spec oracle-4.3 (τ 4.30) c=1 at least 3.3x plain tokens/s", False)]
    text = table(s)
    assert "graph/async/compiled" in text and "0.874 (1.90x floor)" in text and "2.230 (2.55x best)" in text
    assert "bench oracle-2.5 c=1: 2000.0 tokens/s τ 2.50, 2.00x plain" in text
    assert "peak host memory 900 MiB (500 MiB over the 400 MiB baseline; largest of 4 shards 465.0 MiB" in text
    assert text.splitlines()[-1] == "target MISSED spec oracle-4.3 (τ 4.30) c=1 at least 3.3x plain tokens/s: 3.1"
    assert "target MISSED graph/async/compiled c=8 at most 2.1x the HBM floor: 2.128" in text
    assert "did NOT compile" not in text
    peer["per_concurrency"]["8"]["compiled"] = False
    assert "transformers peer: transformers 5.24.0 did NOT compile its forward" in table(summarize(decode, peer))
    json.dumps(s)  # the summary is the JSON the script writes


def test_the_summary_of_a_partial_run_says_what_did_not_run(tmp_path):
    s = summarize(_decode({"graph/async/compiled": {"1": 0.9}}, floor={"1": 0.46}),
                  {"ran": False, "why": "the peer runs on CUDA only (device cpu)"})
    assert [t["met"] for t in s["targets"]] == [False] and s["spec_rows"] == []
    assert "transformers peer: not run (the peer runs on CUDA only (device cpu))" in table(s)
    assert summarize(None)["targets"] == [] and table(summarize(None)) == ""
    plot(s, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_decode_command_writes_the_floor_and_every_arm(bench_tiny_dir, tmp_path, capsys):
    import specgate_cli
    out = tmp_path / "decode.json"
    assert specgate_cli.main(["bench-model", "decode", "--model", str(bench_tiny_dir), "--concurrency", "1,2",
                              "--prompt-len", "8", "--max-tokens", "6", "--legs", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["arms"]) == {"graph/sync", "graph/async"} and set(report["floor"]) == {"1", "2"}
    # Two requests read more bytes than one (exact); the milliseconds are those bytes over a measured
    # bandwidth, rounded to 4 places, so on a fast copy of a tiny model they may round alike.
    floor = report["floor"]
    assert report["bandwidth_bytes_per_s"] > 0 and floor["2"]["bytes"] > floor["1"]["bytes"]
    assert floor["2"]["ms"] >= floor["1"]["ms"] > 0
    for per_c in report["arms"].values():
        assert all(per_c[c]["ms_per_step"] > 0 and len(per_c[c]["legs"]) == 1 for c in ("1", "2"))
    assert "graph/async c=2:" in capsys.readouterr().out

