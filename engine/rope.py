"""Rotary position settings as a Hugging Face Llama config.json states them, and their frequencies.

Two spellings exist: transformers 4 wrote a top-level `rope_theta` and an optional `rope_scaling`
dict; transformers 5 writes one `rope_parameters` dict holding `rope_theta` and `rope_type`.
`parse_rope` reads either, with transformers' precedence (`rope_scaling` over `rope_parameters`,
a theta inside the dict over the top-level one), and `inv_freq` computes the frequencies exactly
as transformers' modeling_rope_utils does for the types it implements here.
"""
import math
from dataclasses import dataclass

import torch

DEFAULT_THETA = 10000.0
# Keys each rope_type may carry (besides rope_type / its old spelling `type`, and rope_theta).
ROPE_TYPE_KEYS = {
    "default": set(),
    "linear": {"factor"},
    # transformers recomputes dynamic-NTK frequencies only past max_position_embeddings, which the
    # engine never reaches (max_model_len <= max_position_embeddings): there it equals "default".
    "dynamic": {"factor"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
}


@dataclass(frozen=True)
class RopeScaling:
    """A rope_type other than "default", with the parameters it reads."""

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None


def parse_rope(raw: dict, where: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling or None) from a config.json dict; refuses what it does not implement."""
    scaling, params = raw.get("rope_scaling"), raw.get("rope_parameters")
    if scaling and params and _normalised(scaling) != _normalised(params):
        raise ValueError(f"{where}: rope_scaling={scaling!r} and rope_parameters={params!r} disagree; "
                         f"give one of them")
    rope = scaling or params or {}
    if not isinstance(rope, dict):
        raise ValueError(f"{where}: rope settings must be a JSON object, got {rope!r}")
    theta = rope.get("rope_theta", raw.get("rope_theta", DEFAULT_THETA))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPE_KEYS:
        raise ValueError(f"{where}: rope_type={rope_type!r} is not supported (supported: "
                         f"{', '.join(ROPE_TYPE_KEYS)})")
    partial = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0):
        raise ValueError(f"{where}: partial_rotary_factor={partial!r} is not supported (only a full rotary "
                         f"head, 1.0)")
    allowed = ROPE_TYPE_KEYS[rope_type] | {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
    unknown = sorted(set(rope) - allowed)
    if unknown:
        raise ValueError(f"{where}: rope key(s) {', '.join(unknown)} are not supported for "
                         f"rope_type={rope_type!r}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    if rope_type in ("default", "dynamic"):
        if rope_type == "dynamic":
            _number(rope, "factor", where)
        return float(theta), None
    values = {name: _number(rope, name, where) for name in ROPE_TYPE_KEYS[rope_type]
              if name != "original_max_position_embeddings"}
    if rope_type == "llama3":
        # transformers: a top-level original_max_position_embeddings wins, else the dict's, else
        # max_position_embeddings.
        omp = raw.get("original_max_position_embeddings",
                      rope.get("original_max_position_embeddings", raw.get("max_position_embeddings")))
        if isinstance(omp, bool) or not isinstance(omp, int) or omp <= 0:
            raise ValueError(f"{where}: original_max_position_embeddings must be a positive integer, "
                             f"got {omp!r}")
        if values["high_freq_factor"] == values["low_freq_factor"]:
            raise ValueError(f"{where}: llama3 rope needs high_freq_factor != low_freq_factor")
        values["original_max_position_embeddings"] = omp
    return float(theta), RopeScaling(rope_type, **values)


def _normalised(rope: dict) -> dict:
    rope = dict(rope)
    rope.setdefault("rope_type", rope.pop("type", "default"))
    return rope


def _number(rope: dict, name: str, where: str) -> float:
    if name not in rope:
        raise ValueError(f"{where}: rope_type={rope.get('rope_type', rope.get('type'))!r} needs {name}")
    value = rope[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{where}: rope {name} must be a positive number, got {value!r}")
    return value


def inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], float32, on the CPU: the same operations as transformers."""
    arange = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu")  # real even on a meta model
    freq = 1.0 / (theta ** (arange.float() / head_dim))
    if scaling is None:
        return freq
    if scaling.rope_type == "linear":
        return freq / scaling.factor
    # llama3 (Llama 3.1): long wavelengths divided by factor, short ones kept, a smooth ramp between.
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / freq
    scaled = torch.where(wavelen > low_freq_wavelen, freq / factor, freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)
