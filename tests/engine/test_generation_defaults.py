"""A folder's generation_config.json read on its own (GenerationDefaults.from_dir): which end ids
and which default sampling a request without SamplingParams gets, as transformers' generate
would, and the ids it refuses. The end-to-end runs are in tests/engine/test_hf_checkpoints.py."""
import dataclasses
import json

import pytest

from engine.config import ModelConfig
from engine.errors import ModelLoadError, RequestError
from engine.generation_config import GenerationDefaults


@pytest.fixture
def model_config(target_dir) -> ModelConfig:
    return ModelConfig.from_dir(target_dir)


def defaults(tmp_path, model_config, **raw) -> GenerationDefaults:
    (tmp_path / "generation_config.json").write_text(json.dumps(raw))
    return GenerationDefaults.from_dir(tmp_path, model_config)


def test_no_file_keeps_config_json_s_ids_and_a_file_decides_them_alone(tmp_path, model_config):
    """transformers' generate: a generation_config.json without eos_token_id (or with null, or
    written from the model config) has no end id, whatever config.json says."""
    assert model_config.eos_token_ids
    assert GenerationDefaults.from_dir(tmp_path, model_config).eos_token_ids == model_config.eos_token_ids
    for raw in ({}, {"do_sample": False}, {"eos_token_id": None}, {"_from_model_config": True}):
        assert defaults(tmp_path, model_config, **raw).eos_token_ids == (), raw
    assert defaults(tmp_path, model_config, eos_token_id=[3, 4]).eos_token_ids == (3, 4)
    assert defaults(tmp_path, model_config, eos_token_id=5).eos_token_ids == (5,)


def test_an_eos_id_must_be_inside_the_vocabulary(tmp_path, model_config):
    last = model_config.vocab_size - 1
    assert defaults(tmp_path, model_config, eos_token_id=last).eos_token_ids == (last,)
    assert defaults(tmp_path, model_config, eos_token_id=0).eos_token_ids == (0,)
    for bad in (model_config.vocab_size, -1, True, 2.0):
        with pytest.raises(ModelLoadError, match=r"eos_token_id must be token ids in \[0, "):
            defaults(tmp_path, model_config, eos_token_id=bad)


def test_sampling_keys_apply_only_with_do_sample_and_unset_ones_take_transformers_defaults(tmp_path, model_config):
    assert model_config.vocab_size > 50
    assert defaults(tmp_path, model_config, temperature=0.7, top_k=5).sampling == {"temperature": 0.0}
    assert defaults(tmp_path, model_config, do_sample=True, temperature=0.7, top_k=5, top_p=0.9).sampling == {
        "temperature": 0.7, "top_k": 5, "top_p": 0.9}
    assert defaults(tmp_path, model_config, do_sample=True).sampling == {"temperature": 1.0, "top_k": 50}
    # a vocabulary of 50: a top-k of 50 would be all of it, so none
    small = dataclasses.replace(model_config, vocab_size=50, bos_token_id=None, eos_token_id=None, eos_token_ids=(1,))
    assert defaults(tmp_path, small, do_sample=True).sampling == {"temperature": 1.0, "top_k": -1}
    # one token more, and a top-k of 50 leaves one out
    one_more = dataclasses.replace(small, vocab_size=51)
    assert defaults(tmp_path, one_more, do_sample=True).sampling == {"temperature": 1.0, "top_k": 50}
    assert defaults(tmp_path, model_config, max_new_tokens=7).sampling == {"temperature": 0.0, "max_tokens": 7}


def test_without_params_a_request_is_greedy_and_as_long_as_transformers_makes_it(tmp_path, model_config):
    """No file: greedy, 20 new tokens. max_length counts the prompt; max_new_tokens wins over it;
    a prompt that fills max_length is refused, as transformers refuses it."""
    none = GenerationDefaults.from_dir(tmp_path, model_config).sampling_params(5)
    assert (none.temperature, none.max_tokens) == (0.0, 20)
    assert defaults(tmp_path, model_config, max_length=12).sampling_params(5).max_tokens == 7
    assert defaults(tmp_path, model_config, max_length=12, max_new_tokens=3).sampling_params(5).max_tokens == 3
    with pytest.raises(RequestError, match=r"prompt has 12 tokens, generation_config\.json's max_length \(12\) "
                                           r"leaves none to generate"):
        defaults(tmp_path, model_config, max_length=12).sampling_params(12)
    with pytest.raises(ModelLoadError, match="max_length must be an integer >= 2"):
        defaults(tmp_path, model_config, max_length=0)


def test_sampling_values_a_request_would_refuse_are_a_load_error_naming_the_file(tmp_path, model_config):
    path = tmp_path / "generation_config.json"
    for raw, message in ((dict(do_sample=True, top_p=1.5), "top_p must be in (0, 1], got 1.5"),
                         (dict(max_new_tokens=0), "max_tokens must be an integer >= 1, got 0")):
        with pytest.raises(ModelLoadError) as error:
            defaults(tmp_path, model_config, **raw)
        assert str(error.value) == f"{path}: {message}"


@pytest.mark.parametrize("max_length", [1, 0, True, 12.0, "12", [12]])
def test_a_max_length_that_is_not_an_integer_of_at_least_2_is_a_load_error_naming_the_file(tmp_path, model_config,
                                                                                          max_length):
    """A float, a string or a bool is refused when the folder loads, with the file's name, never
    taken as a number (12.0 would make a float max_tokens) nor left to fail as a TypeError."""
    with pytest.raises(ModelLoadError) as error:
        defaults(tmp_path, model_config, max_length=max_length)
    assert str(error.value) == (f"{tmp_path / 'generation_config.json'}: max_length must be an integer >= 2 "
                                f"(prompt + new tokens), got {max_length!r}")


def test_the_smallest_max_length_leaves_a_one_token_prompt_one_new_token(tmp_path, model_config):
    """max_length 2 is a prompt token and a new one: accepted, as the refusal's ">= 2" says."""
    two = defaults(tmp_path, model_config, max_length=2)
    assert two.max_length == 2 and two.sampling_params(1).max_tokens == 1
    with pytest.raises(RequestError, match=r"prompt has 2 tokens, generation_config\.json's max_length \(2\)"):
        two.sampling_params(2)
