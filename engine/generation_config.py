"""A model folder's generation_config.json: its end-of-sequence ids and default sampling.

As in transformers' generate: without the file, config.json's eos ids apply; with it, the file's
eos_token_id (an int or a list) alone does, and a file without one (or with null) has none, so a
request runs to its length. A request without SamplingParams decodes greedily unless the file
says do_sample, and produces max_new_tokens tokens, or max_length minus its prompt's length, or
20 (transformers' default) without either. Keys are checked against GENERATION_CONFIG_KEYS
(engine/hf_config.py).
"""
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import ModelConfig, read_json_object
from engine.errors import ModelLoadError, RequestError
from engine.hf_config import GENERATION_CONFIG_KEYS, check_keys
from engine.sampling import SamplingParams

GENERATION_CONFIG_FILE = "generation_config.json"
# transformers' generate, without max_new_tokens or max_length: 20 new tokens
DEFAULT_MAX_NEW_TOKENS = 20


@dataclass(frozen=True)
class GenerationDefaults:
    eos_token_ids: tuple[int, ...] = ()
    sampling: dict = field(default_factory=lambda: {"temperature": 0.0})  # SamplingParams keyword arguments
    max_length: int | None = None  # prompt + new tokens, when sampling has no max_tokens

    def sampling_params(self, num_prompt_tokens: int) -> SamplingParams:
        """A request's SamplingParams when it gives none, for a prompt of that many tokens."""
        kwargs = dict(self.sampling)
        if "max_tokens" not in kwargs and self.max_length is not None:
            if num_prompt_tokens >= self.max_length:
                raise RequestError(f"prompt has {num_prompt_tokens} tokens, generation_config.json's max_length "
                                   f"({self.max_length}) leaves none to generate (transformers refuses it too): "
                                   f"pass SamplingParams(max_tokens=...)")
            kwargs["max_tokens"] = self.max_length - num_prompt_tokens
        kwargs.setdefault("max_tokens", DEFAULT_MAX_NEW_TOKENS)
        return SamplingParams(**kwargs)

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
        eos_ids = () if eos is None else tuple(eos if isinstance(eos, list) else [eos])
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
        max_length = raw.get("max_length")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 2):
            raise ModelLoadError(f"{path}: max_length must be an integer >= 2 (prompt + new tokens), "
                                 f"got {max_length!r}")
        try:
            SamplingParams(**sampling)
        except ValueError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        return cls(eos_ids, sampling, max_length)
