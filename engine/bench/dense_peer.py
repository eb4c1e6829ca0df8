"""The gpt-fast-style peer: a minimal decoder of the same weights with fused projections, a dense
static KV cache and one compiled decode step (issue 36), so specgate's ms per step is a ratio to
a hand-written decoder measured in the same call, not to a figure from another day.

What it is, and is not: the layers of engine/model.py rewritten the way gpt-fast writes them
(q, k and v in one matmul, gate and up in one, keys and values written into a [B, KV, S, D]
cache at the step's position, SDPA over the whole cache under a causal mask row), greedy, every
request at the same position (equal-length prompts, as bench_prompts gives). On CUDA the decode
step is `torch.compile(mode="reduce-overhead", fullgraph=True)`: inductor's kernels replayed as a
CUDA graph. No paging, no scheduler, no sampler, no speculation: the floor of what a plain decode
step costs when nothing but the model runs.

ms per step is timed by difference, as the transformers peer is (engine/bench/peer.py): a short and
a long greedy decode from the same prompts, after one untimed call of each (which compiles and
captures), medians over the repeats.
"""
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from engine.activations import ACTIVATIONS
from engine.model import LlamaForCausalLM, rms_norm, rotary_angles, rotate


class DenseLayer(nn.Module):
    """One decoder layer with fused projections over its slice of the static cache."""

    def __init__(self, layer, num_heads: int, num_kv_heads: int, head_dim: int, eps: float, act: str,
                 cache_shape: tuple[int, int]):
        super().__init__()
        attn, mlp = layer.self_attn, layer.mlp
        self.wqkv = nn.Parameter(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]),
                                 requires_grad=False)
        self.wo = attn.o_proj.weight
        self.w13 = nn.Parameter(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), requires_grad=False)
        self.w2 = mlp.down_proj.weight
        self.attn_norm, self.mlp_norm = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.sizes = (num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)
        self.shape = (num_heads, num_kv_heads, head_dim)
        self.eps, self.act = eps, ACTIVATIONS[act]
        batch, max_len = cache_shape  # buffers, as gpt-fast's KVCache: the compiled graph writes them in place
        w = self.wqkv
        self.register_buffer("k_cache", w.new_zeros(batch, num_kv_heads, max_len, head_dim), persistent=False)
        self.register_buffer("v_cache", w.new_zeros(batch, num_kv_heads, max_len, head_dim), persistent=False)

    def forward(self, x, cos, sin, mask, input_pos):
        """x [B, T, hidden]; writes this step's keys and values at input_pos [T] of the caches."""
        h, kv_h, d = self.shape
        q, k, v = F.linear(rms_norm(x, self.attn_norm, self.eps), self.wqkv).split(self.sizes, dim=-1)
        q = rotate(q.unflatten(-1, (h, d)), cos, sin).transpose(1, 2)
        k = rotate(k.unflatten(-1, (kv_h, d)), cos, sin).transpose(1, 2)
        self.k_cache[:, :, input_pos] = k
        self.v_cache[:, :, input_pos] = v.unflatten(-1, (kv_h, d)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=kv_h != h)
        x = x + F.linear(out.transpose(1, 2).flatten(-2), self.wo)
        gate, up = F.linear(rms_norm(x, self.mlp_norm, self.eps), self.w13).chunk(2, dim=-1)
        return x + F.linear(self.act(gate) * up, self.w2)


class DenseDecoder(nn.Module):
    """engine/model.py's weights (shared, not copied, but for the fused matrices) as a gpt-fast
    decoder for `batch` sequences of up to `max_len` positions."""

    def __init__(self, model: LlamaForCausalLM, batch: int, max_len: int):
        super().__init__()
        cfg = model.config
        weight = model.lm_head.weight
        self.embed, self.head, self.norm = model.model.embed_tokens.weight, weight, model.model.norm.weight
        self.inv_freq, self.eps = model.rotary.inv_freq, cfg.rms_norm_eps
        self.layers = nn.ModuleList(
            DenseLayer(layer, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.dim_per_head, cfg.rms_norm_eps,
                       cfg.hidden_act, (batch, max_len)) for layer in model.model.layers)
        self.causal = torch.ones(max_len, max_len, dtype=torch.bool, device=weight.device).tril()

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] at positions input_pos [T]: the greedy next token [B] after the last one."""
        cos, sin = rotary_angles(input_pos, self.inv_freq)
        mask = self.causal[None, None, input_pos]
        x = F.embedding(tokens, self.embed)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, input_pos)
        logits = F.linear(rms_norm(x[:, -1], self.norm, self.eps), self.head).float()
        return logits.argmax(-1)


class DensePeer:
    """Greedy decoding with a DenseDecoder: the prefill eager, each decode step compiled on CUDA."""

    def __init__(self, model: LlamaForCausalLM, batch: int, max_len: int, compile: bool):
        self.decoder = DenseDecoder(model, batch, max_len)
        self.device = model.lm_head.weight.device
        self.step = (torch.compile(self.decoder, mode="reduce-overhead", fullgraph=True) if compile
                     else self.decoder)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new_tokens: int) -> torch.Tensor:
        """[B, max_new_tokens] greedy tokens of equal-length prompts."""
        tokens = torch.tensor(prompts, device=self.device)
        n = tokens.shape[1]
        out = [self.decoder(tokens, torch.arange(n, device=self.device))]
        for pos in range(n, n + max_new_tokens - 1):
            # a fresh position tensor each step: the compiled graph copies it into its static input
            out.append(self.step(out[-1][:, None], torch.tensor([pos], device=self.device)).clone())
        return torch.stack(out, dim=1)


def dense_peer_figures(model: LlamaForCausalLM, prompts: list[list[int]], concurrencies: list[int], short: int,
                       long: int, repeats: int, compile: bool, progress=None) -> dict:
    """Per concurrency c (the first c prompts): ms per decode step by the difference of a short
    and a long greedy decode, and the first tokens (to check against specgate's)."""
    cuda = model.lm_head.weight.device.type == "cuda"
    out = {"decoder": "gpt-fast style: fused qkv and gate/up, dense static KV cache, SDPA, greedy",
           "compiled": compile, "dtype": str(model.lm_head.weight.dtype),
           "method": f"(t({long} tokens) - t({short})) / {long - short}, medians of {repeats}", "per_concurrency": {}}
    for c in concurrencies:
        peer = DensePeer(model, c, len(prompts[0]) + long, compile)
        seconds = {}
        for n in (short, long):
            times = []
            for i in range(repeats + 1):
                if cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                tokens = peer.generate(prompts[:c], n)
                if cuda:
                    torch.cuda.synchronize()
                if i:  # the first call compiles and captures
                    times.append(time.perf_counter() - t0)
            seconds[n] = statistics.median(times)
        ms = (seconds[long] - seconds[short]) * 1e3 / (long - short)
        out["per_concurrency"][str(c)] = {"ms_per_step": round(ms, 4), "tokens_per_s": round(c * 1e3 / ms, 2),
                                          "seconds_short": round(seconds[short], 4),
                                          "seconds_long": round(seconds[long], 4),
                                          "first_tokens": tokens[0, :16].tolist()}
        if progress is not None:
            progress(f"dense peer c={c}: {ms:.3f} ms per step")
    return out


def dense_peer(model_dir, prompts: list[list[int]], concurrencies: list[int], device: str, short: int = 32,
               long: int = 160, repeats: int = 3, progress=None) -> dict:
    """{"ran": bool, "why"?, ...dense_peer_figures} on the folder's weights in its own dtype, compiled.
    CUDA only, as the transformers peer: its figure is the compiled CUDA-graph decoder's."""
    if not device.startswith("cuda"):
        return {"ran": False, "why": f"the dense peer runs on CUDA only (device {device}): its figure is a "
                                     "compiled decode step replayed as a CUDA graph"}
    from engine.loader import load_model
    model = load_model(model_dir, device=device)
    return {"ran": True, **dense_peer_figures(model, prompts, concurrencies, short, long, repeats, compile=True,
                                              progress=progress)}
