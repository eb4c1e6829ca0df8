"""The Llama architecture, as in Hugging Face's LlamaForCausalLM, over a paged KV cache.

`forward` serves the engine (flattened ragged batch, paged cache, logits only at
logits_indices); `forward_dense` serves training and reference checks ([B, L], causal).
"""
import torch
import torch.nn.functional as F
from torch import nn

from engine.activations import ACTIVATIONS
from engine.attention import AttentionMetadata, paged_attention
from engine.config import ModelConfig
from engine.rope import RopeScaling, inv_freq


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in float32, as Hugging Face does, then cast back."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., T, 1, D] of the rotary embedding at `positions`."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[..., None, :], emb.sin()[..., None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, H, D] rotated by the angles of rotary_angles (rotate_half layout)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return (x.float() * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding in the non-interleaved (rotate_half) layout Llama uses."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None = None):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq(head_dim, theta, scaling), persistent=False)

    def _apply(self, fn, recurse=True):
        """`.to(dtype)` on the model moves inv_freq but keeps it float32, as transformers does: in
        bfloat16 it is off by up to 1e-3, about a radian of angle at position 1,000."""
        kept = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = kept.to(device=self.inv_freq.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [..., T, H, D] with positions broadcastable to [..., T]."""
        return rotate(x, *rotary_angles(positions, self.inv_freq))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.dim_per_head
        self.q_proj = nn.Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding):
        q = rope(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)), positions)
        k = rope(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)), positions)
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return q, k, v

    def forward(self, x, positions, rope, kv_cache, meta: AttentionMetadata):
        q, k, v = self.project(x, positions, rope)
        return self.o_proj(paged_attention(q, k, v, kv_cache, meta).flatten(-2))

    def forward_dense(self, x, positions, rope):
        q, k, v = (t.transpose(1, 2) for t in self.project(x, positions, rope))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=self.num_kv_heads != self.num_heads)
        return self.o_proj(out.transpose(1, 2).flatten(-2))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.act = ACTIVATIONS[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, attend):
        x = x + attend(self.self_attn, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Parameter names match Hugging Face's, so a safetensors checkpoint loads as is."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.rotary = RotaryEmbedding(cfg.dim_per_head, cfg.rope_theta, cfg.rope_scaling)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _run_layers(self, x, attend, aux_layers):
        aux = []
        for i, layer in enumerate(self.model.layers):
            x = layer(x, attend)
            if i in aux_layers:
                aux.append(x)
        return self.model.norm(x), aux

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[torch.Tensor], meta: AttentionMetadata,
                aux_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Flattened batch: input_ids, positions [T]. Returns final hidden [T, D] and the
        outputs of `aux_layers` (for a drafter that conditions on target hidden states)."""
        caches = iter(kv_caches)

        def attend(attn, h):
            return attn(h, positions, self.rotary, next(caches), meta)

        return self._run_layers(self.model.embed_tokens(input_ids), attend, aux_layers)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def forward_dense(self, input_ids: torch.Tensor, aux_layers: tuple[int, ...] = ()):
        """[B, L] causal forward without a cache, for training and reference checks."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)

        def attend(attn, h):
            return attn.forward_dense(h, positions, self.rotary)

        hidden, aux = self._run_layers(self.model.embed_tokens(input_ids), attend, aux_layers)
        return self.compute_logits(hidden), aux
