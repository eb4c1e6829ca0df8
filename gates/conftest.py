"""Fixtures for the gates: the root conftest's `make_llm`, on the model, drafter and device the
gates were asked to use (--model / $SPECGATE_MODEL, --drafter / $SPECGATE_DRAFTER,
--device / $SPECGATE_DEVICE, --dtype / $SPECGATE_DTYPE; by default the models the root conftest hands down, the fixture
models, on the CPU), and on the forward the test judges.

The `forward` axis: a gate whose verdict depends on the forward (Gate.forward_axis) runs each of its
tests that builds engines once per forward of `axis_forwards` (gates/plugin.py: the reference and
the compiled forward on a cuda device; the reference alone on the CPU), as a module-scoped
parameter, so a module's fixtures (lossless's plain greedy run) are built once per forward and the
compiled engines' kernels compile once per process. Every engine a gate builds runs the reference
forward unless the axis or the test (compile=...) says otherwise, and the gate's report names the
forwards its engines ran.
"""
import pytest

from gates.plugin import REFERENCE, SESSION_PLUGIN, axis_forwards, model_dir, option


def pytest_generate_tests(metafunc):
    session = metafunc.config.pluginmanager.get_plugin(SESSION_PLUGIN)
    gate = session.gate_of(metafunc.definition.path) if session is not None else None
    if gate is None or not gate.forward_axis or "make_llm" not in metafunc.fixturenames \
            or metafunc.definition.get_closest_marker("forwards"):
        return
    forwards = axis_forwards(metafunc.config)
    # The reference alone: no parameter, so a CPU run keeps its test ids. Any other axis, one
    # forward included (--forwards compiled on CUDA), is a parameter: it is what the engines build
    # on and what the gate claims.
    if forwards != (REFERENCE,):
        metafunc.parametrize("forward", forwards, indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def forward(request) -> str:
    """The forward of this test's engines: its axis value, else the reference forward."""
    return getattr(request, "param", REFERENCE)


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
def make_llm(request, make_llm, drafter_dir, gate_device, gate_dtype):
    """LLM(**kwargs) on the gates' model, device and dtype, and the running test's forward unless
    compile= is given; spec='block' uses the gates' drafter. The session records each engine's forward
    as judged by the running gate, except with judged=False (the reference decoder's model)."""
    session = request.config.pluginmanager.get_plugin(SESSION_PLUGIN)

    def make(judged: bool = True, **kwargs):
        kwargs.setdefault("device", gate_device)
        if gate_dtype:
            kwargs.setdefault("dtype", gate_dtype)
        if kwargs.get("spec") == "block" and drafter_dir:
            kwargs.setdefault("drafter", drafter_dir)
        if session is None:  # the gate modules run without the gates plugin
            return make_llm(**{"compile": False, **kwargs})
        return session.build_engine(make_llm, judged, **kwargs)
    return make


@pytest.fixture(scope="session")
def reference(make_llm):
    """The session's naive reference decoder (gates/reference.py) on the gates' model; its
    greedy streams are cached, so every gate that asks pays for each prompt once. It runs the
    model's own dense forward, never the compiled one."""
    from gates.reference import ReferenceDecoder
    llm = make_llm(compile=False, judged=False)
    return ReferenceDecoder(llm.model, llm.eos_token_ids)
