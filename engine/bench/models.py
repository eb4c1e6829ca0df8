"""Benchmark models that need no download: seeded random-weight Hugging Face Llama folders.

`write_bench_model("llama-1b")` writes the 1B benchmark shape of issue 18 (hidden 2048, 16
layers, 32 query and 8 KV heads, the byte vocabulary, bf16): config.json and sharded safetensors
with model.safetensors.index.json, as published checkpoints are laid out, so the benchmark also
exercises the sharded loader. Each tensor is drawn from its own generator, seeded by (seed,
tensor name), and written shard by shard: host memory holds one shard, never the model, and the
same seed gives the same bytes. Random weights make drafters meaningless; they are for speed.

The 1B shape is *decisive*: its blocks' output projections (o_proj, down_proj) are drawn a
thousand times smaller, so the current token's embedding dominates the residual stream, and the
head maps each byte to a seeded successor (one cycle through the 256 bytes). Greedy decoding then
picks the successor by most of the top logit (94% on the 1B folder), far above bf16 rounding (0.4%), so a
verify step (k+1 rows) and a plain step (1 row) pick the same token, which the oracle drafter
needs (`specgate bench --spec oracle`). On undamped random weights the logit margins lie within
bf16 rounding and the target's greedy stream under speculation drifts from the plain run's. The
shapes, bytes and kernels are those of any random folder: the speed figures do not depend on it.

Folders are cached under $SPECGATE_CACHE/bench-models (default ~/.cache/specgate/bench-models),
one per shape and seed. A marker file written last says the folder is complete; a folder without
it (an interrupted write) is written again.
"""
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.compile_cache import specgate_cache
from engine.errors import SpecgateError
from engine.loader import INDEX_FILE
from engine.tokenizer import BOS_ID, BYTE_TOKENIZER_CLASS, EOS_ID, TOKENIZER_CONFIG_FILE, VOCAB_SIZE

MARKER_FILE = ".specgate-bench-model.json"


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    layers_per_shard: int
    initializer_range: float = 0.02
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    vocab_size: int = VOCAB_SIZE
    decisive: bool = False  # see the module docstring

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def num_shards(self) -> int:
        return -(-self.num_hidden_layers // self.layers_per_shard)


SHAPES: dict[str, Shape] = {
    # Issue 18's 1B shape: 0.97B parameters, 1.95 GB of bf16 weights read per decode step.
    "llama-1b": Shape(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, layers_per_shard=4, decisive=True),
    # The same weights' shape with 40,960 positions: the depth gate's CUDA folder, past 32,768 (gates/depth.py).
    "llama-1b-deep": Shape(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                           num_key_value_heads=8, layers_per_shard=4, max_position_embeddings=40960, decisive=True),
    # For CPU tests: the same layout in miniature. A wider initialiser than 0.02 makes greedy
    # choices decisive, so two implementations agree on them in float32.
    "tiny": Shape(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, layers_per_shard=1, initializer_range=0.2, max_position_embeddings=512),
    # The 1B shape's decisive weights in miniature (bf16), for CPU tests of what the oracle needs.
    "tiny-decisive": Shape(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, layers_per_shard=1, max_position_embeddings=512, decisive=True),
    # The same, in float32 and with 16,384 positions: the depth gate's CPU folder (gates/depth.py).
    "tiny-deep": Shape(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, layers_per_shard=1, max_position_embeddings=16384, dtype="float32",
                       decisive=True),
}
# How much smaller a decisive model's block output projections are drawn than its other matrices.
DECISIVE_BLOCK_SCALE = 1e-3


def shape_named(name: str) -> Shape:
    if name not in SHAPES:
        raise SpecgateError(f"unknown benchmark shape {name!r} (known: {', '.join(SHAPES)})")
    return SHAPES[name]


def config_dict(shape: Shape) -> dict:
    """config.json: accepted by engine/hf_config.py and by transformers' LlamaConfig."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": shape.vocab_size,
            "hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
            "num_hidden_layers": shape.num_hidden_layers, "num_attention_heads": shape.num_attention_heads,
            "num_key_value_heads": shape.num_key_value_heads, "head_dim": shape.head_dim,
            "max_position_embeddings": shape.max_position_embeddings, "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "initializer_range": shape.initializer_range,
            "bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "dtype": shape.dtype}


def tensor_shapes(shape: Shape) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Per shard, (name, shape) of each tensor in Hugging Face Llama names: the embedding in the
    first shard, `layers_per_shard` decoder layers per shard, the final norm and head in the last."""
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[] for _ in range(shape.num_shards)]
    shards[0].append(("model.embed_tokens.weight", (shape.vocab_size, h)))
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}."
        shards[layer // shape.layers_per_shard] += [
            (p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)), (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
            (p + "mlp.down_proj.weight", (h, i))]
    shards[-1] += [("model.norm.weight", (h,)), ("lm_head.weight", (shape.vocab_size, h))]
    return shards


def random_tensor(name: str, size: tuple[int, ...], shape: Shape, seed: int) -> torch.Tensor:
    """As transformers initialises a Llama: norms 1, every matrix normal(0, initializer_range),
    from a generator seeded by (seed, name) so that no tensor depends on another's draw. A
    decisive shape damps the blocks' output projections and gives the head its successor rows."""
    dtype = getattr(torch, shape.dtype)
    if name.endswith("norm.weight"):
        return torch.ones(size, dtype=dtype)
    std = shape.initializer_range
    if shape.decisive and name.endswith(("o_proj.weight", "down_proj.weight")):
        std *= DECISIVE_BLOCK_SCALE
    weight = torch.empty(size, dtype=dtype).normal_(0.0, std, generator=_generator(seed, name))
    if shape.decisive and name == "lm_head.weight":
        embed = random_tensor("model.embed_tokens.weight", (shape.vocab_size, shape.hidden_size), shape, seed)
        weight[successors(seed)] = embed[:256]  # byte t's embedding scores its successor's logit
    return weight


def successors(seed: int) -> torch.Tensor:
    """A decisive model's greedy successor of each byte: [256] ids, one seeded cycle through all
    256 bytes, so a greedy stream repeats no byte for 256 tokens (an n-gram drafter finds no
    pattern in it that random weights would not give)."""
    order = torch.randperm(256, generator=_generator(seed, "successors"))
    after = torch.empty(256, dtype=torch.long)
    after[order] = order.roll(-1)
    return after


def _generator(seed: int, name: str) -> torch.Generator:
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
    return torch.Generator().manual_seed(key)


def shard_name(index: int, total: int) -> str:
    return f"model-{index + 1:05d}-of-{total:05d}.safetensors"


def cache_root() -> Path:
    return specgate_cache() / "bench-models"


def default_dir(shape_name: str, seed: int) -> Path:
    return cache_root() / f"{shape_name}-seed{seed}"


def _marker(shape_name: str, seed: int) -> dict:
    return {"shape": shape_name, "seed": seed, **asdict(shape_named(shape_name))}


def is_complete(folder: Path, shape_name: str, seed: int) -> bool:
    try:
        return json.loads((folder / MARKER_FILE).read_text()) == _marker(shape_name, seed)
    except (OSError, json.JSONDecodeError):
        return False


def write_bench_model(shape_name: str, seed: int = 0, folder: str | os.PathLike | None = None,
                      progress=None) -> Path:
    """The folder of `shape_name` at `seed`, written unless complete already (see the module
    docstring). `progress(message)` is told each shard as it is written."""
    shape = shape_named(shape_name)
    folder = Path(folder) if folder is not None else default_dir(shape_name, seed)
    if is_complete(folder, shape_name, seed):
        _name_byte_tokenizer(folder)  # a folder written before the tokenizer had to be named
        return folder
    _clear(folder)
    folder.mkdir(parents=True)  # _clear left no folder behind
    (folder / "config.json").write_text(json.dumps(config_dict(shape), indent=2) + "\n")
    plan = tensor_shapes(shape)
    weight_map, total_size = {}, 0
    for index, tensors in enumerate(plan):
        name = shard_name(index, len(plan))
        state = {t: random_tensor(t, size, shape, seed) for t, size in tensors}
        save_file(state, str(folder / name), metadata={"format": "pt"})
        total_size += sum(t.numel() * t.element_size() for t in state.values())
        weight_map.update({t: name for t in state})
        del state
        if progress is not None:
            progress(f"wrote {name} ({index + 1} of {len(plan)})")
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total_size},
                                                 "weight_map": weight_map}, indent=2) + "\n")
    _name_byte_tokenizer(folder)
    (folder / MARKER_FILE).write_text(json.dumps(_marker(shape_name, seed)))  # last: the folder is whole
    return folder


def _name_byte_tokenizer(folder: Path) -> None:
    """The byte vocabulary's tokenizer, by name: a folder without one is refused (engine/tokenizer.py)."""
    path = folder / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        path.write_text(json.dumps({"tokenizer_class": BYTE_TOKENIZER_CLASS}) + "\n")


def _clear(folder: Path) -> None:
    """Remove what an earlier, unfinished write left; refuse a folder holding anything else."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise SpecgateError(f"{folder} exists and is not a folder")
    ours = {"config.json", INDEX_FILE, MARKER_FILE, TOKENIZER_CONFIG_FILE}
    foreign = [p.name for p in folder.iterdir()
               if p.name not in ours and not (p.name.startswith("model-") and p.name.endswith(".safetensors"))]
    if foreign:
        raise SpecgateError(f"{folder} holds files that are not a benchmark model's "
                            f"({', '.join(sorted(foreign)[:5])}); "
                            f"choose an empty or new folder")
    for p in folder.iterdir():
        p.unlink()
    shutil.rmtree(folder)


def bench_prompts(num_prompts: int, prompt_len: int, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of one length (BOS, then seeded random byte ids): every peer gets the
    same ids, and equal lengths let a batch run without padding."""
    g = torch.Generator().manual_seed(seed)
    return [[BOS_ID, *torch.randint(0, 256, (prompt_len - 1,), generator=g).tolist()] for _ in range(num_prompts)]
