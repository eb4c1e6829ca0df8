"""The bench's figures (what the PNG draws and the JSON holds): tokens/s per leg with the warm
legs marked and the fold, and only for spec runs τ per leg and acceptance per draft position.
The PNG is read back from the matplotlib Figure `plot` saved (tests/plotted.py)."""
import matplotlib
import pytest
from cycler import cycler

from engine.bench import Leg, figures, plot
from plotted import drawn, figure, png_size

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


@pytest.fixture(scope="module")
def drawings(tmp_path_factory) -> dict:
    """The spec and the plain PNG, each with its Figure read back."""
    out = {}
    for name, legs, spec, style in (("spec", LEGS, True, None), ("plain", PLAIN, False, None),
                                    ("none accepted", NONE_ACCEPTED, True, STYLE)):
        path = tmp_path_factory.mktemp("plot") / "bench.png"
        out[name] = figure(drawn(plot, figures(legs, spec), path, f"bench {name}", style=style)) | {"png": png_size(path)}
    return out


def test_one_png_per_run_at_100_dpi_with_the_spec_panels_only_for_spec_runs(drawings):
    spec, plain = drawings["spec"], drawings["plain"]
    assert (spec["png"], spec["inches"], len(spec["panels"]), spec["title"]) == ((1500, 500), [15.0, 5.0], 3, ("bench spec", 10.0))
    assert (plain["png"], plain["inches"], len(plain["panels"]), plain["title"]) == ((750, 500), [7.5, 5.0], 1, ("bench plain", 10.0))


def marks(panel: dict) -> list[tuple]:
    return [(ln["x"], ln["y"], ln["marker"], ln["colour"], ln["face"], ln["size"])
            for ln in panel["lines"] if ln["x"] and "marker" in ln]


def test_each_leg_is_a_mark_beside_the_other_concurrencies_hollow_while_warming_up(drawings):
    """0.8 of a leg's width shared by the concurrencies: offsets ±0.2 for two, 0 and ±0.8/3 for three."""
    assert marks(drawings["spec"]["panels"][0]) == [
        ([-0.2], [50.0], "o", C0, WHITE, 8.0), ([0.8], [80.0], "o", C0, C0, 8.0), ([1.8], [90.0], "o", C0, C0, 8.0),
        ([0.2], [100.0], "s", C1, WHITE, 8.0), ([1.2], [200.0], "s", C1, C1, 8.0), ([2.2], [220.0], "s", C1, C1, 8.0)]
    third = 0.266667
    assert marks(drawings["plain"]["panels"][0]) == [
        ([-third], [10.0], "o", C0, WHITE, 8.0), ([1 - third], [20.0], "o", C0, C0, 8.0),
        ([0.0], [30.0], "s", C1, WHITE, 8.0), ([1.0], [40.0], "s", C1, WHITE, 8.0),
        ([third], [60.0], "D", C2, WHITE, 8.0), ([1 + third], [50.0], "D", C2, C2, 8.0)]
    joins = [ln for ln in drawings["spec"]["panels"][0]["lines"] if ln["x"] and "marker" not in ln]
    assert joins == [{"x": [-0.2, 0.8, 1.8], "y": [50.0, 80.0, 90.0], "style": "-", "colour": C0, "alpha": 0.4},
                     {"x": [0.2, 1.2, 2.2], "y": [100.0, 200.0, 220.0], "style": "-", "colour": C1, "alpha": 0.4}]


def test_the_fold_is_a_dashed_mean_across_the_legs_a_min_max_band_over_the_warm_ones_and_a_label(drawings):
    spec = drawings["spec"]["panels"][0]
    assert [(h["segments"], h["colour"], h["dashed"], h["width"]) for h in spec["hlines"]] == [
        ([[[-0.45, 85.0], [2.45, 85.0]]], C0, True, 1.2), ([[[-0.45, 210.0], [2.45, 210.0]]], C1, True, 1.2)]
    assert spec["bands"] == [{"x": [0.6, 2.0], "y": [80.0, 90.0], "colour": C0, "alpha": 0.12},
                             {"x": [1.0, 2.4], "y": [200.0, 220.0], "colour": C1, "alpha": 0.12}]
    right = {"offset": [4.0, 0.0], "coords": "offset points", "va": "center", "size": 8.0}
    assert spec["texts"] == [{"text": "c=1: 85 tok/s\n(mean of warm legs [1, 2])", "at": [2.45, 85.0], "colour": C0} | right,
                             {"text": "c=8: 210 tok/s\n(mean of warm legs [1, 2])", "at": [2.45, 210.0], "colour": C1} | right]
    plain = drawings["plain"]["panels"][0]  # c=2 has no warm leg: no fold drawn for it
    assert [(h["segments"], h["colour"]) for h in plain["hlines"]] == [([[[-0.45, 20.0], [1.45, 20.0]]], C0),
                                                                       ([[[-0.45, 50.0], [1.45, 50.0]]], C2)]
    assert [(b["x"], b["y"], b["colour"]) for b in plain["bands"]] == [([0.6, 0.866667], [20.0, 20.0], C0),
                                                                       ([1.133333, 1.4], [50.0, 50.0], C2)]
    assert [t["text"].split(":")[0] for t in plain["texts"]] == ["c=1", "c=4"]


def test_the_legend_names_each_concurrency_and_each_kind_of_mark(drawings):
    spec = drawings["spec"]["panels"][0]
    keys = [ln for ln in spec["lines"] if not ln["x"]]
    assert keys == [
        {"x": [], "y": [], "style": "-", "colour": C0, "alpha": None, "marker": "o", "face": C0, "size": 6.0, "label": "c=1"},
        {"x": [], "y": [], "style": "-", "colour": C1, "alpha": None, "marker": "s", "face": C1, "size": 6.0, "label": "c=8"},
        {"x": [], "y": [], "style": "None", "colour": GREY, "alpha": None, "marker": "o", "face": WHITE, "size": 6.0,
         "label": "warm-up leg (not averaged)"},
        {"x": [], "y": [], "style": "None", "colour": GREY, "alpha": None, "marker": "o", "face": GREY, "size": 6.0,
         "label": "warm leg"},
        {"x": [], "y": [], "style": "--", "colour": GREY, "alpha": None, "label": "mean of warm legs (band: min-max)"}]
    assert spec["legend"] == {"labels": [k["label"] for k in keys], "loc": 3, "ncols": 1, "size": 8.0}  # 3: lower left
    assert drawings["plain"]["panels"][0]["legend"]["labels"][:3] == ["c=1", "c=2", "c=4"]


def test_the_throughput_axes_start_at_zero_and_leave_room_right_of_the_last_leg(drawings):
    """Up to 1.15 times the fastest leg; 0.6 of a leg left of the first and 1.9 right of the last
    (where the fold's labels go); a tick per leg."""
    spec, plain = drawings["spec"]["panels"][0]["axes"], drawings["plain"]["panels"][0]["axes"]
    assert spec == {"title": "throughput per leg", "xlabel": "leg", "ylabel": "output tokens/s", "xlim": [-0.6, 3.9],
                    "ylim": [0.0, 253.0], "xticks": [0.0, 1.0, 2.0], "xticklabels": [("0", 12.0), ("1", 12.0), ("2", 12.0)]}
    assert (plain["xlim"], plain["ylim"], plain["xticks"]) == ([-0.6, 2.9], [0.0, 69.0], [0.0, 1.0])


ABOVE = {"offset": [0.0, 1.0], "coords": "offset points", "va": "bottom", "size": 7.0, "colour": "#000000"}


def test_tau_per_leg_is_grouped_bars_with_warm_up_legs_hatched_and_each_bar_labelled(drawings):
    tau = drawings["spec"]["panels"][1]
    bar = {"width": 0.38, "edge": WHITE, "hatch": ["//", "", ""]}  # 0.95 of the concurrency's 0.4
    assert tau["bars"] == [{"label": "c=1", "x": [-0.2, 0.8, 1.8], "height": [1.75, 2.25, 1.5], "colour": C0} | bar,
                           {"label": "c=8", "x": [0.2, 1.2, 2.2], "height": [1.75, 2.0, 1.25], "colour": C1} | bar]
    assert tau["texts"] == [{"text": t, "at": at} | ABOVE for t, at in (
        ("1.75", [-0.2, 1.75]), ("2.25", [0.8, 2.25]), ("1.50", [1.8, 1.5]),
        ("1.75", [0.2, 1.75]), ("2.00", [1.2, 2.0]), ("1.25", [2.2, 1.25]))]
    assert tau["axes"] | {"xticklabels": None} == {
        "title": "τ per leg (1 + accepted / drafts)", "xlabel": "leg", "ylabel": "", "xlim": "auto",
        "ylim": [1.0, 2.6125], "xticks": [-1.0, 0.0, 1.0, 2.0, 3.0], "xticklabels": None}  # 1 + 1.25 (2.25 - 1) + 0.05
    assert tau["legend"] == {"labels": ["c=1", "c=8"], "loc": 1, "ncols": 2, "size": 8.0,  # 1: upper right
                             "title": "hatched: warm-up leg", "title_size": 7.0}


def test_acceptance_per_draft_position_is_grouped_bars_from_position_one(drawings):
    acc = drawings["spec"]["panels"][2]
    bar = {"width": 0.38, "edge": WHITE, "hatch": ["", ""]}
    assert acc["bars"] == [{"label": "c=1", "x": [0.8, 1.8], "height": [0.5625, 0.3125], "colour": C0} | bar,
                           {"label": "c=8", "x": [1.2, 2.2], "height": [0.5, 0.125], "colour": C1} | bar]
    assert acc["texts"] == [{"text": t, "at": at} | ABOVE for t, at in (
        ("0.56", [0.8, 0.5625]), ("0.31", [1.8, 0.3125]), ("0.50", [1.2, 0.5]), ("0.12", [2.2, 0.125]))]
    assert acc["axes"] | {"xticklabels": None} == {
        "title": "acceptance per draft position (warm legs)", "xlabel": "draft position", "ylabel": "",
        "xlim": "auto", "ylim": [0.0, 1.15], "xticks": [0.0, 1.0, 2.0, 3.0], "xticklabels": None}
    assert acc["legend"] == {"labels": ["c=1", "c=8"], "loc": 1, "ncols": 2, "size": 8.0}  # no hatched title


def test_under_a_style_cycling_more_than_colour_each_concurrency_keeps_its_colour(drawings):
    throughput, tau, acc = drawings["none accepted"]["panels"]
    assert [(ln.get("label"), ln["colour"]) for ln in throughput["lines"]] == [
        (None, C0), (None, C0), ("c=1", C0), (None, C1), (None, C1), ("c=2", C1),
        ("warm-up leg (not averaged)", GREY), ("warm leg", GREY), ("mean of warm legs (band: min-max)", GREY)]
    assert [[(b["label"], b["colour"]) for b in p["bars"]] for p in (tau, acc)] == [[("c=1", C0), ("c=2", C1)]] * 2


def test_bars_of_nothing_accepted_stand_on_the_axes_floor(drawings):
    """τ 1 everywhere: the τ axis spans 1 to 1.05; acceptance 0 everywhere: 0 to 1.15, not below."""
    _, tau, acc = drawings["none accepted"]["panels"]
    assert [b["height"] for b in tau["bars"] + acc["bars"]] == [[1.0], [1.0], [0.0], [0.0]]
    assert (tau["axes"]["ylim"], acc["axes"]["ylim"]) == ([1.0, 1.05], [0.0, 1.15])
