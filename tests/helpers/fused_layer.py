"""One fused layer's inputs, shared by the CPU and CUDA checks of engine/fused.py and engine/gemv.py."""
import torch


def layer_inputs(device: str, num_slots: int, dtype: torch.dtype = torch.float32, *, tokens: int = 3,
                 heads: int = 4, kv_heads: int = 2, head_dim: int = 16, hidden: int = 32, seed: int = 0,
                 slots: list[int] | None = None, positions: list[int] | None = None) -> list:
    """One fused layer's attention_inputs arguments on `device`: `tokens` tokens at `positions`
    (default 0, 1, ...) written to `slots` (default 5, 9, the last slot), GQA, a cache of num_slots
    holding noise (a write to the wrong place shows); activations, weights and cache in `dtype`, the
    rotary angles in float32 (as the engine keeps them)."""
    from engine.model import rotary_angles
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    norm = 1 + torch.randn(hidden, generator=g) / 4
    qkv = torch.randn((heads + 2 * kv_heads) * head_dim, hidden, generator=g) / hidden ** 0.5
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    cos, sin = rotary_angles(torch.tensor(positions if positions is not None else range(tokens)), inv_freq)
    cache = torch.randn(2, num_slots, kv_heads, head_dim, generator=g)
    slots = torch.tensor(slots if slots is not None else [5, 9, num_slots - 1][:tokens])
    x, norm, qkv, cache = (t.to(device, dtype) for t in (x, norm, qkv, cache))
    return [x, norm, 1e-5, qkv, cos.to(device), sin.to(device), heads, kv_heads, head_dim, cache,
            slots.to(device)]
