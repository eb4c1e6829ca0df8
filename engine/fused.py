"""The fused forward (EngineConfig.compile): model.py's arithmetic regrouped so inductor can fuse it.

model.py is the reference: one module per operation, as Hugging Face writes Llama, and a few
dozen small kernels per layer when run eagerly; its norm and rotary functions serve both. Here
each layer runs as three functions over plain tensors, compiled once by torch.compile and shared
by every layer and every bucket (dynamic shapes):

    attention_inputs: RMSNorm -> one QKV matmul -> rotary on q and k together
                      -> k and v written into the layer's KV cache             (fused elementwise)
    sdpa_read:        the sdpa backend's gather, mask and SDPA over the paged cache
    mlp_block:        o_proj + residual -> RMSNorm -> one gate/up matmul -> act * up -> down + residual

On CUDA a one-token step (a plain decode step at one request) runs each projection as one of
engine/gemv.py's Triton GEMVs instead, with its neighbours fused in: attention_inputs whole (the
norm, QKV, the rotary and the cache write), the norm before gate/up, silu(gate) * up before
down, the residual adds after o_proj and down. Four kernels a layer around the attention read.

The KV cache write happens inside attention_inputs, in place (an indexed write into a graph input
is re-inplaced, no copy of the cache: `test_the_compiled_layer_writes_the_cache_in_place`), not
as two eager writes. On steps of several tokens both residual adds ride on cuBLAS (addmm adds them
in the matmul's epilogue), so moving one into the next norm saves no kernel (measured on an H100,
docs/measurements.md).

With compile=True the runner also compiles the pure pieces of the step around the forward: the
combine (engine/combine.py), the sdpa attention metadata, the logits gather, verify (whose keyed
sampler is ~150 integer ops a step, greedy rows included) and the n-gram proposer; `compiled`
below serves them all. The commit, which writes the runner's state, stays eager. The rotary angles are
computed once per step, not once per layer. Packing q/k/v and gate/up into one weight each keeps
the Hugging Face parameters as views of it, so a checkpoint still loads and the memory is not
doubled.
"""
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.activations import ACTIVATIONS
from engine.attention import AttentionMetadata, compile_fullgraph, read_cache, sdpa_read, write_cache
from engine.model import LlamaForCausalLM, rms_norm, rotary_angles, rotate

if TYPE_CHECKING:
    from engine.gemv import OneTokenKernels

GEMV_ACTIVATIONS = ("silu", "swish")  # the activations engine/gemv.py's act * up prologue computes


@dataclass(frozen=True)
class PackedLayer:
    input_norm: torch.Tensor
    qkv: torch.Tensor       # [q + 2 kv, hidden]: q_proj, k_proj and v_proj stacked
    o_proj: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor   # [2 intermediate, hidden]: gate_proj then up_proj
    down: torch.Tensor


def pack_layers(model: LlamaForCausalLM) -> list[PackedLayer]:
    """One QKV and one gate/up weight per layer; the model's own parameters become views of them."""
    packed = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = _stack(attn.q_proj, attn.k_proj, attn.v_proj)
        gate_up = _stack(mlp.gate_proj, mlp.up_proj)
        packed.append(PackedLayer(layer.input_layernorm.weight.data, qkv, attn.o_proj.weight.data,
                                  layer.post_attention_layernorm.weight.data, gate_up, mlp.down_proj.weight.data))
    return packed


def _stack(*linears) -> torch.Tensor:
    stacked = torch.cat([lin.weight.data for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(stacked[start:start + rows], requires_grad=False)
        start += rows
    return stacked


def attention_inputs(x, norm, eps: float, qkv, cos, sin, heads: int, kv_heads: int, head_dim: int,
                     cache, slot_mapping):
    """The layer's rotated queries; its keys and values go straight into the cache."""
    return rotate_and_write(F.linear(rms_norm(x, norm, eps), qkv), cos, sin, heads, kv_heads, head_dim, cache,
                            slot_mapping)


def rotate_and_write(h, cos, sin, heads: int, kv_heads: int, head_dim: int, cache, slot_mapping):
    """attention_inputs after its QKV matmul: h [T, (heads + 2 kv_heads) * head_dim]."""
    qk, v = h.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
    # q and k rotated together: one kernel over every head, not one per tensor
    q, k = rotate(qk.unflatten(-1, (-1, head_dim)), cos, sin).split([heads, kv_heads], dim=-2)
    write_cache(cache, k, v.unflatten(-1, (-1, head_dim)), slot_mapping)
    return q


def mlp_block(x, attn, o_proj, norm, eps: float, gate_up, down, act: str):
    x = x + F.linear(attn.flatten(-2), o_proj)
    gate, up = F.linear(rms_norm(x, norm, eps), gate_up).chunk(2, dim=-1)
    return x + F.linear(ACTIVATIONS[act](gate) * up, down)


@dataclass(frozen=True)
class Kernels:
    rotary_angles: Callable
    attention_inputs: Callable
    sdpa_read: Callable
    mlp_block: Callable
    final_norm: Callable
    # engine/gemv.py's kernels, for one-token steps (CUDA's compiled forward); None: every step
    # takes attention_inputs and mlp_block, the matmuls on cuBLAS
    gemv: "OneTokenKernels | None" = None


def compiled(fn: Callable) -> Callable:
    """fn compiled by inductor for any batch and query length (dynamic shapes, one graph)."""
    return compile_fullgraph(fn, dynamic=True)


def compiled_kernels(gemv: bool = False) -> Kernels:
    """Inductor's versions of the functions above; with gemv (CUDA), one-token steps' projections
    are engine/gemv.py's Triton kernels."""
    return Kernels(compiled(rotary_angles), compiled(attention_inputs), compiled(sdpa_read),
                   compiled(mlp_block), compiled(rms_norm), _one_token_kernels() if gemv else None)


def eager_kernels(gemv: bool = False) -> Kernels:
    """The same functions uncompiled: what the CPU tests compare with the reference model (with
    gemv, the Triton projections, which on the CPU run under Triton's interpreter)."""
    return Kernels(rotary_angles, attention_inputs, sdpa_read, mlp_block, rms_norm,
                   _one_token_kernels() if gemv else None)


def _one_token_kernels() -> "OneTokenKernels":
    from engine.gemv import ONE_TOKEN  # imports Triton, which only this path needs
    return ONE_TOKEN


class FusedForward:
    """Called as LlamaForCausalLM.forward is; the model's weights, packed (its own parameters
    become views of the packed ones)."""

    def __init__(self, model: LlamaForCausalLM, kernels: Kernels):
        cfg = model.config
        self.model = model
        self.layers = pack_layers(model)
        self.kernels = kernels
        self.shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.dim_per_head)
        self.gqa = cfg.num_attention_heads != cfg.num_key_value_heads
        self.eps = cfg.rms_norm_eps
        self.act = cfg.hidden_act

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                 meta: AttentionMetadata, aux_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        kern, eps = self.kernels, self.eps
        x = self.model.model.embed_tokens(input_ids)
        cos, sin = kern.rotary_angles(positions, self.model.rotary.inv_freq)
        aux = []
        one_token = kern.gemv if self.act in GEMV_ACTIVATIONS and input_ids.shape[0] == 1 else None
        for i, (layer, cache) in enumerate(zip(self.layers, kv_caches)):
            if one_token is not None:  # four Triton kernels, all but the attention read fused into them
                project = one_token.project
                q = one_token.attention_inputs(x, layer.input_norm, eps, layer.qkv, cos, sin, *self.shape, cache,
                                               meta.slot_mapping)
                x = project(self._read(q, cache, meta).flatten(-2), layer.o_proj, residual=x)
                x = project(project(x, layer.gate_up, norm=layer.post_norm, eps=eps), layer.down, silu_mul=True,
                            residual=x)
            else:
                q = kern.attention_inputs(x, layer.input_norm, eps, layer.qkv, cos, sin, *self.shape, cache,
                                          meta.slot_mapping)
                x = kern.mlp_block(x, self._read(q, cache, meta), layer.o_proj, layer.post_norm, eps,
                                   layer.gate_up, layer.down, self.act)
            if i in aux_layers:
                aux.append(x)
        return kern.final_norm(x, self.model.model.norm.weight, eps), aux

    def _read(self, q: torch.Tensor, cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if meta.block_mask is not None or meta.paged is not None:  # flex, paged: kernels of their own
            return read_cache(q, cache, meta)
        return self.kernels.sdpa_read(q, cache, meta.query_req, meta.query_offset, meta.context_slots,
                                      meta.attn_mask, meta.max_query_len, self.gqa)
