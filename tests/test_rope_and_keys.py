"""config.json's rope settings and refused keys, read as transformers reads them: the two spellings
of a rope must agree, its parameters are positive numbers, and a refused feature passes only at its
neutral value."""
import pytest


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
