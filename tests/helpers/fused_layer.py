"""One fused layer's inputs, shared by the CPU and CUDA checks of engine/fused.py."""
import torch


def layer_inputs(device: str, num_slots: int, dtype: torch.dtype = torch.float32) -> list:
    """One fused layer's attention_inputs arguments on `device`: 3 tokens, GQA, a cache of num_slots;
    activations, weights and cache in `dtype`, the rotary angles in float32 (as the engine keeps them)."""
    from engine.model import rotary_angles
    g = torch.Generator().manual_seed(0)
    tokens, heads, kv_heads, head_dim, hidden = 3, 4, 2, 16, 32
    x = torch.randn(tokens, hidden, generator=g)
    qkv = torch.randn((heads + 2 * kv_heads) * head_dim, hidden, generator=g)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = rotary_angles(torch.arange(tokens), inv_freq)
    cache = torch.zeros(2, num_slots, kv_heads, head_dim)
    slots = torch.tensor([5, 9, num_slots - 1])
    x, norm, qkv, cache = (t.to(device, dtype) for t in (x, torch.ones(hidden), qkv, cache))
    return [x, norm, 1e-5, qkv, cos.to(device), sin.to(device), heads, kv_heads, head_dim, cache,
            slots.to(device)]

