"""Every tensor the engine creates for a model, with the dtype transformers gives it: weights and
caches in the engine's dtype, the rotary frequencies in float32 whatever that dtype is (rounded to
bfloat16 they are off by up to 1e-3, about a radian of rope angle at position 1,000, and greedy
tokens of long prompts change). A new buffer or parameter not in PRECISION fails here, so its
precision is decided, not inherited."""
import fnmatch

import pytest
import torch

from engine import LLM
from engine.rope import inv_freq
from fixtures import DRAFTER_DIR, TARGET_DIR

WEIGHTS = "the engine's dtype"
# name pattern -> dtype (WEIGHTS: the dtype the engine runs in), first match wins
PRECISION: dict[str, torch.dtype | str] = {
    "*rotary.inv_freq": torch.float32,   # transformers computes and keeps rotary frequencies in float32
    "*.weight": WEIGHTS,                 # projections, embeddings, norms' scales
    "kv_caches.*": WEIGHTS,              # transformers' cache holds keys and values in the model's dtype
}


def engine_tensors(llm: LLM) -> dict[str, torch.Tensor]:
    """Parameters and buffers of the target and the drafter, and both KV caches, by name."""
    out = {}
    modules = {"target": llm.model, "drafter": getattr(llm.runner.proposer, "drafter", None)}
    for prefix, module in modules.items():
        if module is None:
            continue
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            out[f"{prefix}.{name}"] = t
    for prefix, owner in (("target", llm.runner), ("drafter", llm.runner.proposer)):
        for i, cache in enumerate(getattr(owner, "kv_caches", [])):
            out[f"kv_caches.{prefix}.{i}"] = cache
    return out


def expected_dtype(name: str, engine_dtype: torch.dtype) -> torch.dtype:
    rule = next((dtype for pattern, dtype in PRECISION.items() if fnmatch.fnmatch(name, pattern)), None)
    assert rule is not None, f"{name} is not in PRECISION: decide the precision transformers gives it"
    return engine_dtype if rule == WEIGHTS else rule


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_buffer_and_parameter_has_transformers_precision(dtype):
    llm = LLM(TARGET_DIR, dtype=dtype, spec="block", drafter=DRAFTER_DIR, max_model_len=128)
    tensors = engine_tensors(llm)
    assert any("drafter." in n for n in tensors) and any(n.startswith("kv_caches.") for n in tensors)
    wrong = {n: t.dtype for n, t in tensors.items() if t.dtype != expected_dtype(n, llm.config.torch_dtype)}
    assert not wrong, f"{dtype} engine: tensors in the wrong dtype: {wrong}"


def test_bfloat16_rotary_frequencies_are_the_float32_ones_bit_for_bit():
    llm = LLM(TARGET_DIR, dtype="bfloat16", max_model_len=128)
    cfg = llm.model_config
    assert llm.model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(llm.model.rotary.inv_freq, inv_freq(cfg.dim_per_head, cfg.rope_theta, cfg.rope_scaling))
