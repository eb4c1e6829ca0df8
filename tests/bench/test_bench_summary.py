"""The 1B benchmark's summary (engine/bench/summary.py) on reports written by hand: what it keeps
of each report, its rows, the spec rows against the plain baseline, issue 36's targets at their
bounds, the table as printed, the report files it reads, and the PNG read back from its Figure."""
import json

from engine.bench.summary import plot, summarize, summarize_files, table, targets
from helpers.plotted import drawn, figure, png_size


def decode_report(ms: dict[str, dict[str, float]], floor: dict[str, float], gpu: str | None = "H200",
                  device: str = "cuda", bandwidth: float = 4.1875e12) -> dict:
    return {"model": "m", "device": device, "dtype": "bfloat16", "torch": "2.11", "gpu": gpu,
            "workload": {"prompt_len": 64, "max_tokens": 128}, "bandwidth_bytes_per_s": bandwidth,
            "floor": {c: {"ms": f} for c, f in floor.items()},
            "arms": {arm: {c: {"ms_per_step": v, "tokens_per_s": 1e3 / v} for c, v in per_c.items()}
                     for arm, per_c in ms.items()}}


def bench_report(spec: str | None, c_rates: dict[str, tuple[float, float]]) -> dict:
    return {"spec": spec, "summary": {c: {"tokens_per_s_mean": rate, "acceptance": {"mean_acceptance_length": tau}}
                                      for c, (rate, tau) in c_rates.items()}}


def peer_report(ms: dict[str, float]) -> dict:
    return {"ran": True, "transformers": "5.24.0",
            "per_concurrency": {c: {"ms_per_step": v, "compiled": True} for c, v in ms.items()}}


LOAD = {"seconds": 1.5, "device": "cuda", "peak_rss_mib": 900.0, "peak_rss_mib_before": 400.0,
        "load_added_mib": 500.0, "largest_shard_mib": 465.0, "files_mib": 1858.0, "num_shards": 4}
# c=16 only in the peer's report; graph/async/compiled at c=1 only; a spec run at c=8 the plain one lacks.
DECODE = decode_report({"graph/sync": {"1": 4.2, "8": 4.65}, "graph/async/compiled": {"1": 0.92}},
                       {"1": 0.46, "8": 0.47})
# a spec report without its legs' phases
NO_PHASES = {"gpu_ms_per_step": None, "graph_gpu_ms_per_step": None, "host_over_gpu": None}
PEER = peer_report({"1": 2.23, "16": 3.0})
SPEC = {"plain": bench_report(None, {"1": (1000.0, 1.0)}),
        "oracle-4.3": bench_report("oracle", {"1": (3100.0, 4.3), "8": (5000.0, 4.3)})}


def full() -> dict:
    return summarize(DECODE, PEER, LOAD, SPEC)


def partial() -> dict:
    """A CPU run: no GPU name, the peer not run, a load report without its device."""
    return summarize(decode_report({"graph/async/compiled": {"1": 0.9}}, {"1": 0.46}, gpu=None, device="cpu",
                                   bandwidth=2.5e10),
                     {"ran": False, "why": "no GPU"}, {k: v for k, v in LOAD.items() if k != "device"})


def test_the_summary_keeps_each_report_and_joins_their_rows_per_concurrency():
    summary = full()
    assert (summary["decode"], summary["peer"], summary["load"], summary["spec"]) == (DECODE, PEER, LOAD, SPEC)
    assert summary["rows"] == {
        "1": {"floor_ms": 0.46, "graph/sync": {"ms_per_step": 4.2, "floor_ratio": 9.13, "tokens_per_s": 1e3 / 4.2,
                                               "peer_speedup": 0.531},
              "graph/async/compiled": {"ms_per_step": 0.92, "floor_ratio": 2.0, "tokens_per_s": 1e3 / 0.92,
                              "peer_speedup": 2.424},
              "transformers_ms_per_step": 2.23},
        "8": {"floor_ms": 0.47, "graph/sync": {"ms_per_step": 4.65, "floor_ratio": 9.894, "tokens_per_s": 1e3 / 4.65}},
        "16": {"transformers_ms_per_step": 3.0}}
    assert summarize(None, PEER)["rows"] == {"1": {"transformers_ms_per_step": 2.23},
                                             "16": {"transformers_ms_per_step": 3.0}}
    assert summarize(None) == {"decode": None, "peer": None, "load": None, "spec": {}, "rows": {}, "spec_rows": [],
                               "targets": []}


def test_each_spec_row_is_against_the_plain_run_at_its_concurrency():
    """τ only for a run with a drafter; the ratio to three digits, none where the plain run did
    not run that concurrency; a report without a summary adds no row."""
    spec = {"plain": bench_report(None, {"1": (3000.0, 1.0)}), "ngram": bench_report("ngram", {"1": (2000.0, 2.5)}),
            "block": bench_report("block", {"1": (7000.0, 3.25), "16": (9000.0, 3.5)}), "load": {}}
    assert summarize(None, spec=spec)["spec_rows"] == [
        {"label": "plain", "concurrency": "1", "tokens_per_s": 3000.0, "tau": None, "vs_plain": 1.0} | NO_PHASES,
        {"label": "ngram", "concurrency": "1", "tokens_per_s": 2000.0, "tau": 2.5, "vs_plain": 0.667} | NO_PHASES,
        {"label": "block", "concurrency": "1", "tokens_per_s": 7000.0, "tau": 3.25, "vs_plain": 2.333} | NO_PHASES,
        {"label": "block", "concurrency": "16", "tokens_per_s": 9000.0, "tau": 3.5, "vs_plain": None} | NO_PHASES]
    no_baseline = summarize(None, spec={"plain": {}, "ngram": bench_report("ngram", {"1": (2000.0, 2.5)})})
    assert [row["vs_plain"] for row in no_baseline["spec_rows"]] == [None]


def test_a_target_at_its_bound_is_met_for_every_backend_of_the_compiled_async_graph_arm():
    """1.9x the floor, 2.3x the peer, τ 4.0 and 3.3x plain are each met exactly at the bound; the
    reference forward's arms and the sync runner are no target; a run labelled plain is the
    baseline, never a spec target."""
    decode = decode_report({"graph/async/compiled": {"1": 0.874}, "graph/async/flex/compiled": {"1": 0.9},
                            "graph/sync/compiled": {"1": 0.5}, "graph/async": {"1": 0.5}}, {"1": 0.46})
    spec = {"plain": bench_report("ngram", {"1": (1000.0, 4.5)}),
            "oracle-4.0": bench_report("oracle", {"1": (3300.0, 4.0)}),
            "oracle-3.9": bench_report("oracle", {"1": (9000.0, 3.99)})}
    assert targets(summarize(decode, peer_report({"1": 2.0102}), spec=spec)) == [
        {"target": "graph/async/compiled c=1 at most 1.9x the HBM floor", "figure": 1.9, "met": True},
        {"target": "graph/async/compiled c=1 at least 2.3x faster than transformers", "figure": 2.3, "met": True},
        {"target": "graph/async/flex/compiled c=1 at most 1.9x the HBM floor", "figure": 1.957, "met": False},
        {"target": "graph/async/flex/compiled c=1 at least 2.3x faster than transformers", "figure": 2.234,
         "met": False},
        {"target": "spec oracle-4.0 (τ 4.00) c=1 at least 3.3x plain tokens/s", "figure": 3.3, "met": True}]


def with_phases(report: dict, gpu_ms: float, plan: float, upload: float, launch: float, completion: float,
                wait: float, graph_ms: float | None = None) -> dict:
    for s in report["summary"].values():
        s["phases"] = {"gpu_ms_per_step": gpu_ms, "graph_gpu_ms_per_step": graph_ms, "host_ms_per_step": {
            "plan": plan, "upload": upload, "launch": launch, "completion": completion, "completion_wait": wait,
            "total": plan + upload + launch + completion}}
    return report


def test_the_verify_step_and_the_host_are_judged_from_the_spec_legs_phases_at_their_bounds():
    """Verify cost: the τ-about-4.3 leg's GPU ms per graph replay over the plain leg's (1.2x met at
    the bound, past it missed), not per step of any kind (the eager prefills, once per prompt, weigh
    more over a spec leg's fewer steps: 1.8 / 1.5 = 1.2 over every step where the replays' are
    1.32); host: plan, upload, launch and completion's own work over the GPU's time per step
    (completion's wait for the GPU is not host work), 0.7x met at the bound."""
    plain = with_phases(bench_report(None, {"1": (1000.0, 1.0)}), 1.5, 0.1, 0.2, 0.4, 1.0, 0.75, 1.25)  # own 0.95
    at_bound = with_phases(bench_report("oracle", {"1": (3000.0, 4.3)}), 1.8, 0.2, 0.3, 0.6, 1.2, 1.04,
                           1.5)  # own 1.26
    past = with_phases(bench_report("oracle", {"1": (3000.0, 4.3)}), 1.8015, 0.2, 0.3, 0.6, 1.2, 1.0, 1.5013)  # 1.3
    prefill_heavy = with_phases(bench_report("oracle", {"1": (3000.0, 4.3)}), 1.8, 0.2, 0.3, 0.6, 1.2, 1.04, 1.65)
    got = targets(summarize(None, spec={"plain": plain, "oracle-4.3": at_bound}))
    assert [(t["target"], t["figure"], t["met"]) for t in got] == [
        ("spec plain c=1 host time at most 0.7x the GPU's", 0.633, True),
        ("spec oracle-4.3 (τ 4.30) c=1 at least 3.3x plain tokens/s", 3.0, False),
        ("spec oracle-4.3 (τ 4.30) c=1 verify step at most 1.2x a plain step's GPU time (graph replays)", 1.2, True),
        ("spec oracle-4.3 (τ 4.30) c=1 host time at most 0.7x the GPU's", 0.7, True)]
    got = targets(summarize(None, spec={"plain": plain, "oracle-4.3": past}))
    assert [(t["figure"], t["met"]) for t in got[2:]] == [(1.201, False), (0.722, False)]
    got = targets(summarize(None, spec={"plain": plain, "oracle-4.3": prefill_heavy}))
    assert (got[2]["figure"], got[2]["met"]) == (1.32, False)
    no_phases = targets(summarize(None, spec={"plain": bench_report(None, {"1": (1000.0, 1.0)}),
                                              "oracle-4.3": at_bound}))
    assert [t["target"] for t in no_phases] == [  # no plain GPU time: no verify cost to judge
        "spec oracle-4.3 (τ 4.30) c=1 at least 3.3x plain tokens/s",
        "spec oracle-4.3 (τ 4.30) c=1 host time at most 0.7x the GPU's"]


def test_the_table_prints_every_figure_in_its_column_and_a_dash_where_none_was_measured():
    assert table(full()).splitlines() == [
        "bandwidth 4.188 TB/s (copy, read + write), bfloat16, prompts 64 + 128 tokens, H200, torch 2.11",
        "ms per plain decode step                       c=1                   c=8                  c=16",
        "HBM floor                                    0.460                 0.470                   nan",
        "graph/async/compiled           0.920 (2.00x floor)                     -                     -",
        "graph/sync                     4.200 (9.13x floor)   4.650 (9.89x floor)                     -",
        "transformers static+compile     2.230 (2.42x best)                     -                     -",
        "load 1.5 s on cuda, peak host memory 900 MiB (500 MiB over the 400 MiB baseline; largest of 4 shards "
        "465.0 MiB, 1858.0 MiB in all)",
        "bench plain c=1: 1000.0 tokens/s",
        "bench oracle-4.3 c=1: 3100.0 tokens/s τ 4.30, 3.10x plain",
        "bench oracle-4.3 c=8: 5000.0 tokens/s τ 4.30",
        "target MISSED graph/async/compiled c=1 at most 1.9x the HBM floor: 2.0",
        "target MET    graph/async/compiled c=1 at least 2.3x faster than transformers: 2.424",
        "target MISSED spec oracle-4.3 (τ 4.30) c=1 at least 3.3x plain tokens/s: 3.1"]


def test_the_table_of_a_cpu_run_names_the_device_and_the_peer_that_did_not_run():
    assert table(partial()).splitlines() == [
        "bandwidth 0.025 TB/s (copy, read + write), bfloat16, prompts 64 + 128 tokens, cpu, torch 2.11",
        "ms per plain decode step                       c=1",
        "HBM floor                                    0.460",
        "graph/async/compiled           0.900 (1.96x floor)",
        "transformers peer: not run (no GPU)",
        "load 1.5 s on ?, peak host memory 900 MiB (500 MiB over the 400 MiB baseline; largest of 4 shards "
        "465.0 MiB, 1858.0 MiB in all)",
        "target MISSED graph/async/compiled c=1 at most 1.9x the HBM floor: 1.957"]


def test_the_summary_of_report_files_leaves_out_the_missing_ones(tmp_path):
    files = {"decode": DECODE, "peer": PEER, "load": {"load": {k: v for k, v in LOAD.items() if k != "device"},
                                                      "model": "m", "device": "cuda"}, "plain": SPEC["plain"]}
    for name, report in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(report))
    got = summarize_files(tmp_path / "decode.json", tmp_path / "peer.json", tmp_path / "load.json",
                          {"plain": tmp_path / "plain.json", "oracle": tmp_path / "failed-stage.json"})
    assert got == summarize(DECODE, PEER, LOAD, {"plain": SPEC["plain"]})
    assert summarize_files(None, tmp_path / "none.json") == summarize(None)


C0, C1, C2, BLACK = "#1f77b4", "#ff7f0e", "#2ca02c", "#000000"
LABEL = {"offset": [0.0, 0.0], "coords": "offset points", "va": "bottom", "size": 7.0, "colour": BLACK}


def drawing(tmp_path, summary: dict) -> dict:
    """The summary's PNG read back (one drawing per test: a mutation run credits a shared
    fixture's calls to the first test that uses it only)."""
    path = tmp_path / "summary.png"
    return figure(drawn(plot, summary, path)) | {"png": png_size(path)}


def test_the_png_bars_ms_per_step_of_each_arm_beside_the_peer_over_the_dashed_floor_and_spec_tokens_per_s(tmp_path):
    d = drawing(tmp_path, full())
    assert (d["png"], d["inches"], len(d["panels"])) == ((1300, 450), [13.0, 4.5], 2)
    decode, spec = d["panels"]
    third = 0.266667  # 0.8 of a concurrency's width shared by three series
    bar = {"width": 0.253333, "edge": "none", "hatch": ["", "", ""]}
    assert decode["bars"] == [
        {"label": "graph/async/compiled", "x": [-third, 1 - third, 2 - third], "height": [0.92, 0.0, 0.0],
         "colour": C0} | bar,
        {"label": "graph/sync", "x": [0.0, 1.0, 2.0], "height": [4.2, 4.65, 0.0], "colour": C1} | bar,
        {"label": "transformers", "x": [third, 1 + third, 2 + third], "height": [2.23, 0.0, 3.0], "colour": C2} | bar]
    assert decode["texts"] == [{"text": f"{h:.2f}", "at": [x, h]} | LABEL
                               for b in decode["bars"] for x, h in zip(b["x"], b["height"])]
    assert decode["hlines"] == [  # c=16 has no floor: the peer alone ran there
        {"segments": [[[-0.45, 0.46], [0.45, 0.46]]], "colour": BLACK, "dashed": True, "width": 1.5,
         "label": "HBM floor"},
        {"segments": [[[0.55, 0.47], [1.45, 0.47]]], "colour": BLACK, "dashed": True, "width": 1.5, "label": None}]
    assert decode["axes"] == {"title": "plain greedy decode", "xlabel": "", "ylabel": "ms per plain decode step",
                              "xlim": "auto", "ylim": "auto", "xticks": [0.0, 1.0, 2.0],
                              "xticklabels": [("c=1", 12.0), ("c=8", 12.0), ("c=16", 12.0)]}
    assert decode["legend"] == {"labels": ["HBM floor", "graph/async/compiled", "graph/sync", "transformers"], "loc": 0,
                                "ncols": 1, "size": 8.0}  # 0: best
    # Spec tokens/s: a bar per label and concurrency, with τ where there is a drafter.
    assert spec["bars"] == [{"label": None, "x": [0.0, 1.0, 2.0], "height": [1000.0, 3100.0, 5000.0], "width": 0.8,
                             "colour": C0, "edge": "none", "hatch": ["", "", ""]}]
    assert spec["texts"] == [{"text": "1000", "at": [0.0, 1000.0]} | LABEL,
                             {"text": "3100\nτ 4.30", "at": [1.0, 3100.0]} | LABEL,
                             {"text": "5000\nτ 4.30", "at": [2.0, 5000.0]} | LABEL]
    assert spec["axes"] == {"title": "spec vs plain (specgate bench)", "xlabel": "",
                            "ylabel": "output tokens/s (warm legs)",
                            "xlim": "auto", "ylim": "auto", "xticks": [0.0, 1.0, 2.0],
                            "xticklabels": [("plain\nc=1", 8.0), ("oracle-4.3\nc=1", 8.0), ("oracle-4.3\nc=8", 8.0)]}
    assert spec["legend"] is None


def test_the_png_of_one_arm_without_spec_rows_is_one_panel_of_full_width_bars(tmp_path):
    d = drawing(tmp_path, partial())
    assert (d["png"], d["inches"], len(d["panels"])) == ((700, 450), [7.0, 4.5], 1)
    assert [(b["label"], b["x"], b["width"]) for b in d["panels"][0]["bars"]] == [("graph/async/compiled", [0.0], 0.76)]


def test_a_concurrency_without_a_warm_leg_and_a_first_concurrency_without_a_floor_are_drawn_and_told(tmp_path):
    """A bench report can hold a concurrency whose legs were all warm-up (its rate is None): the
    table says so and the PNG draws a bar of nothing labelled so. The floor's legend entry belongs
    to the first floor drawn, wherever it is."""
    decode = decode_report({"graph/sync": {"8": 4.65}}, {"8": 0.47})
    # An empty fold's acceptance length is 1.0: a drafter's row without a warm leg shows no τ.
    spec = {"plain": bench_report(None, {"1": (None, 1.0), "8": (900.0, 1.0)}),
            "ngram": bench_report("ngram", {"1": (None, 1.0), "8": (1800.0, 2.5)})}
    summary = summarize(decode, peer_report({"1": 2.23}), None, spec)
    lines = table(summary).splitlines()
    assert "bench plain c=1: no warm leg" in lines
    assert "bench ngram c=1: no warm leg" in lines
    assert "bench ngram c=8: 1800.0 tokens/s τ 2.50, 2.00x plain" in lines
    d = drawing(tmp_path, summary)
    decode_panel, spec_panel = d["panels"]
    assert [h["label"] for h in decode_panel["hlines"]] == ["HBM floor"]
    assert "HBM floor" in decode_panel["legend"]["labels"]
    assert spec_panel["bars"][0]["height"] == [0.0, 900.0, 0.0, 1800.0]
    assert [t["text"] for t in spec_panel["texts"]] == ["no warm leg", "900", "no warm leg", "1800\nτ 2.50"]


def test_the_dense_peer_has_its_row_ratio_target_and_table_line():
    """The gpt-fast-style peer beside transformers (issue 36: the async graph arm at least 1.15x
    faster): 1.0 / 0.92 = 1.087 at c=1, missed; not run, it says why."""
    dense = {"ran": True, "per_concurrency": {"1": {"ms_per_step": 1.0}, "8": {"ms_per_step": 1.5}}}
    summary = summarize(DECODE, {**PEER, "dense": dense})
    assert summary["rows"]["1"]["dense_ms_per_step"] == 1.0 and summary["rows"]["8"]["dense_ms_per_step"] == 1.5
    assert summary["rows"]["1"]["graph/async/compiled"]["dense_speedup"] == 1.087
    assert {"target": "graph/async/compiled c=1 at least 1.15x faster than the gpt-fast-style peer", "figure": 1.087,
            "met": False} in summary["targets"]
    lines = table(summary).splitlines()
    assert [line.split()[:3] for line in lines if line.startswith("gpt-fast-style dense")] == \
        [["gpt-fast-style", "dense", "1.000"]]
    not_run = {**PEER, "dense": {"ran": False, "why": "no GPU"}}
    assert "dense peer: not run (no GPU)" in table(summarize(DECODE, not_run))
