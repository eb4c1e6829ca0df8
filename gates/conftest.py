"""Fixtures for the gates: the root conftest's `make_llm`, on the model, drafter and device the
gates were asked to use (--model / $SPECGATE_MODEL, --drafter / $SPECGATE_DRAFTER,
--device / $SPECGATE_DEVICE; the fixture models on the CPU by default)."""
from pathlib import Path

import pytest

from gates.plugin import option


@pytest.fixture(scope="session")
def target_dir(request):
    from fixtures import TARGET_DIR
    return Path(option(request.config, "--model", "SPECGATE_MODEL") or TARGET_DIR)


@pytest.fixture(scope="session")
def drafter_dir(request):
    return option(request.config, "--drafter", "SPECGATE_DRAFTER")


@pytest.fixture(scope="session")
def gate_device(request):
    return option(request.config, "--device", "SPECGATE_DEVICE") or "cpu"


@pytest.fixture(scope="session")
def make_llm(make_llm, drafter_dir, gate_device):
    """LLM(**kwargs) on the gates' model and device; spec='block' uses the gates' drafter."""
    def make(**kwargs):
        kwargs.setdefault("device", gate_device)
        if kwargs.get("spec") == "block" and drafter_dir:
            kwargs.setdefault("drafter", drafter_dir)
        return make_llm(**kwargs)
    return make
