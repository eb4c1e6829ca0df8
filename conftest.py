"""Shared test fixtures and Hypothesis profiles for tests/ and gates/.

The top of the import layers with tests/ and fixtures/: it hands the fixture models and corpus
to the engine and the gates as their defaults (the engine and the gates import no fixtures)."""
import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

# One torch thread: deterministic on 2 cores, and safe when mutmut forks a child per mutant.
torch.set_num_threads(1)
# Triton's kernels (the paged attention backend, engine/paged_kernel.py) run on the CPU only under
# its interpreter, chosen when a kernel is defined: set before anything imports them.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Mutation runs (`specgate mutate`): a surviving mutant pays for every covering example, and a
# killed one should fail at its first; no shrinking, no example database in forked children.
settings.register_profile("mutation", max_examples=2, deadline=None, derandomize=True, database=None,
                          phases=[Phase.explicit, Phase.reuse, Phase.generate],
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config):
    from fixtures import DRAFTER_DIR, TARGET_DIR
    from gates.plugin import DEFAULT_MODELS
    config.stash[DEFAULT_MODELS] = {"target": TARGET_DIR, "drafter": DRAFTER_DIR}


@pytest.fixture(scope="session")
def target_dir():
    from fixtures import TARGET_DIR
    return TARGET_DIR


@pytest.fixture(scope="session")
def drafter_dir():
    from fixtures import DRAFTER_DIR
    return DRAFTER_DIR


@pytest.fixture(scope="session")
def corpus():
    """The fixture models' training corpus (its held-out files give unseen prompts)."""
    from fixtures.corpus import load_corpus
    return load_corpus()


@pytest.fixture(scope="session")
def make_llm(target_dir, drafter_dir):
    """Build an LLM on the fixture target (spec='block': the fixture drafter); keyword arguments
    go to LLM()."""
    from engine import LLM

    def make(**kwargs):
        # The reference forward unless a test asks for the compiled one, on CUDA too (where the
        # engine's default compiles): inductor's compile costs seconds, and under mutation a compiled
        # engine cannot run mutmut's trampolines (dynamo cannot trace them).
        kwargs.setdefault("compile", False)
        # The eager arm unless a test asks for the graph arm (CUDA's default, engine/config.py): each
        # test and gate picks its arm, and the arm-parametrized gates judge both.
        kwargs.setdefault("graph", False)
        kwargs.setdefault("max_model_len", 256)
        kwargs.setdefault("max_num_batched_tokens", 1024)
        if kwargs.get("spec") == "block":
            kwargs.setdefault("drafter", str(drafter_dir))
        return LLM(target_dir, **kwargs)
    return make
