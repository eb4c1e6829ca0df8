"""Fixtures for the gates: the root conftest's `make_llm`, on the model, drafter and device the
gates were asked to use (--model / $SPECGATE_MODEL, --drafter / $SPECGATE_DRAFTER,
--device / $SPECGATE_DEVICE; by default the models the root conftest hands down, the fixture
models, on the CPU)."""
import pytest

from gates.plugin import model_dir, option


@pytest.fixture(scope="session")
def target_dir(request):
    return model_dir(request.config, "target")


@pytest.fixture(scope="session")
def drafter_dir(request):
    return model_dir(request.config, "drafter")


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


@pytest.fixture(scope="session")
def reference(make_llm):
    """The session's naive reference decoder (gates/reference.py) on the gates' model; its
    greedy streams are cached, so every gate that asks pays for each prompt once."""
    from gates.reference import ReferenceDecoder
    llm = make_llm()
    return ReferenceDecoder(llm.model, llm.eos_token_ids)
