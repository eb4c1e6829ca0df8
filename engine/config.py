"""Configuration: the model's (read from a Hugging Face config.json) and the engine's."""
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.activations import ACTIVATIONS, TRANSFORMERS_ACTIVATIONS
from engine.defaults import resolve_attention_backend, resolve_compile, resolve_graph
from engine.errors import ModelLoadError, SpecgateError
from engine.hf_config import LLAMA_CONFIG_KEYS, check_keys
from engine.policy import MAX_INFLIGHT_STEPS, kv_lookahead
from engine.rope import RopeScaling, parse_rope

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# A checkpoint may be stored in these; float16 ones run in float32 unless a dtype is asked for
# (float16 values are exact in float32; the engine does not run in float16).
CHECKPOINT_DTYPES = (*DTYPES, "float16")
# transformers' LlamaConfig default; a config.json without rms_norm_eps means this.
LLAMA_RMS_NORM_EPS = 1e-6
# transformers' LlamaConfig default for a config.json without the key (an explicit null: none).
LLAMA_EOS_TOKEN_ID = 2
# The two forwards: the reference modules (engine/model.py), or the same arithmetic fused and
# compiled by inductor (engine/fused.py); indexed by EngineConfig.compile.
FORWARDS = ("reference", "compiled")
# The two arms: each kernel of a step launched from the host, or the step as one CUDA graph
# replay (engine/runner.py); indexed by the resolved EngineConfig.graph.
ARMS = ("eager", "graph")
SPEC_METHODS = (None, "ngram", "block", "oracle")  # oracle: benchmarks only, handed in (engine/bench/oracle.py)


def read_config_json(folder: Path, kind: str) -> tuple[Path, dict]:
    """The JSON object in a model or drafter folder's config.json; `kind` names the folder in errors."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise ModelLoadError(f"{kind} folder {folder} does not exist or is not a folder")
    if not path.is_file():
        raise ModelLoadError(f"{kind} folder {folder} has no config.json")
    return path, read_json_object(path)


def read_json_object(path: Path) -> dict:
    """The JSON object in `path`, or a ModelLoadError naming the file."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{path} must hold a JSON object")
    return raw


def require_fields(path: Path | str, raw: dict, required) -> None:
    missing = [f for f in required if f not in raw]
    if missing:
        raise ModelLoadError(f"{path} is missing required fields: {', '.join(missing)}")


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Hugging Face LlamaConfig this engine implements."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = LLAMA_RMS_NORM_EPS
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    head_dim: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None   # the first end-of-sequence id; eos_token_ids holds them all
    hidden_act: str = "silu"
    rope_scaling: RopeScaling | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str | None = None          # the checkpoint's own dtype: the engine's when none is asked

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ModelLoadError(f"config.json: {name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ModelLoadError(
                f"config.json: hidden_size ({self.hidden_size}) must divide by num_attention_heads "
                f"({self.num_attention_heads}) when head_dim is not given")
        if self.dim_per_head % 2:
            raise ModelLoadError(f"config.json: head_dim ({self.dim_per_head}) must be even: rotary embedding "
                                 f"rotates pairs of dimensions (transformers refuses it too)")
        if self.eos_token_id is not None and not self.eos_token_ids:
            object.__setattr__(self, "eos_token_ids", (self.eos_token_id,))
        if self.eos_token_ids and self.eos_token_id is None:
            object.__setattr__(self, "eos_token_id", self.eos_token_ids[0])
        for name, value in [("bos_token_id", self.bos_token_id), ("eos_token_id", self.eos_token_id),
                            *(("eos_token_id", v) for v in self.eos_token_ids)]:
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value < self.vocab_size):
                raise ModelLoadError(f"config.json: {name} must be a token id in [0, {self.vocab_size}) "
                                     f"(vocab_size), got {value!r}")
        if self.hidden_act not in ACTIVATIONS:
            known = "transformers knows it, specgate does not implement it" \
                if self.hidden_act in TRANSFORMERS_ACTIVATIONS else "transformers does not know it either"
            raise ModelLoadError(f"config.json: hidden_act={self.hidden_act!r} is not supported ({known}); "
                                 f"supported: {', '.join(sorted(ACTIVATIONS))}")
        if isinstance(self.rms_norm_eps, bool) or not isinstance(self.rms_norm_eps, (int, float)) \
                or not 0 < self.rms_norm_eps < 1:
            raise ModelLoadError(f"config.json: rms_norm_eps must be a number in (0, 1), got {self.rms_norm_eps!r}")
        if self.dtype is not None and self.dtype not in CHECKPOINT_DTYPES:
            raise ModelLoadError(f"config.json: dtype {self.dtype!r} is not supported "
                                 f"(supported: {', '.join(CHECKPOINT_DTYPES)})")

    @property
    def default_engine_dtype(self) -> str:
        """The engine's dtype when the user asks for none: the checkpoint's, float32 for float16."""
        return self.dtype if self.dtype in DTYPES else "float32"

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike) -> "ModelConfig":
        path, raw = read_config_json(Path(model_dir), "model")
        return cls.from_dict(raw, str(path))

    @classmethod
    def from_dict(cls, raw: dict, where: str = "config.json") -> "ModelConfig":
        """A Hugging Face Llama config.json's dict; every key is checked against LLAMA_CONFIG_KEYS."""
        arch = raw.get("architectures") or ["LlamaForCausalLM"]
        if raw.get("model_type", "llama") != "llama" or "LlamaForCausalLM" not in arch:
            raise ModelLoadError(
                f"{where}: only the Llama architecture is supported, got model_type="
                f"{raw.get('model_type')!r} architectures={arch!r}")
        try:
            check_keys(raw, LLAMA_CONFIG_KEYS, where)
            rope_theta, rope_scaling = parse_rope(raw, where)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        require_fields(where, raw, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                    "num_attention_heads", "max_position_embeddings"))
        taken = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "head_dim", "bos_token_id", "hidden_act")
        kwargs = {k: raw[k] for k in taken if raw.get(k) is not None}
        kwargs.setdefault("num_key_value_heads", raw["num_attention_heads"])
        eos = raw.get("eos_token_id", LLAMA_EOS_TOKEN_ID)
        if isinstance(eos, list):
            if not eos:
                raise ModelLoadError(f"{where}: eos_token_id is an empty list")
            kwargs["eos_token_ids"] = tuple(eos)
        elif eos is not None:
            kwargs["eos_token_id"] = eos
        dtype = raw.get("dtype", raw.get("torch_dtype"))
        try:
            return cls(**kwargs, rope_theta=rope_theta, rope_scaling=rope_scaling,
                       dtype=str(dtype).removeprefix("torch.") if dtype is not None else None)
        except ModelLoadError as e:  # name the file, not just "config.json"
            raise ModelLoadError(str(e).replace("config.json", where, 1)) from None


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the weights. Validated once, here."""

    model: str
    device: str = "cpu"
    dtype: str = "float32"
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    max_model_len: int = 512
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: enough for max_num_seqs full-length requests
    spec: str | None = None
    num_spec_tokens: int = 4
    drafter: str | None = None
    async_runner: bool | None = None  # None: decided by the veto (engine/veto.py)
    # The graph arm: a decode step replays one captured CUDA graph (engine/runner.py). None: resolved
    # by the device, on for CUDA, where the eager arm is bound by the host launching each kernel (the
    # compiled forward's eager step took 13 to 21 ms on the 1B shape on the H200, its graph replay
    # 1.4 ms), off on the CPU (there graph=True plans the padded buckets and runs them eagerly).
    graph: bool | None = None
    # engine/attention.py: "sdpa" (the reference: gather, mask, SDPA), "flex" or "paged" (a Triton
    # kernel reading the cache in place, for decode and verify steps; a prefill takes sdpa's read).
    # None: resolved by the device, paged on CUDA, sdpa on the CPU.
    attention_backend: str | None = None
    # engine/fused.py: the layers fused and compiled by inductor. None: resolved by the device, the
    # compiled forward on CUDA (where it is the fast path: 1.36 ms a 1B step against the reference's
    # 3.13 ms on the H200) and the reference one on the CPU (where inductor's compile costs 30 to
    # 100 s on two cores and gains nothing on the fixtures).
    compile: bool | None = None
    trace: bool = False
    seed: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise SpecgateError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.spec not in SPEC_METHODS:
            raise SpecgateError(f"spec must be one of {SPEC_METHODS}, got {self.spec!r}")
        checks = {
            "max_num_seqs": (1, 256), "max_model_len": (2, 1 << 16), "block_size": (1, 1024),
            "max_num_batched_tokens": (1, 1 << 20), "num_spec_tokens": (1, 16),
        }
        for name, (lo, hi) in checks.items():
            value = getattr(self, name)
            if not isinstance(value, int) or not lo <= value <= hi:
                raise SpecgateError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        if self.max_num_batched_tokens < self.max_model_len:
            raise SpecgateError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
                f"max_model_len ({self.max_model_len}) so every prompt can be prefilled in one step")
        if self.max_num_batched_tokens < self.k + 1:
            raise SpecgateError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least num_spec_tokens + 1 "
                f"({self.k + 1}) so a verify step fits")
        if self.num_kv_blocks is not None and (isinstance(self.num_kv_blocks, bool)
                                               or not isinstance(self.num_kv_blocks, int)):
            raise SpecgateError(f"num_kv_blocks must be None or an integer, got {self.num_kv_blocks!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < self.blocks_per_seq:
            raise SpecgateError(
                f"num_kv_blocks ({self.num_kv_blocks}) must hold at least one full-length request "
                f"({self.blocks_per_seq} blocks of {self.block_size} tokens)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 1 << 64:
            raise SpecgateError(f"seed must be an integer in [0, 2**64), got {self.seed!r}")
        if not isinstance(self.device, str) or not self.device.startswith(("cpu", "cuda")):
            raise SpecgateError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        # resolved once: the runner, the veto and every report read a bool
        object.__setattr__(self, "compile", resolve_compile(self.compile, self.device))
        object.__setattr__(self, "graph", resolve_graph(self.graph, self.device))
        object.__setattr__(self, "attention_backend", resolve_attention_backend(self.attention_backend, self.device))
        if self.attention_backend == "paged" and not self.device.startswith("cuda") \
                and os.environ.get("TRITON_INTERPRET") != "1":
            raise SpecgateError("attention_backend='paged' runs a Triton kernel: on CUDA, or on the CPU only under "
                                "Triton's interpreter (TRITON_INTERPRET=1, slow: for tests)")
        if self.attention_backend == "flex" and self.device.startswith("cuda") and self.block_size % 16:
            raise SpecgateError(f"attention_backend='flex' on CUDA needs block_size a multiple of 16 (the kernel "
                                f"reads keys in tiles of at least 16 within one cache block), got {self.block_size}")

    @property
    def forward(self) -> str:
        """The forward the engine runs, in the words the veto's evidence and the gates use."""
        return FORWARDS[self.compile]

    @property
    def k(self) -> int:
        """Draft tokens per verify step; 0 for plain decoding."""
        return self.num_spec_tokens if self.spec else 0

    @property
    def max_positions(self) -> int:
        """Positions a request may write: its context, plus the drafts of one verify step and
        the steps in flight, which the async runner launches before it learns the end."""
        return self.max_model_len + kv_lookahead(self.k, MAX_INFLIGHT_STEPS)

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_positions // self.block_size)

    @property
    def total_kv_blocks(self) -> int:
        return self.num_kv_blocks or self.max_num_seqs * self.blocks_per_seq

    @property
    def num_kv_slots(self) -> int:
        """Slots of a paged KV cache: every block, plus the sink block padding rows write into."""
        return (self.total_kv_blocks + 1) * self.block_size

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
