"""Load and save Hugging Face-format checkpoint folders: config.json and model.safetensors, or
shards listed by model.safetensors.index.json."""
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from engine.config import DTYPES, ModelConfig
from engine.errors import ModelLoadError
from engine.model import LlamaForCausalLM

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_state_dict(model_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(model_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise ModelLoadError(f"model folder {model_dir} has no {WEIGHTS_FILE}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path} is not a readable safetensors file: {e}") from None


def check_names(expected, stored, optional: tuple[str, ...], source: str) -> None:
    """Refuse a checkpoint whose tensor names are not the model's, naming the first five of each."""
    missing = [n for n in expected if n not in stored and n not in optional]
    unexpected = [n for n in stored if n not in expected]
    if missing or unexpected:
        raise ModelLoadError(f"{source}: tensors do not match the config: missing {missing[:5]}"
                             f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}")


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
                 optional: tuple[str, ...] = ()) -> None:
    """Copy `state` into `module`, refusing missing, unexpected or mis-shaped tensors by name."""
    expected = {name: p for name, p in module.state_dict().items()}
    check_names(expected, state, optional, source)
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the config "
                                 f"implies {tuple(expected[name].shape)}")
    with torch.no_grad():
        for name, tensor in state.items():
            expected[name].copy_(tensor)


def weight_files(model_dir: str | os.PathLike) -> dict[Path, list[str]]:
    """Each safetensors file of the folder with the tensor names it holds: model.safetensors alone,
    or the shards model.safetensors.index.json maps names to."""
    folder = Path(model_dir)
    single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
    if single.is_file():
        return {single: _names(single)}
    if not index.is_file():
        raise ModelLoadError(f"model folder {model_dir} has no {WEIGHTS_FILE} (nor a sharded {INDEX_FILE})")
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        assert isinstance(weight_map, dict)
    except (json.JSONDecodeError, KeyError, TypeError, AssertionError):
        raise ModelLoadError(f"{index} must be JSON with a 'weight_map' object (tensor name -> file)") from None
    shards: dict[Path, list[str]] = {}
    for name, file in weight_map.items():
        shards.setdefault(folder / file, []).append(name)
    for shard, names in shards.items():
        if not shard.is_file():
            raise ModelLoadError(f"{index} names {shard.name}, which the folder does not have")
        stored = set(_names(shard))
        absent = [n for n in names if n not in stored]
        if absent:
            raise ModelLoadError(f"{index} maps {absent[:5]} to {shard.name}, which does not hold them")
    return shards


def _names(path: Path) -> list[str]:
    try:
        with safe_open(str(path), "pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path} is not a readable safetensors file: {e}") from None


def load_model(model_dir: str | os.PathLike, device: str = "cpu",
               dtype: torch.dtype | None = None) -> LlamaForCausalLM:
    """Build the model on the meta device (no weights allocated), then read the checkpoint one
    tensor at a time, shard by shard, straight into `dtype` on `device`: host memory holds one
    tensor beyond what it reads. dtype None: the checkpoint's own (config.json's dtype), else float32."""
    cfg = ModelConfig.from_dir(model_dir)
    dtype = dtype or DTYPES[cfg.default_engine_dtype]
    shards = weight_files(model_dir)
    source = str(next(iter(shards))) if len(shards) == 1 else str(Path(model_dir) / INDEX_FILE)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    expected = model.state_dict()
    stored = [n for names in shards.values() for n in names]
    check_names(expected, stored, ("lm_head.weight",) if cfg.tie_word_embeddings else (), source)
    stored_head = None
    for shard, names in shards.items():
        with safe_open(str(shard), "pt", device="cpu") as f:
            for name in names:
                shape = tuple(f.get_slice(name).get_shape())
                if shape != tuple(expected[name].shape):
                    raise ModelLoadError(f"{source}: tensor {name} has shape {shape}, the config "
                                         f"implies {tuple(expected[name].shape)}")
                tensor = f.get_tensor(name).to(device=device, dtype=dtype)
                if name == "lm_head.weight" and cfg.tie_word_embeddings:
                    stored_head = tensor  # checked against the embedding below
                    continue
                module_name, _, attr = name.rpartition(".")
                setattr(model.get_submodule(module_name), attr, torch.nn.Parameter(tensor, requires_grad=False))
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        if stored_head is not None and not torch.equal(stored_head, model.lm_head.weight):
            raise ModelLoadError(
                f"{source}: tie_word_embeddings is true but the file stores an lm_head.weight that differs "
                f"from model.embed_tokens.weight; specgate refuses to guess which head is meant (transformers "
                f"would use the stored one): set tie_word_embeddings to false to use it")
    model.rotary.to(device=device)  # inv_freq stays float32 (RotaryEmbedding._apply)
    return model.eval()


def save_model(model: torch.nn.Module, config: dict, model_dir: str | os.PathLike) -> None:
    """Write config.json and model.safetensors; tied weights are stored once."""
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# ---- identity: checksums of what a folder holds, for reports and the drafter's target check ----
def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()


def weights_sha256(model_dir: Path) -> str:
    """sha256 of model.safetensors; for a sharded folder, of the index and every shard's sha256."""
    model_dir = Path(model_dir)
    if (model_dir / WEIGHTS_FILE).is_file() or not (model_dir / INDEX_FILE).is_file():
        return file_sha256(model_dir / WEIGHTS_FILE)
    h = hashlib.sha256((model_dir / INDEX_FILE).read_bytes())
    for shard in sorted(model_dir.glob("model-*-of-*.safetensors")):
        h.update(f"{shard.name}:{file_sha256(shard)}".encode())
    return h.hexdigest()


def model_checksums(target_dir, drafter_dir=None) -> dict:
    out = {"target": weights_sha256(target_dir)}
    if drafter_dir:
        out["drafter"] = file_sha256(Path(drafter_dir) / WEIGHTS_FILE)
    return out
