"""The proof's matrix and its judgement on synthetic gate results: red where a defect names a gate,
green on the clean tree, stale and unproven gates fail, CUDA gates are skipped without CUDA; and
the Proof's tables and reports."""
import json

import pytest

from gates.report import GateResult
from mutants.proof import matrix
from mutants.proof.catalogue import Defect
from mutants.proof.matrix import CLEAN, GREEN, NEEDS_CUDA, RAN, RED, SKIPPED, STALE, TIMEOUT, TreeRun

NEEDS = {"lossless": "cpu", "combine": "cpu", "emit-count": "cpu", "no-sync": "cuda"}
FAKE = (Defect("stale-drafts", "x", ("combine", "emit-count")),
        Defect("prefill-proposes-nothing", "x", ("emit-count",), token_invisible=True),
        Defect("resample-from-p", "x", ("lossless",)),
        Defect("host-sync-in-device-step", "x", ("no-sync",), needs="cuda"))


def ran(name, **statuses):
    return TreeRun(name, RAN, {g.replace("_", "-"): GateResult("g", status=s, reason="") for g, s in statuses.items()})


def good_runs():
    return {"stale-drafts": ran("stale-drafts", lossless=RED, combine=RED, emit_count=RED),
            "prefill-proposes-nothing": ran("prefill-proposes-nothing", lossless=GREEN, emit_count=RED),
            "resample-from-p": ran("resample-from-p", lossless=RED),
            "host-sync-in-device-step": TreeRun("host-sync-in-device-step", NEEDS_CUDA)}


def clean_run(**over):
    statuses = {"lossless": GREEN, "combine": GREEN, "emit_count": GREEN, "no_sync": SKIPPED, **over}
    return ran(CLEAN, **statuses)


def proof(runs=None, clean=None, has_cuda=False, complete=True, defects=FAKE) -> matrix.Proof:
    return matrix.build_proof(defects, good_runs() if runs is None else runs, clean or clean_run(), NEEDS,
                        has_cuda, complete)


def judge(runs=None, clean=None, has_cuda=False, complete=True, defects=FAKE) -> matrix.Judgement:
    return proof(runs, clean, has_cuda, complete, defects).judgement


def test_all_red_where_named_and_green_on_the_clean_tree_passes_and_cuda_is_skipped_not_failed():
    v = judge()
    assert v.exit_status == 0, v.problems
    assert v.proven == {"lossless": ["resample-from-p"], "combine": ["stale-drafts"],
                        "emit-count": ["stale-drafts", "prefill-proposes-nothing"], "no-sync": []}
    assert any("no-sync needs CUDA" in n for n in v.notes)


@pytest.mark.parametrize("change, problem", [
    (lambda r: setattr(r["stale-drafts"].gates["combine"], "status", GREEN),
     "stale-drafts: gate combine is green, expected red"),
    (lambda r: setattr(r["stale-drafts"].gates["combine"], "status", matrix.ERROR),
     "gate combine is error, expected red"),
    (lambda r: r["stale-drafts"].gates.pop("combine"), "gate combine is not run, expected red"),
    (lambda r: r.update({"stale-drafts": TreeRun("stale-drafts", STALE, detail="hunk 1 matches nowhere")}),
     "stale-drafts: stale, the patch no longer applies (hunk 1 matches nowhere); re-seed it"),
    (lambda r: r.update({"stale-drafts": TreeRun("stale-drafts", TIMEOUT)}), "stale-drafts: timeout"),
    (lambda r: setattr(r["prefill-proposes-nothing"].gates["lossless"], "status", RED),
     "prefill-proposes-nothing: claimed token-invisible, but lossless is red"),
    (lambda r: r.pop("resample-from-p"), "resample-from-p: not run"),
])
def test_a_broken_expectation_fails(change, problem):
    runs = good_runs()
    change(runs)
    v = judge(runs)
    assert v.exit_status == 1
    assert any(problem in p for p in v.problems), v.problems


def test_a_red_gate_on_the_clean_tree_fails():
    v = judge(clean=clean_run(emit_count=RED))
    assert v.exit_status == 1 and any(p.startswith(f"{CLEAN}: gate emit-count is red") for p in v.problems)


def test_a_cpu_gate_proven_against_no_defect_fails_unless_only_some_defects_were_asked_for():
    defects = FAKE[1:]  # nothing names combine any more
    runs = {k: v for k, v in good_runs().items() if k != "stale-drafts"}
    assert "gate combine (cpu) is proven against no defect" in judge(runs, defects=defects).problems
    assert judge(runs, defects=defects, complete=False).exit_status == 0


def test_with_cuda_a_cuda_gate_must_be_red_and_proven():
    runs = good_runs()
    runs["host-sync-in-device-step"] = ran("host-sync-in-device-step", lossless=GREEN, no_sync=GREEN)
    v = judge(runs, clean=clean_run(no_sync=GREEN), has_cuda=True)
    assert "host-sync-in-device-step: gate no-sync is green, expected red" in v.problems
    assert "gate no-sync (cuda) is proven against no defect" in v.problems
    runs["host-sync-in-device-step"].gates["no-sync"].status = RED
    assert judge(runs, clean=clean_run(no_sync=GREEN), has_cuda=True).exit_status == 0


def test_a_token_changing_defect_lossless_missed_is_noted_not_failed():
    defects = FAKE + (Defect("padding-writes-a-real-slot", "x", ("combine",)),)
    runs = {**good_runs(), "padding-writes-a-real-slot": ran("padding-writes-a-real-slot", lossless=GREEN, combine=RED)}
    v = judge(runs, defects=defects)
    assert v.exit_status == 0 and any(n.startswith("padding-writes-a-real-slot: lossless stayed green")
                                      for n in v.notes)


def test_the_matrix_marks_expected_cells_and_broken_ones():
    runs = good_runs()
    runs["stale-drafts"].gates["combine"].status = GREEN
    p = proof(runs)
    table = {r[0]: dict(zip(matrix.rows(p)[0], r)) for r in matrix.rows(p)[1:]}
    assert table["stale-drafts"]["combine"] == "● green ✗" and table["stale-drafts"]["run"] == "FAILED"
    assert table["stale-drafts"]["emit-count"] == "● red" and table["stale-drafts"]["lossless"] == "red"
    assert table["prefill-proposes-nothing"]["lossless"] == "○ green"
    assert table["host-sync-in-device-step"]["run"] == "skipped (needs CUDA)"
    assert table[CLEAN]["no-sync"] == "skipped" and table[CLEAN]["run"] == "ok"
    md = matrix.markdown(p, {"wall_s": 1.0, "jobs": 2, "device": "cpu"})
    assert "| `stale-drafts` |" in md and "**FAIL**" in md and matrix.LEGEND in md


def test_gate_seconds_add_up_over_the_trees_slowest_first():
    runs = good_runs()
    runs["stale-drafts"].gates["combine"].seconds = 3.0
    runs["resample-from-p"].gates["lossless"].seconds = 40.0
    clean = clean_run()
    clean.gates["lossless"].seconds = 39.0
    times = matrix.gate_seconds(runs, clean)
    assert list(times)[0] == "lossless" and times["lossless"] == {"runs": 4, "seconds": 79.0}
    assert "no-sync" not in times  # skipped everywhere


def test_the_report_is_json():
    report = matrix.report(proof(), {"wall_s": 1.0})
    again = json.loads(json.dumps(report))
    assert again["exit_status"] == 0 and [d["name"] for d in again["defects"]] == [d.name for d in FAKE]
