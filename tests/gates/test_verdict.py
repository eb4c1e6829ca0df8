"""The veto's verdict (gates/verdict.py) on synthetic gate reports: LIFT only when every gate is
green on CUDA, the forward-dependent ones with both forwards, and speed-ab's graph arm is ahead
beyond the floor; KEEP, with the reason, otherwise."""
import json

import pytest

from gates import verdict
from gates.cli import main
from helpers.gate_reports import TREE, ab, cpu_report, decide, gate, model_report, on_own_folder, report, speed_figures


def test_every_gate_green_on_cuda_with_the_graph_arm_ahead_is_lift():
    v = decide([report()])
    assert v.decision == verdict.LIFT, v.reasons
    assert v.line.startswith("verdict: LIFT")


def test_cpu_only_is_keep_and_names_the_gpu_gates_that_did_not_run():
    v = decide([cpu_report()])
    assert v.decision == verdict.KEEP
    assert any("no report ran on CUDA" in r for r in v.reasons)
    for name in ("busy", "no-sync", "speed-ab", "lossless"):
        assert any(r.startswith(f"{name} is not green on CUDA") for r in v.reasons), name
    assert any(r.startswith("busy is not green on CUDA: skipped on cpu (needs CUDA") for r in v.reasons)
    assert "lossless is not green on CUDA: green on cpu, not on CUDA" in v.reasons


def test_a_cpu_report_marked_cuda_device_without_cuda_is_not_a_cuda_run():
    assert decide([report(cuda=False)]).decision == verdict.KEEP


def test_one_red_gate_is_keep_and_names_it():
    v = decide([report(busy=gate("busy", "red", reason="1 of 2 tests failed: level 0.41 < 0.95"))])
    assert v.decision == verdict.KEEP
    assert any(r.startswith("busy is red on cuda: 1 of 2 tests failed: level 0.41") for r in v.reasons)


def test_a_red_cpu_report_beside_a_green_cuda_one_is_keep():
    cpu = cpu_report()
    cpu["gates"][0]["status"] = "red"
    assert decide([report(), cpu]).decision == verdict.KEEP


def test_a_gate_with_skipped_tests_on_cuda_is_keep():
    no_sync = gate("no-sync", skipped_tests=1)
    no_sync["tests"][-1]["message"] = "the sync debug mode needs CUDA"
    v = decide([report(no_sync=no_sync)])
    assert v.decision == verdict.KEEP
    assert v.reasons == ["no-sync is not green on CUDA: green on cuda, but 1 of 3 tests skipped "
                         "(the sync debug mode needs CUDA)"]


def test_speed_under_the_floor_in_the_graph_arm_is_keep():
    figures = speed_figures()
    figures[1]["ab"][1] = ab("tpot_ms", 8, None)
    v = decide([report(speed_ab=gate("speed-ab", measurements=figures))])
    assert v.decision == verdict.KEEP
    assert v.reasons == ["speed-ab graph arm, reference forward, ngram c=8 tpot_ms under the floor (the interval "
                         "of the median per-leg change, -1.0% to +3.0%, does not clear +-2%)"]


def test_speed_under_the_floor_in_the_eager_arm_only_is_still_lift():
    """The veto reads the graph arm; the eager arm is host-bound and under its floor."""
    assert decide([report()]).decision == verdict.LIFT


def test_speed_figures_of_an_older_range_floor_are_keep_with_the_reason():
    figures = speed_figures()
    figures[1]["ab"][0] = {"metric": "tpot_ms", "concurrency": 1, "noise_floor": 0.05, "result": "async/sync = 0.800",
                           "ratio": 0.8}
    v = decide([report(speed_ab=gate("speed-ab", measurements=figures))])
    assert v.reasons == ["speed-ab graph arm, reference forward, ngram c=1 tpot_ms: recorded by an older speed-ab "
                         "(a range floor over 3 legs), not the paired statistic: run the gate on this tree"]


def test_speed_behind_or_missing_graph_figures_is_keep():
    slower = decide([report(speed_ab=gate("speed-ab", measurements=speed_figures(graph_tpot=1.1)))])
    assert slower.decision == verdict.KEEP
    assert "speed-ab graph arm, reference forward, ngram c=1 tpot_ms: async behind sync (async/sync = 1.100)" \
        in slower.reasons
    eager_only = [m for m in speed_figures() if m["graph_arm"] == "eager"]
    missing = decide([report(speed_ab=gate("speed-ab", measurements=eager_only))])
    assert missing.reasons == ["speed-ab recorded no graph-arm figures"]


def test_a_gate_missing_from_every_report_is_keep():
    r = report()
    r["gates"] = [g for g in r["gates"] if g["name"] != "combine"]
    v = decide([r])
    assert v.reasons == ["combine is not green on CUDA: not run in any report"]


def test_no_report_is_keep():
    assert decide([]).decision == verdict.KEEP


@pytest.mark.parametrize("which, status", [("cpu", 0), ("cuda", 0), ("red", 1)])
def test_the_verdict_command_prints_the_decision_last(tmp_path, capsys, which, status):
    data = {"cpu": cpu_report(), "cuda": report(), "red": report(busy=gate("busy", "red"))}[which]
    path = tmp_path / "gates.json"
    path.write_text(json.dumps(data))
    assert main(["gates", "verdict", str(path)]) == status
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("verdict: LIFT" if which == "cuda" else "verdict: KEEP")


def test_an_unreadable_report_is_a_usage_error(tmp_path, capsys):
    assert main(["gates", "verdict", str(tmp_path / "missing.json")]) == 2
    assert "cannot read gate report" in capsys.readouterr().err


def test_every_round_and_model_counts_not_the_last_report_read():
    """speed-ab under the floor in one round of three is KEEP, whichever round it is."""
    behind = speed_figures()
    behind[1]["ab"][0] = ab("tpot_ms", 1, None)
    for where in range(3):
        rounds = [report() for _ in range(3)]
        rounds[where]["gates"] = [gate("speed-ab", measurements=behind) if g["name"] == "speed-ab" else g
                                  for g in rounds[where]["gates"]]
        v = decide(rounds)
        assert v.decision == verdict.KEEP, where
        assert v.reasons == [f"speed-ab graph arm, reference forward, ngram c=1 tpot_ms under the floor (the "
                             f"interval of the median per-leg change, -1.0% to +3.0%, does not clear +-2%) "
                             f"(report {where + 1} of 3)"]


def test_busy_under_its_threshold_in_any_report_is_keep():
    level = {"arm": "graph", "forward": "compiled", "async_level": 0.876, "sync_level": 0.682, "threshold": 0.95}
    v = decide([report(), report(busy=gate("busy", measurements=[level]))])
    assert v.decision == verdict.KEEP
    assert v.reasons == ["busy graph arm, compiled forward: async level 0.876 under its threshold 0.95"]
    assert v.figures["busy"][0]["async_level"] == 0.876 and v.figures["busy"][0]["forward"] == "compiled"


def test_a_red_gate_s_figures_are_the_evidence_of_what_kept_the_veto():
    level = {"arm": "graph", "forward": "compiled", "measure": "unprofiled: CUDA event pair per step (span_busy)",
             "async_level": 0.9006, "sync_level": 0.6824, "profiled_async_level": 0.8807, "threshold": 0.95}
    v = decide([report(busy=gate("busy", "red", measurements=[level], reason="level under 0.95"),
                       speed_ab=gate("speed-ab", "red", measurements=speed_figures(graph_tpot=0.84)))])
    assert v.decision == verdict.KEEP
    assert v.figures["busy"] == [{"forward": "compiled", "arm": "graph", "measure": level["measure"],
                                  "async_level": 0.9006, "sync_level": 0.6824, "profiled_async_level": 0.8807,
                                  "profiled_sync_level": None, "kernel_busy_async": None, "kernel_busy_sync": None,
                                  "threshold": 0.95}]
    assert len(v.figures["speed-ab"]) == 2 * 2 * 4  # forwards x drafters x the graph arm's A/Bs
    assert "busy graph arm, compiled forward: async level 0.9006 under its threshold 0.95" in v.reasons
    errored = decide([report(busy=gate("busy", "error", measurements=[level]))])
    assert errored.figures["busy"] == []  # a gate that could not decide measured nothing to keep


def test_reports_of_different_trees_are_refused_unless_asked(tmp_path, capsys):
    other = {**TREE, "engine": "0" * 64}
    with pytest.raises(verdict.MixedTrees, match="different source trees"):
        decide([report(), report(sources=other)])
    assert decide([report(), report(sources=other)], allow_mixed=True).decision == verdict.LIFT
    paths = []
    for i, r in enumerate([report(), report(sources=other)]):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(r))
    assert main(["gates", "verdict", *map(str, paths)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"engine {'e' * 12}" in err and f"engine {'0' * 12}" in err
    assert str(paths[0]) in err and str(paths[1]) in err and "--allow-mixed-trees" in err
    assert main(["gates", "verdict", "--allow-mixed-trees", *map(str, paths)]) == 0


def test_a_report_that_recorded_no_sources_is_not_combined_with_one_that_did():
    bare = report()
    del bare["environment"]["sources"]
    with pytest.raises(verdict.MixedTrees, match="unrecorded"):
        decide([report(), bare])


FORWARD_GATES = ("lossless", "combine", "emit-count", "reason-a", "predicate-split", "speed-ab", "busy", "no-sync")


def test_the_forward_dependent_gates_are_the_eight_the_forward_decides():
    assert verdict.FORWARD_GATES == FORWARD_GATES


def test_cuda_reports_of_the_reference_forward_alone_are_keep_naming_each_forward_gate():
    """Reports from before the compiled arm (or --forwards reference on CUDA) lift nothing: CUDA
    runs compile by default, and the verdict needs every forward-dependent gate on both forwards."""
    v = decide([report(forwards=["reference"])])
    assert v.decision == verdict.KEEP and v.forwards == ["reference"]
    assert v.reasons == [f"{name} did not judge the compiled forward on CUDA (it judged the reference forward): "
                         f"run the CUDA gates with both forwards, as --device cuda does by default"
                         for name in FORWARD_GATES]
    old = report()
    del old["environment"]["forwards"]  # a report from before reports named forwards: the reference forward
    assert decide([old]).reasons == v.reasons


def test_a_gate_s_own_forwards_count_not_the_session_s():
    lossless = gate("lossless") | {"forwards": ["compiled"]}
    depth = gate("depth") | {"forwards": ["reference"]}  # depth's verdict does not depend on the forward
    v = decide([report(lossless=lossless, depth=depth)])
    assert v.decision == verdict.KEEP and v.forwards == ["compiled"]
    assert v.reasons == ["lossless did not judge the reference forward on CUDA (it judged the compiled forward): run "
                         "the CUDA gates with both forwards, as --device cuda does by default"]


def test_the_forwards_of_every_report_count_together():
    """Rounds that judged one forward each cover both; a forward judged only where the gate was not
    green on CUDA does not count."""
    assert decide([report(forwards=["reference"]), report(forwards=["compiled"])]).decision == verdict.LIFT
    skipped = report(forwards=["compiled"], lossless=gate("lossless", skipped_tests=1))
    v = decide([report(forwards=["reference"]), skipped])
    assert "lossless did not judge the compiled forward on CUDA (it judged the reference forward): run the CUDA " \
           "gates with both forwards, as --device cuda does by default" in v.reasons


def test_a_lift_line_names_the_forwards_it_covers():
    assert decide([report()]).line == ("verdict: LIFT the veto (every gate green on CUDA, reference and compiled "
                                       "forward, sdpa attention, speed-ab's graph arm ahead beyond the floor)")


def test_the_verdict_covers_the_attention_backends_every_forward_gate_judged():
    """Results that name their backends count them (paged, CUDA's default since it was measured
    fastest); results from before they did ran sdpa. Only the backends every forward-dependent gate
    judged green on CUDA are covered; none in common is KEEP."""
    paged = {n: gate(n) | {"attention_backends": ["paged"]} for n in FORWARD_GATES}
    v = decide([report(**{n.replace("-", "_"): g for n, g in paged.items()})])
    assert v.decision == verdict.LIFT and v.attention_backends == ["paged"]
    both = dict(paged, lossless=gate("lossless") | {"attention_backends": ["paged", "sdpa"]})
    assert decide([report(**{n.replace("-", "_"): g for n, g in both.items()})]).attention_backends == ["paged"]
    mixed = dict(paged, lossless=gate("lossless"))  # names none: sdpa
    v = decide([report(**{n.replace("-", "_"): g for n, g in mixed.items()})])
    assert v.decision == verdict.KEEP and v.attention_backends == []
    assert v.reasons[0].startswith("the forward-dependent gates judged no attention backend in common on CUDA: ")
    assert "lossless sdpa" in v.reasons[0] and "emit-count paged" in v.reasons[0]


def test_every_model_judged_needs_busy_speed_ab_and_no_sync_with_both_forwards():
    """The fixtures' green speed-ab does not speak for the 1B shape: a 1B folder whose reports lack
    a model-size gate, or one of its forwards, is KEEP naming the folder; with all three (the
    block drafter's tests skipped there) it is LIFT."""
    b1 = "/tmp/b1"
    v = decide([report(), model_report(b1, names=("busy", "no-sync"))])
    assert v.decision == verdict.KEEP and v.reasons == [
        "speed-ab did not run green on CUDA on the model /tmp/b1: each model judged needs busy, speed-ab, "
        "no-sync there"]
    compiled_only = gate("speed-ab", measurements=speed_figures()[4:])
    compiled_only["forwards"] = ["compiled"]
    v = decide([report(), model_report(b1, speed_ab=compiled_only)])
    assert v.reasons == ["speed-ab did not judge the reference forward on CUDA on the model /tmp/b1"]
    red = decide([report(), model_report(b1, busy=gate("busy", "red", reason="0.80 < 0.95"))])
    assert "busy did not run green on CUDA on the model /tmp/b1: each model judged needs busy, speed-ab, " \
           "no-sync there" in red.reasons
    skips = model_report(b1, speed_ab=gate("speed-ab", skipped_tests=4))
    assert decide([report(), skips]).decision == verdict.LIFT


def test_a_report_whose_gates_ran_on_folders_of_their_own_adds_no_model():
    """gpu-check's depth1b: the depth gate runs on its deep folder, not the session's target, and
    names it in its result's `models`; that folder is no model the veto speaks for, whatever target
    the report's environment names. The same report with a gate that ran on the target counts its
    model, and a red depth gate keeps the veto either way."""
    fixtures, elsewhere = "/repo/fixtures/target", "/tmp/another-target"
    round_1 = report()
    round_1["environment"]["model"] = fixtures
    depth = on_own_folder(gate("depth"))
    assert decide([round_1, model_report(elsewhere, names=("depth",), depth=depth)]).decision == verdict.LIFT
    assert decide([round_1, model_report(fixtures, names=("depth",), depth=depth)]).decision == verdict.LIFT
    on_target = decide([round_1, model_report(elsewhere, names=("depth",))])  # depth of old: no `models`
    assert on_target.decision == verdict.KEEP and on_target.reasons[0] == (
        f"busy did not run green on CUDA on the model {elsewhere}: each model judged needs busy, speed-ab, "
        "no-sync there")
    red = decide([round_1, model_report(elsewhere, names=("depth",), depth=on_own_folder(gate("depth", "red")))])
    assert red.decision == verdict.KEEP and red.reasons == ["depth is red on cuda: 8 cases"]


def test_a_round_that_timed_the_graph_arm_alone_still_decides():
    """`gates run --timed-arms graph`: speed-ab's figures of the graph arm alone decide as before."""
    graph_only = [m for m in speed_figures() if m["graph_arm"] == "graph"]
    assert decide([report(speed_ab=gate("speed-ab", measurements=graph_only))]).decision == verdict.LIFT
    behind = [dict(m, ab=[ab("tpot_ms", 1, 1.1)] + m["ab"][1:]) for m in graph_only]
    assert decide([report(speed_ab=gate("speed-ab", measurements=behind))]).decision == verdict.KEEP
