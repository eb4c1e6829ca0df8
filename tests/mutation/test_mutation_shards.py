"""Sharded mutation runs: shards cover every mutant exactly once, a real mutmut run per shard merges
into the verdicts of one run over everything, reviewed mutants of unchanged functions are not
re-run, the CUDA run's report merges over a CPU run's, a run stopped at its time limit resumes,
and the CI workflow's matrix agrees with the command line. Over 300 lines because those are one
path (list, shard, run, merge) and its tests share one real mutmut package."""
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml  # PyYAML, pinned in requirements-dev.txt

from mutants.mutation import merge as mutation_merge
from mutants.mutation import ratchet, results
from mutants.mutation import run as mutation_run
from mutants.mutation import shard as mutation_shard
from mutants.mutation.report import write_reports
from mutants.mutation.results import Equivalent

REPO = Path(__file__).resolve().parents[2]
CALC = ("def add(a, b):\n    return a + b\n\n\n"
        "def scale(x, k=3):\n    return x * k\n\n\n"
        "def half(x):\n    return x // 2\n")
TEST = ("from engine.calc import add, half\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_half():\n    assert half(4) == 2\n")


def make_staging(folder: Path) -> Path:
    (folder / "engine").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "engine" / "__init__.py").write_text("")
    (folder / "engine" / "calc.py").write_text(CALC)
    (folder / "tests" / "test_calc.py").write_text(TEST)
    (folder / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["engine"]\n'
                                           'pytest_add_cli_args_test_selection = ["tests"]\n')
    return folder


def test_shards_cover_every_mutant_exactly_once_and_spread_each_function():
    names = [f"engine.m.x_f__mutmut_{i}" for i in range(1, 12)] + [f"engine.m.x_g__mutmut_{i}" for i in range(1, 4)]
    for count in (1, 2, 3, 4, 7):
        shards = [mutation_shard.shard(names, i, count) for i in range(1, count + 1)]
        flat = [n for s in shards for n in s]
        assert sorted(flat) == sorted(names) and len(flat) == len(set(flat))
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1
        f_counts = [sum(1 for n in s if ".x_f__" in n) for s in shards]
        assert max(f_counts) - min(f_counts) <= 1, "one function's mutants must spread over the shards"
    assert mutation_shard.shard(list(reversed(names)), 2, 3) == mutation_shard.shard(names, 2, 3)  # deterministic
    assert mutation_shard.shard(names, 1, 3)[:2] == ["engine.m.x_f__mutmut_1", "engine.m.x_f__mutmut_4"]
    for bad in ("0/4", "5/4", "x", "1/0"):
        with pytest.raises(ValueError):
            mutation_shard.parse_shard(bad)


def test_a_bounded_run_draws_its_budget_uniformly_with_a_fixed_seed_and_says_so():
    names = [f"engine.m.x_f{j}__mutmut_{i}" for j in range(4) for i in range(1, 51)]
    assert mutation_shard.bounded(names[:30], 30) == (sorted(names[:30]), None)  # within the budget: all of them
    chosen, note = mutation_shard.bounded(list(reversed(names)), 40)
    assert len(chosen) == len(set(chosen)) == 40 and set(chosen) <= set(names) and chosen == sorted(chosen)
    assert (chosen, note) == mutation_shard.bounded(names, 40)  # the same draw whatever the order given
    assert note == "40 of 200 mutants of the changed functions (seed 0)"
    assert mutation_shard.bounded(names, 40, seed=1)[0] != chosen
    # uniform: over many seeds every function gets about its share (50 of 200 each, so 10 of 40)
    per_function = [0] * 4
    for seed in range(200):
        for n in mutation_shard.bounded(names, 40, seed)[0]:
            per_function[int(n.split("x_f")[1][0])] += 1
    assert all(abs(c / 200 - 10) < 1.5 for c in per_function), per_function


def test_reviewed_mutants_are_not_re_run_only_while_their_function_is_unchanged():
    eqs = {"a": Equivalent("a", "x", "same", "h1"), "b": Equivalent("b", "y", "same", "h2"),
           "c": Equivalent("c", "z", "CUDA-only: a GPU path", None)}
    assert mutation_shard.reviewed_unchanged(eqs, {"a": "h1", "b": "changed", "c": "h3"}) == {"a"}
    assert mutation_shard.cuda_only(eqs) == ["c"]


def _shard_report(staging: Path, names: list[str], out: Path, index: int, count: int, digest: str, total: int) -> None:
    rc, stopped = mutation_run.run_mutmut(names, 1, out.parent / f"mutmut-{index}.log", staging)
    assert (rc, stopped) == (0, False), (out.parent / f"mutmut-{index}.log").read_text()[-2000:]
    records = results.read_results([], {}, staging, names=set(names))
    write_reports(out, records, {"engine/calc.py": CALC}, {"mode": "shard", "shard": f"{index}/{count}",
                                                           "listing_digest": digest, "mutants_in_scope": total})


def test_merged_shards_give_the_verdicts_of_one_run(tmp_path):
    """Real mutmut 3.8: the two-function package's mutants in one run, and in two shards (each in
    a staging folder of its own, as on two CI machines); the merged verdicts are the one run's."""
    single = make_staging(tmp_path / "single")
    assert mutation_run.run_mutmut([], 1, tmp_path / "single.log", single) == (0, False)
    one_run = {r.name: r.status for r in results.read_results([], {}, single)}
    assert set(one_run.values()) == {"killed", "survived", "no tests"}
    listing = mutation_shard.list_mutants(make_staging(tmp_path / "listing"))
    assert sorted(listing) == sorted(one_run), "the listing names exactly mutmut's mutants"
    lines = mutation_shard.mutated_lines(tmp_path / "listing")
    records = results.read_results([], {}, single)
    assert lines == {r.name: results.mutated_line(r.diff) for r in records}, "the line mutmut's diff adds"
    assert "def scale(x, k=4):" in lines.values(), "a mutant of the def line, named as in the source"
    eq = {name: Equivalent(name, line, "reviewed") for name, line in lines.items()}
    assert ratchet.stale_equivalents([], eq, False, lines=lines) == []
    renumbered, gone = sorted(lines)[0], "engine.calc.x_add__mutmut_999"
    eq[renumbered], eq[gone] = Equivalent(renumbered, "return a", "reviewed"), Equivalent(gone, "x", "reviewed")
    assert ratchet.stale_equivalents([], eq, False, lines=lines) == [
        f"{renumbered}: listed as equivalent for `return a`, but it now mutates `{lines[renumbered]}`",
        f"{gone}: listed as equivalent, but no such mutant"]
    digest = mutation_shard.listing_digest(listing)
    folders = []
    for index in (1, 2):
        staging = make_staging(tmp_path / f"shard{index}")
        folders.append(tmp_path / f"report{index}")
        _shard_report(staging, mutation_shard.shard(listing, index, 2), folders[-1], index, 2, digest, len(listing))
    records, meta = mutation_merge.combine([mutation_merge.read_report(f) for f in folders])
    assert {r.name: r.status for r in records} == one_run
    assert meta["complete"] and meta["shards"] == "2 of 2"
    partial, meta = mutation_merge.combine([mutation_merge.read_report(folders[0])])
    assert not meta["complete"] and len(partial) < len(one_run)
    with pytest.raises(ValueError, match="given twice|two shards"):
        mutation_merge.combine([mutation_merge.read_report(folders[0])] * 2)
    other = tmp_path / "other"
    shutil.copytree(folders[1], other)
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "listing_digest": "elsewhere"}))
    with pytest.raises(ValueError, match="different runs"):
        mutation_merge.combine([mutation_merge.read_report(folders[0]), mutation_merge.read_report(other)])
    (other / "summary.json").write_text(json.dumps({**summary, "suite_digest": "a stronger suite"}))
    with pytest.raises(ValueError, match="different suites"):
        mutation_merge.combine([mutation_merge.read_report(folders[0]), mutation_merge.read_report(other)])


def test_a_shard_that_restores_its_cache_tests_only_mutants_without_a_verdict(tmp_path):
    """Real mutmut 3.8: a rerun of shard 1 of 2 (a CI job that restored its folder) takes every verdict
    from the cache; shard 2, an --only run's mutants and a changed function's are tested."""
    staging = make_staging(tmp_path / "staging")
    hashes = mutation_shard.list_mutants(staging)
    first, second = (mutation_shard.shard(hashes, i, 2) for i in (1, 2))
    in_run, not_rerun, cached, to_test = mutation_shard.plan_run(hashes, {}, staging, [], (1, 2), False)
    assert (in_run, not_rerun, cached, to_test) == (first, set(), set(), first), "an empty cache tests everything"
    _shard_report(staging, to_test, tmp_path / "report1", 1, 2, mutation_shard.listing_digest(hashes), len(hashes))
    assert mutation_shard.plan_run(hashes, {}, staging, [], (1, 2), False) == (first, set(), set(first), [])
    assert mutation_shard.plan_run(hashes, {}, staging, [], (2, 2), False) == (second, set(), set(), second)
    everything = mutation_shard.plan_run(hashes, {}, staging, [], None, False)
    assert everything[2] == set(first) and sorted(everything[3]) == sorted(second), "a full run keeps the cache"
    only = ["engine.calc.x_add__mutmut_*"]
    named = [n for n in hashes if "x_add__" in n]
    assert mutation_shard.plan_run(hashes, {}, staging, only, None, False) == (named, set(), set(), named)
    reviewed = {first[0]: Equivalent(first[0], "x", "reviewed", hashes[first[0]])}
    assert mutation_shard.plan_run(hashes, reviewed, staging, [], (1, 2), False)[1] == {first[0]}
    changed = {**hashes, **{n: "another hash" for n in named}}
    assert mutation_shard.plan_run(changed, {}, staging, [], (1, 2), False)[3] == [n for n in first if n in named]


def test_a_cuda_only_report_replaces_the_cpu_verdicts_it_tested(tmp_path):
    from mutants.mutation.record import MutantRecord
    diff = "--- engine/calc.py\n+++ engine/calc.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"

    def rec(name, status):
        return MutantRecord(name=name, path="engine/calc.py", function="f", status=status, diff=diff)
    cpu = [rec("engine.calc.x_f__mutmut_1", "survived"), rec("engine.calc.x_f__mutmut_2", "killed")]
    write_reports(tmp_path / "cpu", cpu, {}, {"mode": "shard", "shard": "1/1", "listing_digest": "d",
                                              "mutants_in_scope": 2})
    write_reports(tmp_path / "gpu", [rec("engine.calc.x_f__mutmut_1", "killed")], {}, {"mode": "cuda-only"})
    records, meta = mutation_merge.combine([mutation_merge.read_report(tmp_path / d) for d in ("cpu", "gpu")])
    assert [r.status for r in records] == ["killed", "killed"] and meta["cuda_verdicts"] == 1 and meta["complete"]
    assert meta["killed_on_cuda"] == ["engine.calc.x_f__mutmut_1"]
    # A CUDA run stopped at its time limit: what it did not check keeps the CPU run's verdict; and
    # a complete full run is the CPU side as one shard of one.
    write_reports(tmp_path / "gpu", [rec("engine.calc.x_f__mutmut_1", "not checked")], {}, {"mode": "cuda-only"})
    write_reports(tmp_path / "full", cpu, {}, {"mode": "run", "complete": True, "listing_digest": "d",
                                               "mutants_in_scope": 2})
    records, meta = mutation_merge.combine([mutation_merge.read_report(tmp_path / d) for d in ("full", "gpu")])
    assert [r.status for r in records] == ["survived", "killed"] and meta["cuda_verdicts"] == 0 and meta["complete"]
    # a CUDA survivor (of an older suite, say) never revives a CPU kill
    write_reports(tmp_path / "gpu", [rec(f"engine.calc.x_f__mutmut_{i}", "survived") for i in (1, 2)], {},
                  {"mode": "cuda-only"})
    records, meta = mutation_merge.combine([mutation_merge.read_report(tmp_path / d) for d in ("full", "gpu")])
    assert [r.status for r in records] == ["survived", "killed"] and meta["cuda_verdicts"] == 1
    assert meta["killed_on_cuda"] == []
    write_reports(tmp_path / "part", cpu, {}, {"mode": "run", "complete": False})
    with pytest.raises(ValueError, match="incomplete or of another mode"):
        mutation_merge.combine([mutation_merge.read_report(tmp_path / d) for d in ("part", "gpu")])


def test_a_cuda_only_entry_killed_on_cuda_is_its_verdict_and_any_other_kill_is_stale():
    from mutants.mutation.ratchet import stale_equivalents
    from mutants.mutation.record import MutantRecord
    diff = "--- engine/calc.py\n+++ engine/calc.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
    eqs = {"gpu": Equivalent("gpu", "return 2", "CUDA-only: the pinned host buffer"),
           "cpu": Equivalent("cpu", "return 2", "the result is rounded away")}

    def killed(name, mutated="return 2"):
        return MutantRecord(name=name, path="engine/calc.py", function="f", status="killed",
                            diff=diff.replace("return 2", mutated))
    on_cuda = frozenset({"gpu", "cpu"})
    assert stale_equivalents([killed("gpu")], {"gpu": eqs["gpu"]}, False, on_cuda) == []
    assert stale_equivalents([killed("gpu")], {"gpu": eqs["gpu"]}, False) == [
        "gpu: listed as equivalent, but it was killed"]  # killed by a CPU run: it was never CUDA-only
    assert stale_equivalents([killed("cpu")], {"cpu": eqs["cpu"]}, False, on_cuda) == [
        "cpu: listed as equivalent, but it was killed"]
    assert "now mutates `return 3`" in stale_equivalents([killed("gpu", "return 3")], {"gpu": eqs["gpu"]},
                                                         False, on_cuda)[0]
    # code only CUDA runs (graph capture) has no CPU test at all: `no tests` is what its entry
    # explains; of any other entry it is stale. A mutant a stopped run left unchecked is no verdict.
    unreached = [replace(killed(n), status="no tests") for n in ("gpu", "cpu")]
    assert stale_equivalents(unreached, eqs, False) == ["cpu: listed as equivalent, but it was no tests"]
    unchecked = [replace(killed(n), status="not checked") for n in ("gpu", "cpu")]
    assert stale_equivalents(unchecked, eqs, False) == []


def test_a_cuda_only_run_stages_its_own_suite_in_its_own_folder(tmp_path):
    """The GPU run's stats and verdicts never mix with a CPU run's; its suite is the CUDA test
    module and the gates, and every path in it exists."""
    import tomllib

    from mutants.mutation.stage import CUDA_STAGING, CUDA_SUITE, STAGING, SUITE, stage
    assert CUDA_STAGING != STAGING and CUDA_STAGING.parent == STAGING.parent
    assert CUDA_SUITE[:3] == ("tests/engine/test_cuda_path.py", "tests/bench/test_cuda_bench.py", "gates/no_sync.py")
    assert set(CUDA_SUITE[3:]) == set(SUITE) - {"tests"} and "gates/no_sync.py" not in SUITE
    assert all((REPO / path).is_file() for path in CUDA_SUITE) and len(CUDA_SUITE) > 3
    stage(tmp_path / "cpu")
    stage(tmp_path / "cuda", CUDA_SUITE)
    selection = {d: tomllib.loads((tmp_path / d / "pyproject.toml").read_text())["tool"]["mutmut"][
        "pytest_add_cli_args_test_selection"] for d in ("cpu", "cuda")}
    assert selection == {"cpu": list(SUITE), "cuda": list(CUDA_SUITE)}
    assert (tmp_path / "cuda" / "suite.sha256").read_text() != (tmp_path / "cpu" / "suite.sha256").read_text()


def test_the_ci_workflow_runs_every_shard_and_merges_them_with_the_cli():
    import argparse

    from mutants.mutation.mutate import add_mutate_parser
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "mutation.yml").read_text())
    jobs = workflow["jobs"]
    shards = jobs["shard"]["strategy"]["matrix"]["shard"]
    count = len(shards)
    assert count >= 2 and shards == list(range(1, count + 1))
    run_steps = [s["run"] for s in jobs["shard"]["steps"] if "run" in s]
    shard_cmd = next(r for r in run_steps if "mutate" in r and "--shard" in r)
    assert f"--shard ${{{{ matrix.shard }}}}/{count}" in shard_cmd
    steps = jobs["shard"]["steps"]
    restore = next(s for s in steps if s.get("uses", "").startswith("actions/cache/restore@"))
    save = next(s for s in steps if s.get("uses", "").startswith("actions/cache/save@"))
    for cache in (restore["with"], save["with"]):
        assert cache["path"] == "build/mutmut" and "matrix.shard" in cache["key"] and f"of-{count}" in cache["key"], \
            "each shard restores and saves its own mutmut cache"
    assert restore["with"]["restore-keys"] == f"mutmut-shard-${{{{ matrix.shard }}}}-of-{count}-"
    assert save["with"]["key"].startswith(restore["with"]["restore-keys"]) and "run_attempt" in save["with"]["key"]
    # A cache survives a shard that fails or is stopped: it is saved whatever the job's outcome, and
    # mutmut stops at its own time limit before the step's timeout, which comes before the job's.
    assert save["if"] == "always()" and steps.index(save) > steps.index(next(s for s in steps if "run" in s
                                                                           and "--shard" in s["run"]))
    mutation_step = next(s for s in steps if "run" in s and "--shard" in s["run"])
    limit = float(mutation_step["run"].split("--time-limit ")[1].split()[0])
    assert limit < 60 * mutation_step["timeout-minutes"] < 60 * jobs["shard"]["timeout-minutes"]
    # The count is the documented one, derived from the measured cost per mutant.
    documented = re.search(r"The workflow runs (\d+) shards", (REPO / "docs" / "mutation-runs.md").read_text())
    assert documented and int(documented.group(1)) == count
    summary = next(s for s in jobs["merge"]["steps"] if s.get("name") == "Job summary")
    assert summary["if"] == "always()" and "job-summary.md" in summary["run"]
    assert "GITHUB_STEP_SUMMARY" in summary["run"]
    assert jobs["merge"]["needs"] == "shard" or jobs["merge"]["needs"] == ["shard"]
    merge_cmd = next(s["run"] for s in jobs["merge"]["steps"] if "run" in s and "mutate merge" in s["run"])
    assert [w for w in merge_cmd.split() if w.startswith("shards/")] == \
        [f"shards/mutation-shard-{i}" for i in range(1, count + 1)], "the merge must name every shard's report"
    ap = argparse.ArgumentParser()
    add_mutate_parser(ap.add_subparsers(dest="command"))
    for cmd in (shard_cmd.replace("${{ matrix.shard }}", "1"), merge_cmd):
        argv = cmd.split("specgate_cli " if "specgate_cli " in cmd else "specgate ", 1)[1].split()
        args = ap.parse_args(argv)  # the workflow's commands parse with the real options
        assert args.command == "mutate"
    assert mutation_shard.parse_shard(f"{count}/{count}") == (count, count)


def test_the_documented_shard_count_follows_from_the_measured_shards():
    """The workflow's count is derived, not guessed: the documented cost per mutant is the slowest
    of the committed from-scratch shards' (their wall time less the command's fixed cost, over the
    mutants each tested), and the count is the scope over the mutants a shard can test in the budget."""
    import math
    doc = (REPO / "docs" / "mutation-runs.md").read_text()
    line = re.search(r"\*\*Derivation:\*\* budget ([\d,]+) s, fixed ([\d,]+) s of which ([\d,]+) s inside the "
                     r"command, ([\d.]+) s a mutant\s+\(the slowest of the (\d+) shards measured\), ([\d,]+) "
                     r"mutants → (\d+) shards", doc)
    assert line, "docs/mutation-runs.md lost its derivation line"
    budget, fixed, inside, cost, measured, mutants, count = (float(g.replace(",", "")) for g in line.groups())
    measured_shards = sorted((REPO / "mutants" / "mutation").glob("scratch-*/shard-*/summary.json"))
    shards = [json.loads(p.read_text()) for p in measured_shards]
    assert len(shards) == measured and all(s["shard"] is not None and s["tested"] > 0 for s in shards)
    assert round(max((s["wall_s"] - inside) / s["tested"] for s in shards), 2) == cost
    assert count == math.ceil(mutants / math.floor((budget - fixed) / cost))
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "mutation.yml").read_text())
    assert len(workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]) == count


def test_the_per_commit_budget_in_ci_follows_from_the_measured_ci_run():
    """.ci/run's --budget is the documented one, and that one fits what is left of CI's time after
    `make test` and the margin, at the measured cost of the slowest mutants."""
    import math
    doc = (REPO / "docs" / "mutation-runs.md").read_text()
    line = re.search(r"\*\*Derivation \(CI budget\):\*\* CI allows (\d+) min; `make test` took (\d+) min; (\d+) min "
                     r"kept as margin;\s+([\d.]+) s a mutant → (\d+) mutants, budget (\d+)\.", doc)
    assert line, "docs/mutation-runs.md lost its CI budget derivation"
    allowed, make_test, margin, cost, fits, budget = (float(g) for g in line.groups())
    assert fits == math.floor((allowed - make_test - margin) * 60 / cost) and budget <= fits
    ci = (REPO / ".ci" / "run").read_text()
    assert f"--since HEAD~1 --budget {int(budget)} " in ci


@pytest.mark.parametrize("args, message", [
    (["--shard", "5/4"], "need 1 <= I <= N"),
    (["--shard", "two/4"], "expected I/N"),
    (["--shard", "1/4", "--since", "HEAD"], "take no --since"),
    (["--shard", "1/4", "--cuda-only"], "take no --since"),
    (["--cuda-only", "--update-baseline"], "take no --since"),
    (["--time-limit", "-1"], "--time-limit must be a number of seconds"),
    (["--time-limit", "nan"], "--time-limit must be a number of seconds"),
    (["--budget", "10"], "--budget bounds a --since run"),
    (["merge"], "usage: specgate mutate merge"),
    (["nonsense", "dir"], "usage: specgate mutate merge"),
])
def test_bad_shard_cuda_and_merge_arguments_exit_2_with_a_clear_error(capsys, args, message):
    from specgate_cli import main
    assert main(["mutate", *args]) == 2
    assert message in capsys.readouterr().err


def test_merge_refuses_a_folder_that_is_not_a_report(tmp_path, capsys):
    from specgate_cli import main
    assert main(["mutate", "merge", str(tmp_path)]) == 2
    assert "not a mutation report folder" in capsys.readouterr().err


def test_a_listed_run_fails_on_an_entry_the_listing_contradicts_even_untested(tmp_path):
    from mutants.mutation.mutate import _report
    run = {"wall_s": 1.0, "from_cache": 0, "complete": False, "mode": "shard", "shard": "1/2"}
    eqs = {"engine.calc.x_add__mutmut_9": Equivalent("engine.calc.x_add__mutmut_9", "return a", "reviewed")}
    stale = "engine.calc.x_add__mutmut_9: listed as equivalent, but no such mutant"
    _, problems = _report([], eqs, run, tmp_path, lines={"engine.calc.x_add__mutmut_1": "return a"})
    assert problems == [stale]
    assert json.loads((tmp_path / "summary.json").read_text())["stale_equivalents"] == [stale]
    assert _report([], eqs, run, tmp_path / "unlisted")[1] == []  # untested, unlisted: not judged


def test_a_failed_listing_says_so_and_leaves_no_listing_process_running(tmp_path, monkeypatch):
    """The listing runs one process per core; one failing must not leave the others on the cores."""
    import subprocess
    staging = make_staging(tmp_path / "staging")
    # The largest file is listed by the first process read, so the failure is met first.
    (staging / "engine" / "broken.py").write_text("def f(:\n" + "#\n" * 2000)
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)
    monkeypatch.setattr(mutation_shard.subprocess, "Popen", Recorded)
    monkeypatch.setattr(mutation_shard.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match="listing the mutants failed"):
        mutation_shard.list_mutants(staging)
    assert len(started) == 2
    assert all(proc.returncode is not None for proc in started), "a listing process was left running"
    assert not (staging / "mutant-list.json").exists()



def test_functions_new_since_the_stats_were_collected_drop_them_and_their_no_tests_verdicts(tmp_path):
    """Real mutmut 3.8: a function added after the stats were collected has no tests in mutmut's
    map; dropping the stats (and the `no tests` verdicts they gave) lets the next run map it."""
    from mutants.mutation.stage import drop_stale_stats, record_stats_functions
    staging = make_staging(tmp_path / "staging")
    assert mutation_run.run_mutmut([], 1, tmp_path / "first.log", staging) == (0, False)
    functions = {n.rpartition("__mutmut_")[0] for n in mutation_shard.list_mutants(staging)}
    assert drop_stale_stats(staging, functions) == 0, "no record yet: the stats stand"
    record_stats_functions(staging, functions)
    assert drop_stale_stats(staging, functions) == 0 and (staging / "mutants" / "mutmut-stats.json").exists()
    verdicts = results.cached_verdicts([], staging)
    no_tests = {r.name for r in results.read_results([], {}, staging) if r.status == "no tests"}
    assert no_tests, "calc's scale has no test"
    assert drop_stale_stats(staging, functions | {"engine.calc.x_new"}) == 1
    assert not (staging / "mutants" / "mutmut-stats.json").exists()
    assert set(results.cached_verdicts([], staging)) == set(verdicts) - no_tests


def test_a_suite_that_gains_a_test_file_keeps_its_kills_and_judges_the_rest_again(tmp_path):
    """Real mutmut 3.8: a changed test selection (the CUDA suite gained the no-sync gate) would make
    mutmut reset every verdict itself; after forget_suite a kill is kept, not re-run, and the new
    file's tests are mapped, so the mutants they cover are killed."""
    from mutants.mutation.stage import forget_suite
    staging = make_staging(tmp_path / "staging")
    config = staging / "pyproject.toml"
    config.write_text(config.read_text().replace('["tests"]', '["tests/test_calc.py"]'))
    assert mutation_run.run_mutmut([], 1, tmp_path / "first.log", staging) == (0, False)
    meta_path = staging / "mutants" / "engine" / "calc.py.meta"
    meta = json.loads(meta_path.read_text())
    kill = next(n for n, code in meta["exit_code_by_key"].items() if code == 1 and "x_add" in n)
    meta["durations_by_key"][kill] = 4321.0  # a re-run would overwrite it
    meta_path.write_text(json.dumps(meta))
    assert {r.status for r in results.read_results([], {}, staging) if "x_scale" in r.name} == {"no tests"}
    (staging / "tests" / "test_scale.py").write_text(
        "from engine.calc import scale\n\n\ndef test_scale():\n    assert scale(2) == 6\n")
    config.write_text(config.read_text().replace('["tests/test_calc.py"]',
                                                 '["tests/test_calc.py", "tests/test_scale.py"]'))
    assert forget_suite(staging) > 0
    assert mutation_run.run_mutmut([], 1, tmp_path / "second.log", staging) == (0, False)
    meta = json.loads(meta_path.read_text())
    assert (meta["exit_code_by_key"][kill], meta["durations_by_key"][kill]) == (1, 4321.0), "the kill was re-run"
    assert {r.status for r in results.read_results([], {}, staging) if "x_scale" in r.name} == {"killed"}


def test_a_run_stopped_at_its_time_limit_leaves_no_process_and_the_next_run_resumes(tmp_path):
    """Real mutmut 3.8: a time limit shorter than mutmut's start stops it (and every child it
    forked); the same run without a limit then completes from the same folder."""
    staging = make_staging(tmp_path / "staging")
    rc, stopped = mutation_run.run_mutmut([], 1, tmp_path / "stopped.log", staging, time_limit=0.5)
    assert stopped and rc != 0
    assert _processes_working_in(staging) == [], "the stopped run left a process behind"
    assert mutation_run.run_mutmut([], 1, tmp_path / "resumed.log", staging, time_limit=600) == (0, False)
    assert {r.status for r in results.read_results([], {}, staging)} == {"killed", "survived", "no tests"}


@pytest.mark.parametrize("meta", ["missing", "older"])
def test_a_mutant_file_left_half_written_by_a_stop_is_written_again_with_its_verdicts(tmp_path, meta):
    """Real mutmut 3.8: a stop while mutmut writes a source's mutants leaves the file truncated,
    its .meta not yet (re)written; mutmut alone would take the file as done and every later run
    would fail to import it (seen once in eleven stops at 0.5 s). The next run writes it again and
    keeps the verdicts."""
    staging = make_staging(tmp_path / "staging")
    assert mutation_run.run_mutmut([], 1, tmp_path / "first.log", staging) == (0, False)
    verdicts = {r.name: r.status for r in results.read_results([], {}, staging)}
    mutant_file = staging / "mutants" / "engine" / "calc.py"
    meta_path = mutant_file.with_name("calc.py.meta")
    saved = meta_path.read_text()
    mutant_file.write_text("")  # the stop's truncated file, newer than its source
    if meta == "missing":
        meta_path.unlink()
    else:  # a rewrite stopped after an earlier run's .meta
        os.utime(meta_path, ns=(mutant_file.stat().st_mtime_ns - 10**9,) * 2)
    assert mutation_run.run_mutmut([], 1, tmp_path / "second.log", staging) == (0, False)
    assert {r.name: r.status for r in results.read_results([], {}, staging)} == verdicts
    if meta == "older":  # the verdicts came from the old .meta, not from testing again (that rewrites the times)
        assert json.loads(meta_path.read_text())["durations_by_key"] == json.loads(saved)["durations_by_key"]


def _processes_working_in(folder: Path) -> list[int]:
    """Process ids whose working directory is in `folder` (mutmut and its children work there)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(proc / "cwd").readlink().is_relative_to(folder):
                pids.append(int(proc.name))
        except OSError:  # a process that ended, or one of another user
            continue
    return pids


def test_the_listing_cache_is_keyed_by_the_listing_script_too(tmp_path, monkeypatch):
    """A changed way of listing (how a def-line mutant is named) must not read an old listing."""
    staging = make_staging(tmp_path / "staging")
    before = mutation_shard.sources_digest(staging)
    monkeypatch.setattr(mutation_shard, "_LIST_SCRIPT", mutation_shard._LIST_SCRIPT + "\n# changed\n")
    assert mutation_shard.sources_digest(staging) != before
