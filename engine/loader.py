"""Load and save Hugging Face-format checkpoint folders (config.json + model.safetensors)."""
import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.model import LlamaForCausalLM

WEIGHTS_FILE = "model.safetensors"


def read_state_dict(model_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    path = Path(model_dir) / WEIGHTS_FILE
    if not path.is_file():
        raise ModelLoadError(f"model folder {model_dir} has no {WEIGHTS_FILE}")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path} is not a readable safetensors file: {e}") from None


def load_weights(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
                 optional: tuple[str, ...] = ()) -> None:
    """Copy `state` into `module`, refusing missing, unexpected or mis-shaped tensors by name."""
    expected = {name: p for name, p in module.state_dict().items()}
    missing = [n for n in expected if n not in state and n not in optional]
    unexpected = [n for n in state if n not in expected]
    if missing or unexpected:
        raise ModelLoadError(f"{source}: tensors do not match the config: missing {missing[:5]}"
                             f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ModelLoadError(f"{source}: tensor {name} has shape {tuple(tensor.shape)}, the config "
                                 f"implies {tuple(expected[name].shape)}")
    with torch.no_grad():
        for name, tensor in state.items():
            expected[name].copy_(tensor)


def load_model(model_dir: str | os.PathLike, device: str = "cpu",
               dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    cfg = ModelConfig.from_dir(model_dir)
    state = read_state_dict(model_dir)
    with torch.device("cpu"):  # built on the host whatever the default device, then moved
        model = LlamaForCausalLM(cfg)
    optional = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    load_weights(model, state, str(Path(model_dir) / WEIGHTS_FILE), optional)
    return model.to(device=device, dtype=dtype).eval()


def save_model(model: torch.nn.Module, config: dict, model_dir: str | os.PathLike) -> None:
    """Write config.json and model.safetensors; tied weights are stored once."""
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {n: t.detach().cpu().contiguous() for n, t in model.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
