"""Gates and bench on any Llama folder (issue 17, item 6): the block drafter is skipped, with the
reason in the report, on a target it was not trained for; the ngram drafter runs everywhere; the
claims demand the block drafter only where it applies; a gate that ran nothing stays red."""
import json
import shutil

import pytest

from engine.block_drafter import mismatch_with_target
from gates import report
from gates.workloads import drafter_skips


def _test(outcome="passed", cases=1):
    return {"nodeid": "g.py::t", "outcome": outcome, "message": None, "seconds": 0.0,
            "cases": [{}] * cases, "measurements": []}


def test_a_waived_drafter_claim_is_not_demanded_but_zero_cases_stay_red():
    claims = ("ngram", "block")
    assert report.verdict("cpu", [_test()], claims, {"ngram"}, None, False)[0] == report.RED
    assert report.verdict("cpu", [_test()], claims, {"ngram"}, None, False, waived=("block",))[0] == report.GREEN
    assert report.verdict("cpu", [_test(cases=0)], claims, {"ngram"}, None, False, waived=("block",))[0] == report.RED
    # Only the named drafter's claim is waived; the others are still demanded.
    status, reason = report.verdict("cpu", [_test()], claims, {"block"}, None, False, waived=("block",))
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


