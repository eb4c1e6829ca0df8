"""Gates and bench on any Llama folder (issue 17, item 6): the block drafter is skipped, with the
reason in the report, on a target it was not trained for; the ngram drafter runs everywhere; the
claims demand the block drafter only where it applies; a gate that ran nothing stays red."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.bench import legs as bench
from engine.block_drafter import mismatch_with_target
from gates import report
from gates.workloads import drafter_skips

REPO = Path(__file__).resolve().parents[2]


def _test(outcome="passed", cases=1):
    return {"nodeid": "g.py::t", "outcome": outcome, "message": None, "seconds": 0.0,
            "cases": [{}] * cases, "measurements": []}


def test_a_waived_drafter_claim_is_not_demanded_but_zero_cases_stay_red():
    claims = ("ngram", "block")
    assert report.gate_status("cpu", [_test()], claims, {"ngram"}, None, False)[0] == report.RED
    assert report.gate_status("cpu", [_test()], claims, {"ngram"}, None, False, waived=("block",))[0] == report.GREEN
    assert report.gate_status("cpu", [_test(cases=0)], claims, {"ngram"}, None, False,
                              waived=("block",))[0] == report.RED
    # Only the named drafter's claim is waived; the others are still demanded.
    status, reason = report.gate_status("cpu", [_test()], claims, {"block"}, None, False, waived=("block",))
    assert status == report.RED and "ngram" in reason


def test_the_block_drafter_applies_to_its_own_target_only(target_dir, drafter_dir, llama3_dir, tmp_path):
    assert mismatch_with_target(drafter_dir, target_dir) is None
    assert drafter_skips(target_dir, drafter_dir) == {}
    assert "hidden_size 192 does not match the target's 64" in mismatch_with_target(drafter_dir, llama3_dir)
    assert set(drafter_skips(llama3_dir, drafter_dir)) == {"block"}  # ngram runs everywhere
    assert "no block drafter folder" in drafter_skips(target_dir, None)["block"]
    # Same shapes, but trained for other weights: named by the drafter's target_sha256.
    other = tmp_path / "drafter"
    shutil.copytree(drafter_dir, other)
    raw = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**raw, "target_sha256": "0" * 64}))
    assert "trained for another target (target_sha256 000000000000" in mismatch_with_target(other, target_dir)




@pytest.mark.slow
def test_lossless_and_emit_count_are_green_on_a_random_llama3_folder(llama3_dir, tmp_path, cli_env):
    """`specgate gates run lossless emit-count --model DIR` on a Llama 3-style folder with its own
    tokenizer: the fixture block drafter does not fit it and is skipped with the reason; every
    ngram case runs, and both gates are green. The random model's bfloat16 streams never repeat a
    bigram, so no n-gram draft can be accepted there: lossless waives that one claim with the
    proof computed from the run, in `waived_claims`."""
    report_path = tmp_path / "gates.json"
    proc = subprocess.run([sys.executable, "-m", "specgate_cli", "gates", "run", "lossless", "emit-count",
                           "--model", str(llama3_dir), "--json", str(report_path)],
                          cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report_json = json.loads(report_path.read_text())
    assert report_json["environment"]["model"] == str(llama3_dir)
    for gate in report_json["gates"]:
        assert gate["status"] == "green", gate["reason"]
        assert "block drafter skipped" in gate["waived_claims"]["block"]
        assert "hidden_size 192 does not match the target's 64" in gate["waived_claims"]["block"]
        assert gate["claims"]["ngram"] is True and gate["claims"]["block"] is False
        if gate["name"] == "lossless":  # this random model's bf16 streams never repeat a bigram: proven, not assumed
            assert "completes a bigram seen before it" in gate["waived_claims"]["bfloat16 drafts accepted"]
        block = [t for t in gate["tests"] if "block" in t["nodeid"].split("[", 1)[-1]]
        ngram = [t for t in gate["tests"] if "ngram" in t["nodeid"].split("[", 1)[-1]]
        assert block and all(t["outcome"] == "skipped" and "block drafter skipped" in t["message"] for t in block)
        assert ngram and all(t["outcome"] == "passed" and t["cases"] > 0 for t in ngram)


def test_bench_runs_on_a_llama3_folder_through_its_tokenizer(llama3_dir, tmp_path, capsys):
    """`specgate bench --model DIR`: the held-out prompts are encoded by the folder's tokenizer."""
    import specgate_cli
    from engine.tokenizer import HFTokenizer
    out = tmp_path / "bench.json"
    assert specgate_cli.main(["bench", "--model", str(llama3_dir), "--spec", "ngram", "--concurrency", "2",
                              "--legs", "2", "--num-prompts", "2", "--max-tokens", "8", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["models"]["target"] and result["spec"] == "ngram"
    legs = result["legs"]
    assert len(legs) == 2 and all(leg["completion_tokens"] == 16 for leg in legs)
    from fixtures.corpus import load_corpus
    workload = bench.heldout_workload(load_corpus(), 2, max_tokens=8)
    tok = HFTokenizer(llama3_dir)
    assert legs[0]["prompt_tokens"] == sum(len(tok.encode(p)) for p in workload.prompts)
    assert result["workload"]["fingerprint"] == workload.fingerprint()


def test_an_unasked_max_model_len_fits_a_model_with_fewer_positions(llama3_dir):
    from engine import LLM
    assert LLM(llama3_dir).config.max_model_len == 256  # max_position_embeddings; 512 otherwise


@pytest.mark.slow
def test_gates_dtype_reaches_the_engine_and_a_random_folder_is_red_on_the_eos_rule_it_never_saw(tmp_path, cli_env):
    """`gates run emit-count --model DIR --dtype float32` on the tiny random bf16 benchmark folder:
    the engine runs in float32 (the report says so), every token and emit-count check passes, and
    the gate is still red, because this model never emits its EOS id in the workload's greedy
    streams: a finish rule the gate could not exercise is never counted as covered."""
    from engine.bench.models import write_bench_model
    folder = write_bench_model("tiny", seed=0, folder=tmp_path / "tiny-seed0")
    report_path = tmp_path / "gates.json"
    proc = subprocess.run([sys.executable, "-m", "specgate_cli", "gates", "run", "emit-count", "--model", str(folder),
                           "--dtype", "float32", "--json", str(report_path)],
                          cwd=REPO, env=cli_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report_json = json.loads(report_path.read_text())
    assert report_json["environment"]["dtype"] == "float32"
    (gate,) = report_json["gates"]
    assert gate["status"] == "red"
    assert {t["outcome"] for t in gate["tests"]} == {"passed", "skipped"}  # every comparison held
    assert gate["reason"].startswith("claimed but never occurred: finished on eos")
