"""CUDA-only mutation runs judge only where CUDA really runs: mutmut's stats are collected in a
process of their own (so the process that forks each mutant's child never started CUDA), and a
mutant's child in which CUDA does not start refuses to judge rather than read as a kill."""
import json
import tomllib

import pytest

from mutants import mutation_results, mutation_run
from test_mutation_shards import make_staging  # the two-function package staged for a real mutmut run


def test_a_cuda_run_collects_mutmut_s_stats_apart_and_tests_no_mutant_while_it_does(tmp_path):
    """Real mutmut 3.8: warm_stats leaves the stats and no verdict: the run after it forks its children
    from a process that ran no test."""
    staging = make_staging(tmp_path / "staging")
    mutation_run.warm_stats(staging, tmp_path / "stats.log")
    stats = json.loads((staging / "mutants" / "mutmut-stats.json").read_text())
    assert set(stats["duration_by_test"]) == {"tests/test_calc.py::test_add", "tests/test_calc.py::test_half"}
    assert mutation_results.cached_verdicts([], staging) == {}, "no mutant may be tested while stats are collected"
    (staging / "tests" / "test_calc.py").write_text("import engine.nowhere\n")
    with pytest.raises(ValueError, match="collecting mutmut's test stats failed"):
        mutation_run.warm_stats(staging, tmp_path / "broken.log")


def test_a_mutant_child_that_cannot_use_cuda_refuses_to_judge(monkeypatch):
    """Every CUDA test in such a child fails, so its verdict would be a kill of anything: the
    plugin stops it with a usage error (pytest's exit 4: mutmut's `suspicious`, a failed run)."""
    import torch
    from tqdm import tqdm

    from mutants import mutation_plugin
    monkeypatch.setattr(tqdm, "_lock", tqdm.get_lock())  # the clean configure below gives tqdm a lock of its own
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    with pytest.raises(pytest.UsageError, match="forked after CUDA was initialized"):
        mutation_plugin.pytest_configure(None)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)

    def no_driver():
        raise RuntimeError("CUDA error: initialization error")
    monkeypatch.setattr(torch.cuda, "init", no_driver)
    monkeypatch.setenv("SPECGATE_DEVICE", "cuda")
    monkeypatch.setenv("MUTANT_UNDER_TEST", "")
    mutation_plugin.pytest_configure(None)  # the parent's own sessions (stats, clean tests) start no CUDA
    monkeypatch.setenv("MUTANT_UNDER_TEST", "engine.calc.x_add__mutmut_1")
    with pytest.raises(pytest.UsageError, match="CUDA does not start in this mutant's child"):
        mutation_plugin.pytest_configure(None)
    monkeypatch.setenv("SPECGATE_DEVICE", "cpu")
    mutation_plugin.pytest_configure(None)  # a CPU run's child never starts CUDA


def test_a_cuda_run_forks_its_children_from_mutmut_s_fork_server_and_a_cpu_run_from_mutmut(tmp_path):
    """The CUDA staging asks for mutmut's fork server (its clean tests and stats run in children,
    never in the process the mutants' children fork from); the CPU staging keeps the faster
    default. Real mutmut 3.8 on the two-function package gives the same verdicts either way."""
    from mutants.mutation_stage import CUDA_SUITE, SUITE, staging_config
    assert tomllib.loads(staging_config(CUDA_SUITE))["tool"]["mutmut"]["process_isolation"] == "forkserver"
    assert tomllib.loads(staging_config(SUITE))["tool"]["mutmut"]["process_isolation"] == "fork"
    verdicts = {}
    for isolation in ("fork", "forkserver"):
        staging = make_staging(tmp_path / isolation)
        with open(staging / "pyproject.toml", "a") as f:
            f.write(f'process_isolation = "{isolation}"\n')
        assert mutation_run.run_mutmut([], 1, tmp_path / f"{isolation}.log", staging) == 0
        verdicts[isolation] = {r.name: r.status for r in mutation_results.read_results([], {}, staging)}
    assert verdicts["fork"] == verdicts["forkserver"] and "killed" in verdicts["fork"].values()
