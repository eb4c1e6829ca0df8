"""The block drafter (DFlash-style): k drafts from one non-causal forward, conditioned on the
target's hidden states.

The drafter is a small stack of Llama decoder layers of the target's width. Outputs of a few
target layers (`aux_layers`) are concatenated, projected by `fc` and normed into one context
feature per committed token; each draft layer's own k_proj/v_proj turn that feature into
extra keys and values ("context K/V"). To draft, the block [last committed token x_p at
position p, MASK x k_max at p+1..p+k_max] attends to the context K/V of positions < p and to
every block token (no causal mask); rows 1..k, through the final norm and the target's
lm_head, give the draft logits. The target's embed_tokens and lm_head are shared, not stored.

In the engine the context K/V live in a paged cache with the target's slot addressing:
`observe` writes every token the target ran, whatever was accepted, and a rejected
position is simply overwritten later and never read before that (only positions < p are).
"""
import os
import warnings
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, context_slots
from engine.config import EngineConfig, ModelConfig, read_config_json, require_fields
from engine.errors import ModelLoadError, SpecgateError
from engine.loader import WEIGHTS_FILE, file_sha256, load_weights, read_state_dict
from engine.model import DecoderLayer, LlamaForCausalLM, RMSNorm, RotaryEmbedding
from engine.proposers import ProposeInput, Proposer
from engine.sampling import STREAM_DRAFT, sample_from_probs
from engine.tokenizer import MASK_ID

ARCHITECTURE, MODEL_TYPE = "DFlashDraftModel", "specgate_dflash"


@dataclass(frozen=True)
class DrafterConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    aux_layers: tuple[int, ...]      # target layers whose outputs condition the drafter
    block_size: int                  # k_max: drafts per block the drafter was trained for
    mask_token_id: int = MASK_ID
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 1024
    target_sha256: str | None = None  # sha256 of the target's model.safetensors

    def __post_init__(self):
        if not self.aux_layers or not all(isinstance(i, int) for i in self.aux_layers):
            raise ModelLoadError(f"drafter config.json: aux_layers must be a non-empty list of "
                                 f"target layer indices, got {self.aux_layers!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ModelLoadError(f"drafter config.json: block_size must be a positive integer, "
                                 f"got {self.block_size!r}")
        self.layer_config()  # validates the Llama fields

    def layer_config(self) -> ModelConfig:
        return ModelConfig(self.vocab_size, self.hidden_size, self.intermediate_size,
                           self.num_hidden_layers, self.num_attention_heads, self.num_key_value_heads,
                           self.max_position_embeddings, self.rms_norm_eps, self.rope_theta,
                           head_dim=self.head_dim)

    def to_json(self) -> dict:
        raw = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, **asdict(self)}
        raw["aux_layers"] = list(self.aux_layers)
        return raw

    @classmethod
    def from_dir(cls, drafter_dir: Path) -> "DrafterConfig":
        path, raw = read_config_json(drafter_dir, "drafter")
        if raw.get("model_type") != MODEL_TYPE or ARCHITECTURE not in (raw.get("architectures") or []):
            raise ModelLoadError(f"{path}: not a block drafter: expected model_type={MODEL_TYPE!r} and "
                                 f"architectures [{ARCHITECTURE!r}], got model_type="
                                 f"{raw.get('model_type')!r} architectures={raw.get('architectures')!r}")
        fields = cls.__dataclass_fields__
        require_fields(path, raw, [f for f, spec in fields.items() if spec.default is MISSING])
        kwargs = {k: v for k, v in raw.items() if k in fields}
        if not isinstance(kwargs["aux_layers"], list):
            raise ModelLoadError(f"{path}: aux_layers must be a list, got {kwargs['aux_layers']!r}")
        kwargs["aux_layers"] = tuple(kwargs["aux_layers"])
        return cls(**kwargs)

    def check_target(self, target: ModelConfig, source: str) -> None:
        """The drafter reads the target's hidden states and shares its embeddings and lm_head."""
        for name in ("hidden_size", "vocab_size"):
            if getattr(self, name) != getattr(target, name):
                raise ModelLoadError(f"{source}: drafter {name} {getattr(self, name)} does not match the "
                                     f"target's {getattr(target, name)}")
        bad = [i for i in self.aux_layers if not 0 <= i < target.num_hidden_layers]
        if bad:
            raise ModelLoadError(f"{source}: aux_layers {bad} are outside the target's layers "
                                 f"[0, {target.num_hidden_layers})")
        layers = list(self.aux_layers)
        if layers != sorted(set(layers)):
            raise ModelLoadError(f"{source}: aux_layers must be increasing and distinct, got {layers}")
        if not 0 <= self.mask_token_id < target.vocab_size:
            raise ModelLoadError(f"{source}: mask_token_id {self.mask_token_id} is outside the "
                                 f"vocabulary [0, {target.vocab_size})")


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DrafterConfig):
        super().__init__()
        self.config = cfg
        layer_cfg = cfg.layer_config()
        self.fc = nn.Linear(len(cfg.aux_layers) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(layer_cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta)

    def context(self, aux: list[torch.Tensor]) -> torch.Tensor:
        """[..., D] per aux layer -> one context feature [..., D] per token."""
        return self.hidden_norm(self.fc(torch.cat(aux, dim=-1)))

    def context_kv(self, ctx: torch.Tensor,
                   positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each draft layer's keys (rope at the context token's position) and values: [..., Hkv, Dh]."""
        kv = []
        for layer in self.layers:
            attn = layer.self_attn
            heads = (attn.num_kv_heads, attn.head_dim)
            k = self.rotary(attn.k_proj(ctx).unflatten(-1, heads), positions)
            kv.append((k, attn.v_proj(ctx).unflatten(-1, heads)))
        return kv

    def forward(self, block_embeds: torch.Tensor, block_positions: torch.Tensor,
                context_kv: list[tuple[torch.Tensor, torch.Tensor]],
                context_mask: torch.Tensor) -> torch.Tensor:
        """block_embeds [N, B, D] at block_positions [N, B]; context_kv per layer [N, L, Hkv, Dh];
        context_mask [N, L] True where a block may attend the context key. Every block token sees
        every other (non-causal). Returns the final-normed hidden states [N, B, D]."""
        num_blocks, block_len = block_positions.shape
        mask = torch.cat([context_mask, context_mask.new_ones(num_blocks, block_len)], dim=1)
        mask = mask[:, None, None, :]  # [N, 1, 1, L + B]
        layer_kv = iter(context_kv)

        def attend(attn, h):
            q, k, v = attn.project(h, block_positions, self.rotary)
            k_ctx, v_ctx = next(layer_kv)
            keys = torch.cat([k_ctx.to(k.dtype), k], dim=1).transpose(1, 2)
            values = torch.cat([v_ctx.to(v.dtype), v], dim=1).transpose(1, 2)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask,
                                                 enable_gqa=attn.num_kv_heads != attn.num_heads)
            return attn.o_proj(out.transpose(1, 2).flatten(-2))

        x = block_embeds
        for layer in self.layers:
            x = layer(x, attend)
        return self.norm(x)


def load_drafter(drafter_dir: str | os.PathLike, target_config: ModelConfig) -> DFlashDraftModel:
    drafter_dir = Path(drafter_dir)
    cfg = DrafterConfig.from_dir(drafter_dir)
    cfg.check_target(target_config, str(drafter_dir / "config.json"))
    with torch.device("cpu"):  # built on the host whatever the default device, then moved
        model = DFlashDraftModel(cfg)
    load_weights(model, read_state_dict(drafter_dir), str(drafter_dir / WEIGHTS_FILE))
    return model.eval()


def mismatch_with_target(drafter_dir: str | os.PathLike | None, target_dir: str | os.PathLike) -> str | None:
    """Why the block drafter in `drafter_dir` was not made for the target in `target_dir`, or None
    when it was: its shapes must fit the target and, when it names one, its training target's
    weights must be these. The engine still runs a drafter trained for another target of the same
    shape (exact output, low acceptance); this tells a caller that needs real acceptance."""
    from engine.config import ModelConfig
    from engine.loader import weights_sha256
    if drafter_dir is None:
        return "no block drafter folder was given"
    try:
        cfg = DrafterConfig.from_dir(Path(drafter_dir))
        cfg.check_target(ModelConfig.from_dir(target_dir), str(Path(drafter_dir) / "config.json"))
        target_sha = weights_sha256(target_dir) if cfg.target_sha256 else None
    except (SpecgateError, OSError) as e:
        return f"the block drafter {drafter_dir} does not fit the target {target_dir}: {e}"
    if cfg.target_sha256 and target_sha != cfg.target_sha256:
        return (f"the block drafter {drafter_dir} was trained for another target (target_sha256 "
                f"{cfg.target_sha256[:12]}..., this target's weights {target_sha[:12]}...)")
    return None


class BlockProposer(Proposer):
    """Drafts k tokens per request from one drafter forward; see the module docstring."""

    has_q = True  # drafts are sampled from q, so verify needs q itself, not a one-hot

    def __init__(self, drafter: DFlashDraftModel, target: LlamaForCausalLM, cfg: EngineConfig):
        dc = drafter.config
        if cfg.k > dc.block_size:
            raise SpecgateError(f"num_spec_tokens ({cfg.k}) exceeds the block drafter's block_size "
                                f"({dc.block_size}), the most drafts it was trained to propose")
        self.drafter = drafter.to(device=cfg.device, dtype=cfg.torch_dtype)
        self.target = target
        self.k = cfg.k
        self.block_size = cfg.block_size
        self.aux_layers = tuple(dc.aux_layers)
        self.kv_caches = [torch.zeros(2, cfg.num_kv_slots, dc.num_key_value_heads, dc.head_dim,
                                      dtype=cfg.torch_dtype, device=cfg.device)
                          for _ in range(dc.num_hidden_layers)]
        # The block always holds k_max masks, exactly as trained; only the first k rows are used.
        self.offsets = torch.arange(dc.block_size + 1, device=cfg.device)
        self.block_ids = torch.full((dc.block_size + 1,), dc.mask_token_id, dtype=torch.long,
                                    device=cfg.device)

    @classmethod
    def from_dir(cls, drafter_dir: str | os.PathLike | None, target_model: LlamaForCausalLM,
                 cfg: EngineConfig) -> "BlockProposer":
        if drafter_dir is None:
            raise ModelLoadError("spec='block' needs drafter=<a block drafter folder> (the fixture drafter is "
                                 "fixtures.DRAFTER_DIR; the specgate command and the test fixtures pass it)")
        drafter = load_drafter(drafter_dir, target_model.config)
        target_weights = Path(cfg.model) / WEIGHTS_FILE
        expected = drafter.config.target_sha256
        if expected and target_weights.is_file() and file_sha256(target_weights) != expected:
            warnings.warn(f"block drafter {drafter_dir} was trained against a different target "
                          f"(target_sha256 {expected[:12]}...); output stays exact, acceptance will be low",
                          stacklevel=2)
        return cls(drafter, target_model, cfg)

    @torch.inference_mode()
    def observe(self, aux: list[torch.Tensor], meta: AttentionMetadata, positions: torch.Tensor,
                token_slot: torch.Tensor) -> None:
        """Write the context K/V of every token the target just ran at its KV slot."""
        ctx = self.drafter.context(aux)
        for cache, (k, v) in zip(self.kv_caches, self.drafter.context_kv(ctx, positions)):
            cache[0].index_copy_(0, meta.slot_mapping, k.to(cache.dtype))
            cache[1].index_copy_(0, meta.slot_mapping, v.to(cache.dtype))

    @torch.inference_mode()
    def propose(self, inp: ProposeInput) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        num_reqs = inp.token_ids.shape[0]
        rows = torch.arange(num_reqs, device=inp.token_ids.device)
        p = (inp.num_committed - 1).clamp_min(0)  # position of x_p, the last committed token
        block_ids = self.block_ids.expand(num_reqs, -1).clone()
        block_ids[:, 0] = inp.token_ids[rows, p]
        block_positions = p[:, None] + self.offsets

        key_pos = torch.arange(inp.block_tables.shape[1] * self.block_size, device=p.device)
        slots = context_slots(inp.block_tables, key_pos, self.block_size)
        context_kv = [(cache[0][slots], cache[1][slots]) for cache in self.kv_caches]
        context_mask = key_pos < p[:, None]

        embeds = self.target.model.embed_tokens(block_ids)
        hidden = self.drafter(embeds, block_positions, context_kv, context_mask)
        logits = self.target.compute_logits(hidden[:, 1:self.k + 1])  # [R, k, V]

        # q is processed exactly as verify processes p; greedy rows get one-hot q on the argmax.
        q = inp.sampling.probs(logits)
        sampled = sample_from_probs(q, inp.sampling.keys[:, None], block_positions[:, 1:self.k + 1], STREAM_DRAFT)
        drafts = torch.where((inp.sampling.temperature == 0)[:, None], logits.argmax(-1), sampled)
        num_draft = torch.full((num_reqs,), self.k, dtype=torch.long, device=p.device)
        return drafts, num_draft, q
