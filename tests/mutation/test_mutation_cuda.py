"""CUDA-only mutation runs judge only where CUDA really runs: each mutant's child forks from a
process that ran no test (mutmut's fork server; its stats and clean tests run in children of
their own), and a mutant's child in which CUDA does not start refuses to judge rather than read
as a kill."""
import tomllib

import pytest
from test_mutation_shards import make_staging  # the two-function package staged for a real mutmut run

from mutants.mutation import results
from mutants.mutation import run as mutation_run

# A test that records, for each process it runs in, its pid, its parent's pid and what mutmut runs
# there (MUTANT_UNDER_TEST: a mutant's name, or mutmut's own word for its stats and clean runs).
WHO_RAN = '''

def test_records_its_process():
    import os
    add(1, 2), half(3)  # covers both tested functions, so mutmut runs it for their mutants
    with open(os.environ["WHO_RAN"], "a") as f:
        f.write(f"{os.getpid()} {os.getppid()} {os.environ.get('MUTANT_UNDER_TEST', '')}\\n")
'''


@pytest.mark.parametrize("error", ["CUDA error: initialization error",
                                   "Cannot re-initialize CUDA in forked subprocess"])
def test_a_mutant_child_that_cannot_use_cuda_refuses_to_judge(monkeypatch, error):
    """Every CUDA test in such a child fails, so its verdict would be a kill of anything: the
    plugin stops it with a usage error (pytest's exit 4: mutmut's `suspicious`, a failed run).
    The driver's error and torch's bad-fork refusal both show as torch.cuda.init() raising."""
    import torch
    from tqdm import tqdm

    from mutants.mutation import plugin as mutation_plugin
    monkeypatch.setattr(tqdm, "_lock", tqdm.get_lock())  # the clean configure below gives tqdm a lock of its own

    def cuda_cannot_start():
        raise RuntimeError(error)
    monkeypatch.setattr(torch.cuda, "init", cuda_cannot_start)
    monkeypatch.setenv("SPECGATE_DEVICE", "cuda")
    monkeypatch.setenv("MUTANT_UNDER_TEST", "")
    mutation_plugin.pytest_configure(None)  # mutmut's own sessions (stats, clean tests) start no CUDA
    monkeypatch.setenv("MUTANT_UNDER_TEST", "engine.calc.x_add__mutmut_1")
    with pytest.raises(pytest.UsageError, match="CUDA does not start in this mutant's child"):
        mutation_plugin.pytest_configure(None)
    monkeypatch.setenv("SPECGATE_DEVICE", "cpu")
    mutation_plugin.pytest_configure(None)  # a CPU run's child never starts CUDA


def test_a_cuda_run_forks_its_children_from_a_process_that_ran_no_test(tmp_path, monkeypatch):
    """Real mutmut 3.8. The CUDA staging asks for the fork server: no mutant's child there has a
    parent that ran a test, while under the CPU staging's `fork` the clean tests run in the very
    process every child forks from (the negative control, and why a CUDA test there left no child
    able to start CUDA). The verdicts are the same either way."""
    from mutants.mutation.stage import CUDA_SUITE, SUITE, staging_config
    assert tomllib.loads(staging_config(CUDA_SUITE))["tool"]["mutmut"]["process_isolation"] == "forkserver"
    assert tomllib.loads(staging_config(SUITE))["tool"]["mutmut"]["process_isolation"] == "fork"
    verdicts, parents_that_ran_tests = {}, {}
    for isolation in ("fork", "forkserver"):
        staging = make_staging(tmp_path / isolation)
        with open(staging / "tests" / "test_calc.py", "a") as f:
            f.write(WHO_RAN)
        with open(staging / "pyproject.toml", "a") as f:
            f.write(f'process_isolation = "{isolation}"\n')
        log = tmp_path / f"{isolation}-processes.txt"
        monkeypatch.setenv("WHO_RAN", str(log))
        assert mutation_run.run_mutmut([], 1, tmp_path / f"{isolation}.log", staging) == (0, False)
        verdicts[isolation] = {r.name: r.status for r in results.read_results([], {}, staging)}
        rows = [line.split(" ", 2) for line in log.read_text().splitlines()]
        ran_tests = {pid for pid, _, mutant in rows if "__mutmut_" not in mutant}
        mutant_parents = {parent for _, parent, mutant in rows if "__mutmut_" in mutant}
        assert mutant_parents, "no mutant's child ran the recording test"
        parents_that_ran_tests[isolation] = mutant_parents & ran_tests
    assert parents_that_ran_tests == {"fork": parents_that_ran_tests["fork"], "forkserver": set()}
    assert parents_that_ran_tests["fork"], \
        "the negative control: under fork, children fork from the clean run's process"
    assert verdicts["fork"] == verdicts["forkserver"] and "killed" in verdicts["fork"].values()
