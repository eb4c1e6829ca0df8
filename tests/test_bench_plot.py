"""The bench's figures (what the PNG draws and the JSON holds): tokens/s per leg with the warm
legs marked and the fold, and only for spec runs τ per leg and acceptance per draft position."""
import matplotlib.image

from engine.bench import Leg, figures, plot


def leg(c: int, i: int, tps: float, accepted: list[int], drafts: int, warm: bool) -> Leg:
    acc = {"num_drafts": drafts, "num_accepted_tokens": sum(accepted), "accepted_per_position": accepted,
           "mean_acceptance_length": 1 + sum(accepted) / drafts if drafts else 1.0}
    return Leg(c, i, 10, 20, 0.0, 1.0, 1.0, tps, acc, warm)


LEGS = [leg(1, 0, 50.0, [4, 2], 8, False), leg(1, 1, 80.0, [5, 3], 8, True), leg(1, 2, 90.0, [3, 1], 8, True),
        leg(8, 0, 100.0, [4, 2], 8, False), leg(8, 1, 200.0, [6, 2], 8, True), leg(8, 2, 220.0, [2, 0], 8, True)]


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


def test_one_png_per_run_with_the_spec_panels_only_for_spec_runs(tmp_path):
    plot(figures(LEGS, spec=True), tmp_path / "spec.png", "spec")
    plot(figures(LEGS, spec=False), tmp_path / "plain.png", "plain")
    spec, plain = (matplotlib.image.imread(tmp_path / n) for n in ("spec.png", "plain.png"))
    assert spec.shape[1] == 1500 and plain.shape[1] == 750  # three panels against one, at 100 dpi
