"""Fixtures for the gates: the root conftest's `make_llm`, on the model, drafter and device the
gates were asked to use (--model / $SPECGATE_MODEL, --drafter / $SPECGATE_DRAFTER,
--device / $SPECGATE_DEVICE, --dtype / $SPECGATE_DTYPE; by default the models the root conftest hands down, the fixture
models, on the CPU)."""
import pytest

from gates.plugin import SESSION_PLUGIN, model_dir, option


@pytest.fixture(autouse=True)
def skip_inapplicable_drafter(request):
    """A test parametrized by a drafter the gates skip on this target (see
    gates.workloads.drafter_skips) is skipped before it runs, with the reason in the report."""
    drafter = request.node.callspec.params.get("drafter") if hasattr(request.node, "callspec") else None
    session = request.config.pluginmanager.get_plugin(SESSION_PLUGIN)
    reason = session.skipped_drafters().get(drafter) if session and drafter else None
    if reason:
        pytest.skip(reason)


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
def gate_dtype(request):
    return option(request.config, "--dtype", "SPECGATE_DTYPE")


@pytest.fixture(scope="session")
def make_llm(make_llm, drafter_dir, gate_device, gate_dtype):
    """LLM(**kwargs) on the gates' model, device and dtype; spec='block' uses the gates' drafter."""
    def make(**kwargs):
        kwargs.setdefault("device", gate_device)
        if gate_dtype:
            kwargs.setdefault("dtype", gate_dtype)
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
