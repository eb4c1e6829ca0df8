"""A folder's generation_config.json read on its own (GenerationDefaults.from_dir): which end ids
and which default sampling a request without SamplingParams gets, as transformers' generate
would, and the ids it refuses. The end-to-end runs are in tests/engine/test_hf_checkpoints.py."""
import dataclasses
import json

import pytest

from engine.config import ModelConfig
from engine.errors import ModelLoadError
from engine.generation_config import GenerationDefaults


@pytest.fixture
def model_config(target_dir) -> ModelConfig:
    return ModelConfig.from_dir(target_dir)


def defaults(tmp_path, model_config, **raw) -> GenerationDefaults:
    (tmp_path / "generation_config.json").write_text(json.dumps(raw))
    return GenerationDefaults.from_dir(tmp_path, model_config)


def test_a_file_without_eos_keeps_config_json_s_ids_and_one_with_it_replaces_them(tmp_path, model_config):
    assert model_config.eos_token_ids
    assert defaults(tmp_path, model_config, do_sample=False).eos_token_ids == model_config.eos_token_ids
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


def test_sampling_values_a_request_would_refuse_are_a_load_error_naming_the_file(tmp_path, model_config):
    path = tmp_path / "generation_config.json"
    for raw, message in ((dict(do_sample=True, top_p=1.5), "top_p must be in (0, 1], got 1.5"),
                         (dict(max_new_tokens=0), "max_tokens must be an integer >= 1, got 0")):
        with pytest.raises(ModelLoadError) as error:
            defaults(tmp_path, model_config, **raw)
        assert str(error.value) == f"{path}: {message}"
