"""config.json's rope settings and refused keys, read as transformers reads them: the two spellings
of a rope must agree, its parameters are positive numbers, and a refused feature passes only at its
neutral value; the inverse frequencies they give."""
import math

import pytest
import torch

from engine.rope import DEFAULT_THETA


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
    from engine.rope import parse_rope
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
    from engine.hf_config import LLAMA_CONFIG_KEYS, check_keys
    raw = {"partial_rotary_factor": value}
    if accepted:
        check_keys(raw, LLAMA_CONFIG_KEYS, "config.json")
    else:
        with pytest.raises(ValueError, match=rf"config\.json: partial_rotary_factor={value!r} is not supported "
                                             r"\(only a full rotary head is implemented\)"):
            check_keys(raw, LLAMA_CONFIG_KEYS, "config.json")


@pytest.mark.parametrize("factor, message", [
    (None, "rope_type='linear' needs factor"),
    (True, "rope factor must be a positive number, got True"),
    ("2", "rope factor must be a positive number, got '2'"),
    (float("inf"), "rope factor must be a positive number, got inf"),
    (0, "rope factor must be a positive number, got 0"),
    (-2.0, "rope factor must be a positive number, got -2.0"),
])
def test_a_rope_parameter_must_be_given_as_a_positive_number(factor, message):
    from engine.rope import parse_rope
    rope = {"rope_type": "linear", **({} if factor is None else {"factor": factor})}
    with pytest.raises(ValueError) as refused:
        parse_rope({"rope_parameters": rope}, "config.json")
    assert str(refused.value) == f"config.json: {message}"
    assert parse_rope({"rope_parameters": {"rope_type": "linear", "factor": 1e-3}}, "config.json")[1] is not None


L31 = 8192  # Llama 3.1's original_max_position_embeddings


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": L31},
    {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
     "original_max_position_embeddings": 4096},
    # the first frequency (1.0, wavelength 2 pi) lies exactly on the long-wavelength bound
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": L31 / (2 * math.pi), "high_freq_factor": 2000.0,
     "original_max_position_embeddings": L31},
], ids=["linear", "llama3.1", "llama3-low-2", "llama3-on-the-bound"])
def test_scaled_inverse_frequencies_are_transformers_own(rope):
    """inv_freq against transformers' rope initialisation, bit for bit, wavelengths on the
    bounds of the smooth band included."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from engine.rope import inv_freq, parse_rope
    head_dim, theta = 16, 500000.0
    rope = {**rope, "rope_theta": theta}
    parsed_theta, scaling = parse_rope({"rope_parameters": rope}, "config.json")
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=head_dim, rope_parameters=rope,
                         max_position_embeddings=4 * L31)
    expected, _ = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu")
    assert parsed_theta == theta and torch.equal(inv_freq(head_dim, theta, scaling), expected)
    if "low_freq_factor" in rope and rope["low_freq_factor"] > 2:
        assert torch.tensor(2 * math.pi).item() == torch.tensor(L31 / rope["low_freq_factor"]).item()  # float32


@pytest.mark.parametrize("raw, message", [
    ({"rope_parameters": [10000.0]}, "rope settings must be a JSON object, got [10000.0]"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5 is not supported (only a full rotary head, 1.0)"),
    ({"rope_parameters": {"rope_type": "default"}, "partial_rotary_factor": 0.5},
     "partial_rotary_factor=0.5 is not supported (only a full rotary head, 1.0)"),
], ids=["not-an-object", "partial-inside", "partial-beside"])
def test_rope_settings_it_cannot_run_are_refused_by_name(raw, message):
    """transformers 5 keeps partial_rotary_factor inside rope_parameters, 4 beside it: either is read."""
    from engine.rope import parse_rope
    with pytest.raises(ValueError) as refused:
        parse_rope(raw, "config.json")
    assert str(refused.value) == f"config.json: {message}"
    for where in ("inside", "beside"):
        rope = {"rope_type": "default", **({"partial_rotary_factor": 1.0} if where == "inside" else {})}
        full = {"rope_parameters": rope, **({"partial_rotary_factor": 1.0} if where == "beside" else {})}
        assert parse_rope(full, "config.json") == (DEFAULT_THETA, None)


@pytest.mark.parametrize("setting, message", [
    (True, "rope_theta must be a positive number, got True"),
    ("1e4", "rope_theta must be a positive number, got '1e4'"),
    (0, "rope_theta must be a positive number, got 0"),
    (-1.0, "rope_theta must be a positive number, got -1.0"),
    ({"rope_type": "linear", "factor": 2.0, "beta_fast": 1, "attention_factor": 1},
     "rope key(s) attention_factor, beta_fast are not supported for rope_type='linear'"),
    ({"rope_type": "dynamic"}, "rope_type='dynamic' needs factor"),
], ids=["bool", "string", "zero", "negative", "unknown-keys", "dynamic-without-factor"])
def test_a_rope_theta_or_rope_key_it_cannot_read_is_refused_by_name(setting, message):
    from engine.rope import parse_rope
    rope = setting if isinstance(setting, dict) else {"rope_type": "default", "rope_theta": setting}
    with pytest.raises(ValueError) as refused:
        parse_rope({"rope_parameters": rope}, "config.json")
    assert str(refused.value) == f"config.json: {message}"


def test_any_positive_theta_is_read_and_dynamic_ntk_is_the_default_rope_within_the_context():
    from engine.rope import parse_rope
    assert parse_rope({"rope_parameters": {"rope_type": "default", "rope_theta": 0.5}}, "c") == (0.5, None)
    assert parse_rope({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "c") == (1e4, None)


def test_llama3_s_original_context_is_read_where_transformers_reads_it():
    """A top-level original_max_position_embeddings wins, then the rope dict's, then
    max_position_embeddings."""
    from engine.rope import parse_rope
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}

    def original(raw):
        return parse_rope(raw, "config.json")[1].original_max_position_embeddings

    inside = {**rope, "original_max_position_embeddings": 4096}
    assert original({"rope_parameters": inside, "original_max_position_embeddings": 2048,
                     "max_position_embeddings": 1024}) == 2048
    assert original({"rope_parameters": inside, "max_position_embeddings": 1024}) == 4096
    assert original({"rope_parameters": rope, "max_position_embeddings": 1024}) == 1024
    assert original({"rope_parameters": rope, "original_max_position_embeddings": 2048}) == 2048


@pytest.mark.parametrize("change, message", [
    (dict(original_max_position_embeddings=True), "original_max_position_embeddings must be a positive integer, got True"),
    (dict(original_max_position_embeddings=8192.0),
     "original_max_position_embeddings must be a positive integer, got 8192.0"),
    (dict(original_max_position_embeddings=0), "original_max_position_embeddings must be a positive integer, got 0"),
    (dict(high_freq_factor=1.0), "llama3 rope needs high_freq_factor != low_freq_factor"),
], ids=["bool", "float", "zero", "equal-factors"])
def test_a_llama3_rope_it_cannot_compute_is_refused_by_name(change, message):
    """The smooth band divides by high_freq_factor - low_freq_factor."""
    from engine.rope import parse_rope
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": L31}
    assert parse_rope({"rope_parameters": {**rope, "original_max_position_embeddings": 1}}, "config.json")[1]
    with pytest.raises(ValueError) as refused:
        parse_rope({"rope_parameters": {**rope, **change}}, "config.json")
    assert str(refused.value) == f"config.json: {message}"


@pytest.mark.parametrize("name", ["decoder_start_token_id", "cross_attention_hidden_size"])
def test_an_encoder_decoder_key_passes_only_when_unset(name):
    """An inert key with a neutral value (not every value harmless) is refused at any other value."""
    from engine.hf_config import LLAMA_CONFIG_KEYS, check_keys
    check_keys({name: None}, LLAMA_CONFIG_KEYS, "config.json")
    with pytest.raises(ValueError) as refused:
        check_keys({name: 0}, LLAMA_CONFIG_KEYS, "config.json")
    assert str(refused.value) == f"config.json: {name}=0 is not supported (encoder-decoder only)"
