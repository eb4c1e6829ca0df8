"""One stats pass for many shards: `specgate mutate --stats-only DIR` collects mutmut's test stats and
tests no mutant; a shard given `--stats-from DIR` loads them instead of collecting them, over the
stats its restored cache holds, and stale ones are still dropped. The workflow runs the pass once in
a job of its own and hands its files to every shard."""
import argparse
import json
from pathlib import Path

import pytest
import yaml  # PyYAML, pinned in requirements-dev.txt
from test_mutation_shards import make_staging  # the two-function package staged for a real mutmut run

from mutants.mutation import results
from mutants.mutation import run as mutation_run
from mutants.mutation import shard as mutation_shard
from mutants.mutation import stats as mutation_stats
from mutants.mutation.stage import STATS_FUNCTIONS, drop_stale_stats

REPO = Path(__file__).resolve().parents[2]
COLLECTING = "Running stats"  # mutmut's line while it collects its stats (not printed when it loads them)


def _statuses(staging: Path) -> dict[str, str]:
    return {r.name: r.status for r in results.read_results([], {}, staging)}


def test_a_stats_pass_tests_no_mutant_and_a_shard_given_its_files_does_not_collect_again(tmp_path):
    """Real mutmut 3.8: the pass writes the stats, the functions they map and the listing, and leaves
    every mutant unchecked; an empty staging folder given those files (a CI shard from cold) loads
    them and reaches the verdicts of a run that collected its own."""
    single = make_staging(tmp_path / "single")
    assert mutation_run.run_mutmut([], 1, tmp_path / "single.log", single) == (0, False)
    assert COLLECTING in (tmp_path / "single.log").read_text()

    source, out = make_staging(tmp_path / "pass"), tmp_path / "stats"
    got = mutation_stats.stats_pass(source, out, 1)
    assert sorted(p.name for p in out.iterdir()) == sorted(mutation_stats.STATS_FILES)
    assert got["functions"] == 3 and got["mapped_functions"] == 2 and got["tests"] == 2  # scale has no test
    assert set(json.loads((out / STATS_FUNCTIONS).read_text())) == {
        f"engine.calc.x_{f}" for f in ("add", "scale", "half")}
    assert set(_statuses(source).values()) == {"not checked"}, "the stats pass tested a mutant"
    assert COLLECTING in (source / mutation_stats.STATS_LOG).read_text()

    shard = make_staging(tmp_path / "shard")
    assert mutation_stats.install_stats(out, shard) == 0
    assert mutation_run.run_mutmut([], 1, tmp_path / "shard.log", shard) == (0, False)
    assert COLLECTING not in (tmp_path / "shard.log").read_text(), "mutmut collected its stats again"
    assert _statuses(shard) == _statuses(single)
    assert (shard / mutation_shard.LISTING).read_bytes() == (out / mutation_shard.LISTING).read_bytes()
    assert mutation_shard.list_mutants(shard) == mutation_shard.list_mutants(single), "the listing was taken"


def test_the_pass_s_stats_win_over_a_restored_cache_s_and_stale_ones_are_still_dropped(tmp_path):
    """A shard's restored cache holds stats from an older commit: the pass's replace them, the `no
    tests` verdicts the older map gave are judged again (kills and survivors stay cached), and stats
    that lack a function the sources now have are dropped, so mutmut collects them itself."""
    shard = make_staging(tmp_path / "shard")
    assert mutation_run.run_mutmut([], 1, tmp_path / "cached.log", shard) == (0, False)
    cached = _statuses(shard)
    assert "no tests" in cached.values()
    out = tmp_path / "stats"
    mutation_stats.stats_pass(make_staging(tmp_path / "pass"), out, 1)
    where = mutation_stats.stats_locations(shard)
    where[mutation_stats.MUTMUT_STATS].write_text(json.dumps({"older": True}))
    where[STATS_FUNCTIONS].write_text("[]")
    assert mutation_stats.install_stats(out, shard) == sum(1 for s in cached.values() if s == "no tests")
    for name in mutation_stats.STATS_FILES:
        assert where[name].read_bytes() == (out / name).read_bytes()
    assert _statuses(shard) == {n: "not checked" if s == "no tests" else s for n, s in cached.items()}
    functions = set(json.loads((out / STATS_FUNCTIONS).read_text()))
    assert drop_stale_stats(shard, functions) == 0 and where[mutation_stats.MUTMUT_STATS].exists()
    assert drop_stale_stats(shard, functions | {"engine.calc.x_new"}) == 1, "stale stats were kept"
    assert not where[mutation_stats.MUTMUT_STATS].exists()


def test_a_stats_folder_without_the_stats_is_refused(tmp_path):
    (tmp_path / "stats").mkdir()
    (tmp_path / "stats" / STATS_FUNCTIONS).write_text("[]")
    with pytest.raises(ValueError, match="no mutmut-stats.json there"):
        mutation_stats.install_stats(tmp_path / "stats", make_staging(tmp_path / "shard"))


def test_a_failed_stats_pass_says_so_with_mutmut_s_output(tmp_path):
    staging = make_staging(tmp_path / "staging")
    (staging / "tests" / "test_calc.py").write_text("def test_nothing_of_calc():\n    pass\n")
    with pytest.raises(ValueError, match="did not collect its test stats"):
        mutation_stats.stats_pass(staging, tmp_path / "stats", 1)
    assert not (tmp_path / "stats").exists()


@pytest.mark.parametrize("args, message", [
    (["--stats-only", "d", "--shard", "1/4"], "takes no --shard"),
    (["--stats-only", "d", "--since", "HEAD"], "takes no --since"),
    (["--stats-only", "d", "--stats-from", "e"], "takes no --stats-from"),
    (["--stats-only", "d", "--time-limit", "5"], "takes no --time-limit"),
    (["--stats-only", "d", "merge", "x"], "takes no merge"),
    (["--stats-from", "d", "--since", "HEAD"], "--stats-from takes no --since or --cuda-only"),
    (["--stats-from", "d", "--cuda-only"], "--stats-from takes no --since or --cuda-only"),
])
def test_stats_arguments_that_pick_or_test_mutants_exit_2(capsys, args, message):
    from specgate_cli import main
    assert main(["mutate", *args]) == 2
    assert message in capsys.readouterr().err


def test_the_ci_workflow_runs_one_stats_pass_and_every_shard_loads_it():
    from mutants.mutation.mutate import add_mutate_parser
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "mutation.yml").read_text())["jobs"]
    ap = argparse.ArgumentParser()
    add_mutate_parser(ap.add_subparsers(dest="command"))

    def parsed(cmd: str) -> argparse.Namespace:
        return ap.parse_args(cmd.replace("${{ matrix.shard }}", "1").split("specgate_cli ", 1)[1].split())

    stats_steps = jobs["stats"]["steps"]
    stats_cmd = next(s["run"] for s in stats_steps if "run" in s and "--stats-only" in s["run"])
    written = parsed(stats_cmd).stats_only
    upload = next(s for s in stats_steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["path"] == written.as_posix() and upload["with"]["if-no-files-found"] == "error"
    assert not written.is_relative_to("build/mutmut"), "the pass's folder must not be a shard's cached folder"
    assert jobs["stats"]["timeout-minutes"] <= 30

    shard = jobs["shard"]
    assert shard["needs"] in ("stats", ["stats"])
    steps = shard["steps"]
    download = next(s for s in steps if s.get("uses", "").startswith("actions/download-artifact@"))
    assert download["with"]["name"] == upload["with"]["name"]
    mutation = next(s for s in steps if "run" in s and "--shard" in s["run"])
    assert parsed(mutation["run"]).stats_from.as_posix() == download["with"]["path"]
    # outside the cached folder: the mutation step puts them over the restored cache's (install_stats),
    # not download-artifact's handling of files already there
    assert not Path(download["with"]["path"]).is_relative_to("build/mutmut")
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    # restored first, the stats put over it by the mutation step, the cache saved whatever happened
    assert steps.index(restore) < steps.index(mutation) and steps.index(download) < steps.index(mutation)
    assert steps.index(mutation) < steps.index(save) and save["if"] == "always()"
