"""The bench's figures (what the PNG draws and the JSON holds): tokens/s per leg with the warm
legs marked and the fold, and only for spec runs τ per leg and acceptance per draft position.
The PNG is read back from the matplotlib Figure `plot` saved (tests/helpers/plotted.py)."""
import matplotlib
from cycler import cycler

from engine.bench.legs import Leg, figures, plot
from helpers.plotted import drawn, figure, png_size

C0, C1, C2, GREY, WHITE = "#1f77b4", "#ff7f0e", "#2ca02c", "#808080", "#ffffff"  # matplotlib's first colours


def leg(c: int, i: int, tps: float, accepted: list[int], drafts: int, warm: bool) -> Leg:
    acc = {"num_drafts": drafts, "num_accepted_tokens": sum(accepted), "accepted_per_position": accepted,
           "mean_acceptance_length": 1 + sum(accepted) / drafts if drafts else 1.0}
    return Leg(c, i, 10, 20, 0.0, 1.0, 1.0, tps, acc, warm)


LEGS = [leg(1, 0, 50.0, [4, 2], 8, False), leg(1, 1, 80.0, [6, 4], 8, True), leg(1, 2, 90.0, [3, 1], 8, True),
        leg(8, 0, 100.0, [4, 2], 8, False), leg(8, 1, 200.0, [6, 2], 8, True), leg(8, 2, 220.0, [2, 0], 8, True)]
# Nothing accepted: every acceptance bar at 0.
NONE_ACCEPTED = [leg(1, 0, 5.0, [0], 4, True), leg(2, 0, 6.0, [0], 4, True)]
# A style whose cycle varies more than the colour: a plot call given no colour then moves it.
COLOURS = matplotlib.rcParamsDefault["axes.prop_cycle"].by_key()["color"]
STYLE = {"axes.prop_cycle": cycler(color=COLOURS, linewidth=[1 + i / 4 for i in range(len(COLOURS))])}
# Three concurrencies (a third colour and marker), the middle one without a warm leg (no fold).
PLAIN = [leg(1, 0, 10.0, [], 0, False), leg(1, 1, 20.0, [], 0, True), leg(2, 0, 30.0, [], 0, False),
         leg(2, 1, 40.0, [], 0, False), leg(4, 0, 60.0, [], 0, False), leg(4, 1, 50.0, [], 0, True)]


def test_figures_hold_every_leg_the_warm_flags_and_the_fold_of_the_warm_legs():
    f = figures(LEGS, spec=True)
    assert list(f) == ["1", "8"]
    assert f["1"]["tokens_per_s"] == [50.0, 80.0, 90.0] and f["1"]["warm"] == [False, True, True]
    assert f["1"]["fold"] == {"mean": 85.0, "min": 80.0, "max": 90.0, "warm_legs": [1, 2]}
    assert f["8"]["tau"] == [1.75, 2.0, 1.25]
    # over the warm legs of c=8: 16 drafts, 8 accepted at position 1 and 2 at position 2
    assert f["8"]["acceptance_per_position"] == [0.5, 0.125] and f["8"]["tau_fold"] == 1 + 10 / 16


def test_a_run_without_a_drafter_has_no_acceptance_figures():
    f = figures(LEGS, spec=False)
    assert all(set(fig) == {"legs", "warm", "tokens_per_s", "fold"} for fig in f.values())


def test_positions_without_drafts_have_an_acceptance_of_zero():
    f = figures([leg(2, 0, 5.0, [0, 0], 0, True)], spec=True)
    assert f["2"]["acceptance_per_position"] == [0.0, 0.0] and f["2"]["tau_fold"] == 1.0


def drawing(tmp_path, legs: list[Leg], spec: bool, style: dict | None = None) -> dict:
    """The PNG of `legs` as plot draws it, read back (one drawing per test: a mutation run credits
    a shared fixture's calls to the first test that uses it only)."""
    path = tmp_path / "bench.png"
    return figure(drawn(plot, figures(legs, spec), path, "bench", style=style)) | {"png": png_size(path)}


def marks(panel: dict) -> list[tuple]:
    return [(ln["x"], ln["y"], ln["marker"], ln["colour"], ln["face"], ln["size"])
            for ln in panel["lines"] if ln["x"] and "marker" in ln]


ABOVE = {"offset": [0.0, 1.0], "coords": "offset points", "va": "bottom", "size": 7.0, "colour": "#000000"}
RIGHT = {"offset": [4.0, 0.0], "coords": "offset points", "va": "center", "size": 8.0}


def test_the_spec_png_marks_each_leg_draws_the_fold_of_the_warm_ones_and_bars_tau_and_acceptance(tmp_path):
    d = drawing(tmp_path, LEGS, spec=True)
    assert (d["png"], d["inches"], len(d["panels"]), d["title"]) == ((1500, 500), [15.0, 5.0], 3, ("bench", 10.0))
    throughput, tau, acc = d["panels"]
    # Each leg a mark beside the other concurrency's (0.8 of a leg shared by two: offsets ±0.2),
    # hollow while warming up, its concurrency's legs joined by a faint line.
    assert marks(throughput) == [
        ([-0.2], [50.0], "o", C0, WHITE, 8.0), ([0.8], [80.0], "o", C0, C0, 8.0), ([1.8], [90.0], "o", C0, C0, 8.0),
        ([0.2], [100.0], "s", C1, WHITE, 8.0), ([1.2], [200.0], "s", C1, C1, 8.0), ([2.2], [220.0], "s", C1, C1, 8.0)]
    assert [ln for ln in throughput["lines"] if ln["x"] and "marker" not in ln] == [
        {"x": [-0.2, 0.8, 1.8], "y": [50.0, 80.0, 90.0], "style": "-", "colour": C0, "alpha": 0.4},
        {"x": [0.2, 1.2, 2.2], "y": [100.0, 200.0, 220.0], "style": "-", "colour": C1, "alpha": 0.4}]
    # The fold: a dashed mean across the legs, a min-max band over the warm ones, a label right of it.
    assert [(h["segments"], h["colour"], h["dashed"], h["width"]) for h in throughput["hlines"]] == [
        ([[[-0.45, 85.0], [2.45, 85.0]]], C0, True, 1.2), ([[[-0.45, 210.0], [2.45, 210.0]]], C1, True, 1.2)]
    assert throughput["bands"] == [{"x": [0.6, 2.0], "y": [80.0, 90.0], "colour": C0, "alpha": 0.12},
                                   {"x": [1.0, 2.4], "y": [200.0, 220.0], "colour": C1, "alpha": 0.12}]
    assert throughput["texts"] == [
        {"text": "c=1: 85 tok/s\n(mean of warm legs [1, 2])", "at": [2.45, 85.0], "colour": C0} | RIGHT,
        {"text": "c=8: 210 tok/s\n(mean of warm legs [1, 2])", "at": [2.45, 210.0], "colour": C1} | RIGHT]
    # The legend: a key per concurrency and per kind of mark.
    keys = [ln for ln in throughput["lines"] if not ln["x"]]
    assert keys == [
        {"x": [], "y": [], "style": "-", "colour": C0, "alpha": None, "marker": "o", "face": C0, "size": 6.0,
         "label": "c=1"},
        {"x": [], "y": [], "style": "-", "colour": C1, "alpha": None, "marker": "s", "face": C1, "size": 6.0,
         "label": "c=8"},
        {"x": [], "y": [], "style": "None", "colour": GREY, "alpha": None, "marker": "o", "face": WHITE, "size": 6.0,
         "label": "warm-up leg (not averaged)"},
        {"x": [], "y": [], "style": "None", "colour": GREY, "alpha": None, "marker": "o", "face": GREY, "size": 6.0,
         "label": "warm leg"},
        {"x": [], "y": [], "style": "--", "colour": GREY, "alpha": None, "label": "mean of warm legs (band: min-max)"}]
    assert throughput["legend"] == {"labels": [k["label"] for k in keys], "loc": 3, "ncols": 1,
                                    "size": 8.0}  # lower left
    # From 0 to 1.15 times the fastest leg; 0.6 of a leg left of the first, 1.9 right of the last
    # (where the labels go); a tick per leg.
    assert throughput["axes"] == {"title": "throughput per leg", "xlabel": "leg", "ylabel": "output tokens/s",
                                  "xlim": [-0.6, 3.9], "ylim": [0.0, 253.0], "xticks": [0.0, 1.0, 2.0],
                                  "xticklabels": [("0", 12.0), ("1", 12.0), ("2", 12.0)]}
    # τ per leg: grouped bars (0.95 of a concurrency's 0.4), warm-up legs hatched, each labelled.
    bar = {"width": 0.38, "edge": WHITE, "hatch": ["//", "", ""]}
    assert tau["bars"] == [{"label": "c=1", "x": [-0.2, 0.8, 1.8], "height": [1.75, 2.25, 1.5], "colour": C0} | bar,
                           {"label": "c=8", "x": [0.2, 1.2, 2.2], "height": [1.75, 2.0, 1.25], "colour": C1} | bar]
    assert tau["texts"] == [{"text": t, "at": at} | ABOVE for t, at in (
        ("1.75", [-0.2, 1.75]), ("2.25", [0.8, 2.25]), ("1.50", [1.8, 1.5]),
        ("1.75", [0.2, 1.75]), ("2.00", [1.2, 2.0]), ("1.25", [2.2, 1.25]))]
    assert tau["axes"] | {"xticklabels": None} == {
        "title": "τ per leg (1 + accepted / drafts)", "xlabel": "leg", "ylabel": "", "xlim": "auto",
        "ylim": [1.0, 2.6125], "xticks": [-1.0, 0.0, 1.0, 2.0, 3.0], "xticklabels": None}  # 1 + 1.25 (2.25 - 1) + 0.05
    assert tau["legend"] == {"labels": ["c=1", "c=8"], "loc": 1, "ncols": 2, "size": 8.0,  # upper right
                             "title": "hatched: warm-up leg", "title_size": 7.0}
    # Acceptance per draft position over the warm legs, from position 1, each bar labelled.
    bar = {"width": 0.38, "edge": WHITE, "hatch": ["", ""]}
    assert acc["bars"] == [{"label": "c=1", "x": [0.8, 1.8], "height": [0.5625, 0.3125], "colour": C0} | bar,
                           {"label": "c=8", "x": [1.2, 2.2], "height": [0.5, 0.125], "colour": C1} | bar]
    assert acc["texts"] == [{"text": t, "at": at} | ABOVE for t, at in (
        ("0.56", [0.8, 0.5625]), ("0.31", [1.8, 0.3125]), ("0.50", [1.2, 0.5]), ("0.12", [2.2, 0.125]))]
    assert acc["axes"] | {"xticklabels": None} == {
        "title": "acceptance per draft position (warm legs)", "xlabel": "draft position", "ylabel": "",
        "xlim": "auto", "ylim": [0.0, 1.15], "xticks": [0.0, 1.0, 2.0, 3.0], "xticklabels": None}
    assert acc["legend"] == {"labels": ["c=1", "c=8"], "loc": 1, "ncols": 2, "size": 8.0}  # no hatched title


def test_the_plain_png_is_one_panel_with_a_mark_per_concurrency_and_no_fold_without_a_warm_leg(tmp_path):
    d = drawing(tmp_path, PLAIN, spec=False)
    assert (d["png"], d["inches"], len(d["panels"]), d["title"]) == ((750, 500), [7.5, 5.0], 1, ("bench", 10.0))
    (throughput,) = d["panels"]
    third = 0.266667  # 0.8 of a leg shared by three
    assert marks(throughput) == [
        ([-third], [10.0], "o", C0, WHITE, 8.0), ([1 - third], [20.0], "o", C0, C0, 8.0),
        ([0.0], [30.0], "s", C1, WHITE, 8.0), ([1.0], [40.0], "s", C1, WHITE, 8.0),
        ([third], [60.0], "D", C2, WHITE, 8.0), ([1 + third], [50.0], "D", C2, C2, 8.0)]
    # c=2 has no warm leg: no fold drawn for it; one warm leg: a band of no height.
    assert [(h["segments"], h["colour"]) for h in throughput["hlines"]] == [([[[-0.45, 20.0], [1.45, 20.0]]], C0),
                                                                            ([[[-0.45, 50.0], [1.45, 50.0]]], C2)]
    assert [(b["x"], b["y"], b["colour"]) for b in throughput["bands"]] == [([0.6, 0.866667], [20.0, 20.0], C0),
                                                                            ([1.133333, 1.4], [50.0, 50.0], C2)]
    assert [t["text"].split(":")[0] for t in throughput["texts"]] == ["c=1", "c=4"]
    assert throughput["legend"]["labels"][:3] == ["c=1", "c=2", "c=4"]
    assert (throughput["axes"]["xlim"], throughput["axes"]["ylim"], throughput["axes"]["xticks"]) == (
        [-0.6, 2.9], [0.0, 69.0], [0.0, 1.0])


def test_under_a_style_cycling_more_than_colour_a_concurrency_keeps_its_colour_and_zero_bars_stand_on_the_floor(
        tmp_path):
    """Nothing accepted: τ 1 everywhere, so the τ axis spans 1 to 1.05; acceptance 0 everywhere,
    0 to 1.15, not below."""
    throughput, tau, acc = drawing(tmp_path, NONE_ACCEPTED, spec=True, style=STYLE)["panels"]
    assert [(ln.get("label"), ln["colour"]) for ln in throughput["lines"]] == [
        (None, C0), (None, C0), ("c=1", C0), (None, C1), (None, C1), ("c=2", C1),
        ("warm-up leg (not averaged)", GREY), ("warm leg", GREY), ("mean of warm legs (band: min-max)", GREY)]
    assert [[(b["label"], b["colour"]) for b in p["bars"]] for p in (tau, acc)] == [[("c=1", C0), ("c=2", C1)]] * 2
    assert [b["height"] for b in tau["bars"] + acc["bars"]] == [[1.0], [1.0], [0.0], [0.0]]
    assert (tau["axes"]["ylim"], acc["axes"]["ylim"]) == ([1.0, 1.05], [0.0, 1.15])
