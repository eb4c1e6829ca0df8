"""The fast path by default on CUDA only: the compiled forward, the graph arm and the paged
attention kernel (EngineConfig.compile, graph and attention_backend None, resolved by the device);
and where compiled kernels are kept between runs (engine/compile_cache.py): specgate's cache
folder, with inductor pointed into it before the engine's first torch.compile."""
import os

import pytest

from engine.config import EngineConfig
from engine.defaults import resolve_attention_backend, resolve_compile, resolve_graph
from engine.errors import SpecgateError


def engine(**kwargs):
    return EngineConfig(model="unused", **kwargs)


@pytest.mark.parametrize("name, resolve", [("compile", resolve_compile), ("graph", resolve_graph)])
@pytest.mark.parametrize("value", [1, 0, "yes", "auto"])
def test_resolve_refuses_what_is_not_a_bool_or_none(name, resolve, value):
    with pytest.raises(SpecgateError, match=f"^{name} must be True, False or None"):
        resolve(value, "cuda")
    with pytest.raises(SpecgateError, match=f"^{name} must be True, False or None"):
        engine(**{name: value})


@pytest.mark.parametrize("compile, device, expected", [
    (None, "cpu", False), (None, "cuda", True), (None, "cuda:1", True),
    (True, "cpu", True), (False, "cuda", False), (False, "cpu", False), (True, "cuda:0", True),
])
def test_compile_is_resolved_by_the_device_unless_given(compile, device, expected):
    """None: the compiled forward on CUDA, the reference on the CPU; the config then holds a bool, and
    its forward in the words of the veto's evidence."""
    cfg = engine(compile=compile, device=device)
    assert cfg.compile is expected and resolve_compile(compile, device) is expected
    assert cfg.forward == ("compiled" if expected else "reference")
    assert engine(device=device).compile is device.startswith("cuda")


@pytest.mark.parametrize("graph, device, expected", [
    (None, "cpu", False), (None, "cuda", True), (None, "cuda:1", True),
    (True, "cpu", True), (False, "cuda", False), (False, "cpu", False),
])
def test_graph_arm_is_resolved_by_the_device_unless_given(graph, device, expected):
    """None: the graph arm on CUDA (where the eager arm is bound by kernel launches), the eager arm on
    the CPU; the config then holds a bool."""
    assert engine(graph=graph, device=device).graph is expected and resolve_graph(graph, device) is expected


@pytest.mark.parametrize("backend, device, expected", [
    (None, "cpu", "sdpa"), (None, "cuda", "paged"), (None, "cuda:1", "paged"),
    ("sdpa", "cuda", "sdpa"), ("flex", "cuda", "flex"), ("paged", "cuda:0", "paged"), ("sdpa", "cpu", "sdpa"),
])
def test_attention_backend_is_resolved_by_the_device_unless_given(backend, device, expected):
    """None: the paged Triton kernel on CUDA, sdpa on the CPU (Triton runs there only under its
    interpreter); the config then holds the backend's name, which the gates record and the veto's
    evidence names."""
    assert engine(attention_backend=backend, device=device).attention_backend == expected
    assert resolve_attention_backend(backend, device) == expected


@pytest.mark.parametrize("value", ["auto", "flash", "", 1])
def test_attention_backend_refuses_a_name_it_does_not_know(value):
    with pytest.raises(SpecgateError, match="^attention_backend must be one of .* or None"):
        engine(attention_backend=value, device="cuda")


def test_specgate_cache_is_the_environment_s_else_the_home_cache(monkeypatch, tmp_path):
    from engine.compile_cache import specgate_cache
    monkeypatch.setenv("SPECGATE_CACHE", str(tmp_path / "c"))
    assert specgate_cache() == tmp_path / "c"
    monkeypatch.delenv("SPECGATE_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert specgate_cache() == tmp_path / "home" / ".cache" / "specgate"


def test_inductor_keeps_its_kernels_in_specgate_s_cache_unless_told_otherwise(monkeypatch, tmp_path):
    """Unset, TORCHINDUCTOR_CACHE_DIR is set to SPECGATE_CACHE/inductor for the process (torch's own
    default under /tmp does not outlive a reboot or prove's TMPDIR); a folder given is kept."""
    from engine.compile_cache import INDUCTOR_CACHE_ENV, inductor_cache_dir
    monkeypatch.setenv("SPECGATE_CACHE", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    assert inductor_cache_dir() == tmp_path / "inductor"
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "inductor")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"
    assert os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / "mine")
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "")  # empty is unset
    assert inductor_cache_dir() == tmp_path / "inductor"


def test_every_engine_compile_sets_the_kernel_cache_first(monkeypatch, tmp_path):
    """compile_fullgraph, the engine's one call of torch.compile (the fused forward and flex alike),
    points inductor at specgate's cache before it compiles."""
    import torch

    from engine.attention import compile_fullgraph
    from engine.compile_cache import INDUCTOR_CACHE_ENV
    monkeypatch.setenv("SPECGATE_CACHE", str(tmp_path))
    monkeypatch.delenv(INDUCTOR_CACHE_ENV, raising=False)
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(os.environ.get(INDUCTOR_CACHE_ENV)) or fn)
    compile_fullgraph(abs, dynamic=True)
    assert seen == [str(tmp_path / "inductor")]
