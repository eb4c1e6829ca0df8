"""config.json's rope settings and refused keys, read as transformers reads them: the two spellings
of a rope must agree, its parameters are positive numbers, and a refused feature passes only at its
neutral value; the inverse frequencies they give."""
import math

import pytest
import torch

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.hf_config import LLAMA_CONFIG_KEYS, check_keys
from engine.rope import DEFAULT_THETA, inv_freq, parse_rope


@pytest.mark.parametrize("scaling, parameters, agree", [
    ({"type": "linear", "factor": 2.0}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, False),
    ({"type": "linear", "factor": 2.0, "rope_theta": 1e4}, {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
     True),
    ({"rope_theta": 1e4}, {"rope_type": "default", "rope_theta": 1e4}, True),
    ({"type": "default", "rope_theta": 1e4}, {"rope_theta": 1e4}, True),
    ({"type": "linear", "factor": 2.0, "rope_theta": 1e4}, {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
     False),
])
def test_rope_scaling_and_rope_parameters_must_describe_the_same_rope(scaling, parameters, agree):
    """transformers 4 spells the rope type `type` and leaves it out for the default rope; a config
    holding both spellings is read only when they agree, whatever the spelling."""
    raw = {"rope_scaling": scaling, "rope_parameters": parameters}
    if agree:
        theta, _ = parse_rope(raw, "config.json")
        assert theta == 1e4
    else:
        with pytest.raises(ValueError, match=r"config\.json: rope_scaling=.* and rope_parameters=.* disagree"):
            parse_rope(raw, "config.json")


@pytest.mark.parametrize("value, accepted", [(None, True), (1, True), (1.0, True), (True, False), (0.5, False)])
def test_a_refused_feature_is_accepted_only_at_its_neutral_value(value, accepted):
    """partial_rotary_factor 1 (or 1.0, or null) is a full rotary head; a bool is not a number
    here, although True == 1 in Python."""
    raw = {"partial_rotary_factor": value}
    if accepted:
        check_keys(raw, LLAMA_CONFIG_KEYS, "config.json")
    else:
        with pytest.raises(ValueError, match=rf"config\.json: partial_rotary_factor={value!r} is not supported "
                                             r"\(only a full rotary head is implemented\)"):
            check_keys(raw, LLAMA_CONFIG_KEYS, "config.json")


L31 = 8192  # Llama 3.1's original_max_position_embeddings
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": L31}
PARTIAL = "partial_rotary_factor=0.5 is not supported (only a full rotary head, 1.0)"
THETA = "rope_theta must be a positive number, got "
ORIGINAL = "original_max_position_embeddings must be a positive integer, got "


def rope(**settings) -> dict:
    return {"rope_parameters": settings}


@pytest.mark.parametrize("raw, message", [
    (rope(rope_type="linear"), "rope_type='linear' needs factor"),
    (rope(rope_type="linear", factor=True), "rope factor must be a positive number, got True"),
    (rope(rope_type="linear", factor="2"), "rope factor must be a positive number, got '2'"),
    (rope(rope_type="linear", factor=float("inf")), "rope factor must be a positive number, got inf"),
    (rope(rope_type="linear", factor=0), "rope factor must be a positive number, got 0"),
    (rope(rope_type="linear", factor=-2.0), "rope factor must be a positive number, got -2.0"),
    (rope(rope_type="dynamic"), "rope_type='dynamic' needs factor"),
    ({"rope_parameters": [10000.0]}, "rope settings must be a JSON object, got [10000.0]"),
    # transformers 5 keeps partial_rotary_factor inside rope_parameters, 4 beside it: either is read
    (rope(rope_type="default", partial_rotary_factor=0.5), PARTIAL),
    ({**rope(rope_type="default"), "partial_rotary_factor": 0.5}, PARTIAL),
    (rope(rope_type="default", rope_theta=True), THETA + "True"),
    (rope(rope_type="default", rope_theta="1e4"), THETA + "'1e4'"),
    (rope(rope_type="default", rope_theta=0), THETA + "0"),
    (rope(rope_type="default", rope_theta=-1.0), THETA + "-1.0"),
    (rope(rope_type="linear", factor=2.0, beta_fast=1, attention_factor=1),
     "rope key(s) attention_factor, beta_fast are not supported for rope_type='linear'"),
    (rope(**{**LLAMA31, "original_max_position_embeddings": True}), ORIGINAL + "True"),
    (rope(**{**LLAMA31, "original_max_position_embeddings": 8192.0}), ORIGINAL + "8192.0"),
    (rope(**{**LLAMA31, "original_max_position_embeddings": 0}), ORIGINAL + "0"),
    # the smooth band divides by high_freq_factor - low_freq_factor
    (rope(**{**LLAMA31, "high_freq_factor": 1.0}), "llama3 rope needs high_freq_factor != low_freq_factor"),
], ids=["no-factor", "factor-bool", "factor-string", "factor-inf", "factor-zero", "factor-negative",
        "dynamic-without-factor", "not-an-object", "partial-inside", "partial-beside", "theta-bool",
        "theta-string", "theta-zero", "theta-negative", "unknown-keys", "original-bool", "original-float",
        "original-zero", "equal-band-factors"])
def test_a_rope_it_cannot_compute_is_refused_by_name(raw, message):
    with pytest.raises(ValueError) as refused:
        parse_rope(raw, "config.json")
    assert str(refused.value) == f"config.json: {message}"


def test_the_edges_of_what_a_rope_accepts_are_read():
    """Any positive number is a factor and a theta, a full rotary head may be said inside or
    beside the rope, and dynamic NTK is the default rope inside the context the engine serves."""
    assert parse_rope(rope(rope_type="linear", factor=1e-3), "c")[1].factor == 1e-3
    assert parse_rope(rope(rope_type="default", rope_theta=0.5), "c") == (0.5, None)
    assert parse_rope(rope(rope_type="dynamic", factor=2.0, rope_theta=1e4), "c") == (1e4, None)
    assert parse_rope(rope(rope_type="default", partial_rotary_factor=1.0), "c") == (DEFAULT_THETA, None)
    assert parse_rope({**rope(rope_type="default"), "partial_rotary_factor": 1.0}, "c") == (DEFAULT_THETA, None)
    assert parse_rope(rope(**{**LLAMA31, "original_max_position_embeddings": 1}), "c")[1] is not None


def test_llama3_s_original_context_is_read_where_transformers_reads_it():
    """A top-level original_max_position_embeddings wins, then the rope dict's, then
    max_position_embeddings."""
    outside = {k: v for k, v in LLAMA31.items() if k != "original_max_position_embeddings"}

    def original(raw):
        return parse_rope(raw, "config.json")[1].original_max_position_embeddings

    assert original({**rope(**LLAMA31), "original_max_position_embeddings": 2048,
                     "max_position_embeddings": 1024}) == 2048
    assert original({**rope(**LLAMA31), "max_position_embeddings": 1024}) == L31
    assert original({**rope(**outside), "max_position_embeddings": 1024}) == 1024
    assert original({**rope(**outside), "original_max_position_embeddings": 2048}) == 2048


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 2.0},
    LLAMA31,
    {**LLAMA31, "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
     "original_max_position_embeddings": 4096},
    # the first frequency (1.0, wavelength 2 pi) lies exactly on the long-wavelength bound
    {**LLAMA31, "low_freq_factor": L31 / (2 * math.pi), "high_freq_factor": 2000.0},
], ids=["linear", "llama3.1", "llama3-low-2", "llama3-on-the-bound"])
def test_scaled_inverse_frequencies_are_transformers_own(scaling):
    """inv_freq against transformers' rope initialisation, bit for bit, wavelengths on the
    bounds of the smooth band included."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, theta = 16, 500000.0
    settings = {**scaling, "rope_theta": theta}
    parsed_theta, parsed = parse_rope(rope(**settings), "config.json")
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=head_dim, rope_parameters=settings,
                         max_position_embeddings=4 * L31)
    expected, _ = ROPE_INIT_FUNCTIONS[settings["rope_type"]](config, "cpu")
    assert parsed_theta == theta and torch.equal(inv_freq(head_dim, theta, parsed), expected)
    if settings.get("low_freq_factor", 0) > 2:  # the bound is really hit, in float32
        assert torch.tensor(2 * math.pi).item() == torch.tensor(L31 / settings["low_freq_factor"]).item()


@pytest.mark.parametrize("name", ["decoder_start_token_id", "cross_attention_hidden_size"])
def test_an_encoder_decoder_key_passes_only_when_unset(name):
    """An inert key with a neutral value (not every value harmless) is refused at any other value."""
    check_keys({name: None}, LLAMA_CONFIG_KEYS, "config.json")
    with pytest.raises(ValueError) as refused:
        check_keys({name: 0}, LLAMA_CONFIG_KEYS, "config.json")
    assert str(refused.value) == f"config.json: {name}=0 is not supported (encoder-decoder only)"


@pytest.mark.parametrize("sizes", [dict(head_dim=15), dict(hidden_size=30, num_attention_heads=2)],
                         ids=["given", "derived"])
def test_an_odd_head_dim_is_refused_at_load_as_transformers_refuses_it(sizes):
    """Rotary embedding rotates pairs of dimensions; the engine once accepted 15 and died in the
    first generate with a raw RuntimeError."""
    with pytest.raises(ModelLoadError, match=r"^config\.json: head_dim \(15\) must be even: rotary embedding "
                                             r"rotates pairs of dimensions"):
        ModelConfig(**{**dict(vocab_size=260, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, hidden_size=30), **sizes})
