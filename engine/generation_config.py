"""A model folder's generation_config.json: its end-of-sequence ids and default sampling.

As in transformers, the file's eos_token_id (an int or a list) replaces config.json's; without
the file, config.json's ids apply. Its sampling keys become the defaults of a request that gives
no SamplingParams. Keys are checked against GENERATION_CONFIG_KEYS (engine/hf_config.py).
"""
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import ModelConfig, read_json_object
from engine.errors import ModelLoadError
from engine.hf_config import GENERATION_CONFIG_KEYS, check_keys
from engine.sampling import SamplingParams

GENERATION_CONFIG_FILE = "generation_config.json"


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    sampling: dict = field(default_factory=dict)  # SamplingParams keyword arguments

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(**self.sampling)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike, model_config: ModelConfig) -> "GenerationDefaults":
        path = Path(model_dir) / GENERATION_CONFIG_FILE
        if not path.is_file():
            return cls(model_config.eos_token_ids)
        raw = read_json_object(path)
        try:
            check_keys(raw, GENERATION_CONFIG_KEYS, str(path))
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        eos = raw.get("eos_token_id")
        eos_ids = model_config.eos_token_ids if eos is None else tuple(eos if isinstance(eos, list) else [eos])
        for token in eos_ids:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < model_config.vocab_size:
                raise ModelLoadError(f"{path}: eos_token_id must be token ids in [0, {model_config.vocab_size}), "
                                     f"got {eos!r}")
        sampling = {"temperature": 0.0}  # transformers: do_sample defaults to false, greedy
        if raw.get("do_sample"):
            sampling = {name: raw[name] for name in ("temperature", "top_k", "top_p") if raw.get(name) is not None}
            sampling.setdefault("temperature", 1.0)
            # transformers' generate fills an unset top_k with 50, clamped to the vocabulary
            sampling.setdefault("top_k", 50 if model_config.vocab_size > 50 else -1)
        if raw.get("max_new_tokens") is not None:
            sampling["max_tokens"] = raw["max_new_tokens"]
        try:
            SamplingParams(**sampling)
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        return cls(eos_ids, sampling)
