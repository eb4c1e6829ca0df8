"""Real Llama folders end to end: specgate's greedy tokens equal transformers' generate, token
for token in float32, on small random-weight folders shaped like published ones (see conftest.py:
a Llama 3.1-style one with llama3 rope scaling, an eos list, GQA 4:1 and head_dim given; a Llama
2-style one in transformers 4's spelling with a non-SiLU activation), read with the folder's own
tokenizer; the same folder sharded loads to the same tokens; every refused feature is named."""
import json
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError, SpecgateError
from engine.tokenizer import HFTokenizer

transformers = pytest.importorskip("transformers")
from conftest import LLAMA3, edit_json  # noqa: E402  (tests/conftest.py)

# One pytest-xdist worker builds the session's Hugging Face folders (and imports transformers):
# `make test` runs --dist loadgroup, which keeps this group together.
pytestmark = pytest.mark.xdist_group("hf-folders")

PROMPTS = ["def wrap(text, width=70):", "import string\n", "x", 'class Formatter:\n    """Format a string.\n']
MAX_NEW = 24


def make(folder, **kwargs) -> LLM:
    return LLM(folder, max_model_len=128, max_num_batched_tokens=256, max_num_seqs=4, **kwargs)


def hf_greedy(folder, prompts, eos_token_id=None, max_new=MAX_NEW) -> list[list[int]]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    outs = []
    for prompt in prompts:
        ids = torch.tensor([tok(prompt).input_ids])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new, eos_token_id=eos_token_id, pad_token_id=0)
        outs.append(out[0, ids.shape[1]:].tolist())
    return outs


def specgate_greedy(llm, prompts, max_new=MAX_NEW, ignore_eos=True):
    return llm.generate(list(prompts), SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=ignore_eos))


@pytest.fixture(scope="module")
def references(llama3_dir, llama2_dir):
    return {"llama3": hf_greedy(llama3_dir, PROMPTS, eos_token_id=-1),
            "llama2": hf_greedy(llama2_dir, PROMPTS, eos_token_id=-1)}


@pytest.fixture(scope="module")
def folders(llama3_dir, llama2_dir, llama3_sharded_dir):
    return {"llama3": llama3_dir, "llama2": llama2_dir, "llama3_sharded": llama3_sharded_dir}


@pytest.mark.parametrize("name", ["llama3", "llama2", "llama3_sharded"])
def test_greedy_text_prompts_equal_transformers_token_for_token(folders, references, name):
    expected = references[name.removesuffix("_sharded")]
    outs = specgate_greedy(make(folders[name]), PROMPTS)
    assert [o.token_ids for o in outs] == expected
    assert all(len(ids) == MAX_NEW for ids in expected)
    assert len({tuple(ids) for ids in expected}) == len(PROMPTS)  # not a trivial output


def test_the_sharded_folder_really_is_sharded(llama3_sharded_dir):
    index = json.loads((llama3_sharded_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (llama3_sharded_dir / "model.safetensors").exists()


@pytest.mark.parametrize("name", ["llama3", "llama2"])
def test_llm_tokenizer_is_the_folder_s_and_encodes_as_transformers(folders, name):
    llm = make(folders[name])
    hf = transformers.AutoTokenizer.from_pretrained(folders[name])
    assert isinstance(llm.tokenizer, HFTokenizer)
    for prompt, out in zip(PROMPTS, specgate_greedy(llm, PROMPTS, max_new=4)):
        ids = hf(prompt).input_ids
        assert ids[0] == 0 and ids.count(0) == 1  # BOS once, from the post-processor or add_bos_token
        assert llm.tokenizer.encode(prompt) == ids == out.prompt_token_ids
        assert out.text == llm.tokenizer.decode(out.token_ids) == hf.decode(out.token_ids, skip_special_tokens=True)
        assert llm.tokenizer.decode(ids) == prompt


def _stop_folder(tmp_path, llama3_dir, where, eos_ids):
    folder = tmp_path / "stop"
    shutil.copytree(llama3_dir, folder)
    if where == "config":
        (folder / "generation_config.json").unlink()
        edit_json(folder / "config.json", eos_token_id=eos_ids)
    else:
        edit_json(folder / "generation_config.json", eos_token_id=eos_ids)
    return folder


@pytest.mark.parametrize("where", ["config", "generation_config"])
def test_generation_stops_at_the_second_listed_eos_id(tmp_path, llama3_dir, references, where):
    # Make the 6th greedy token of a prompt the SECOND listed end-of-sequence id: a request must
    # stop there, as transformers' generate does with the same list.
    full = references["llama3"][1]
    stop = full[5]
    assert stop not in full[:5]
    eos_ids = [2, stop]
    folder = _stop_folder(tmp_path, llama3_dir, where, eos_ids)
    expected = hf_greedy(folder, PROMPTS[1:2], eos_token_id=eos_ids)[0]
    assert expected == full[:6]
    out, = specgate_greedy(make(folder), PROMPTS[1:2], ignore_eos=False)
    assert out.token_ids == expected and out.finish_reason == "stop"
    out, = specgate_greedy(make(folder), PROMPTS[1:2], ignore_eos=True)
    assert out.token_ids == full  # ignore_eos runs past every listed id


SENSITIVITY = {  # a config edit that must change the tokens: the equality above is not luck
    "llama3 scaling ignored": ("llama3", dict(rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "rope_theta 10,000": ("llama3", dict(rope_parameters={**LLAMA3["rope_parameters"], "rope_theta": 10000.0})),
    "linear scaling ignored": ("llama2", dict(rope_scaling=None)),
    "SiLU instead": ("llama2", dict(hidden_act="silu")),
    "rms_norm_eps 1e-5 instead of the default": ("llama2", dict(rms_norm_eps=1e-5)),
}


@pytest.mark.parametrize("case", list(SENSITIVITY))
def test_each_honoured_key_changes_the_tokens(tmp_path, folders, references, case):
    name, edits = SENSITIVITY[case]
    folder = tmp_path / "edited"
    shutil.copytree(folders[name], folder)
    edit_json(folder / "config.json", **edits)
    outs = specgate_greedy(make(folder), PROMPTS)
    assert [o.token_ids for o in outs] != references[name]


REFUSED = {  # (file, edits, what the error must say)
    "made-up activation": ("config.json", dict(hidden_act="swishy"),
                           "hidden_act='swishy' is not supported (transformers does not know it either)"),
    "activation not implemented": ("config.json", dict(hidden_act="mish"),
                                   "hidden_act='mish' is not supported (transformers knows it"),
    "yarn rope": ("config.json", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}),
                  "rope_type='yarn' is not supported"),
    "unknown rope key": ("config.json", dict(rope_parameters={**LLAMA3["rope_parameters"], "beta_fast": 32}),
                         "rope key(s) beta_fast are not supported for rope_type='llama3'"),
    "partial rotary": ("config.json", dict(partial_rotary_factor=0.5), "partial_rotary_factor=0.5 is not supported"),
    "attention bias": ("config.json", dict(attention_bias=True), "attention_bias=True is not supported"),
    "quantised": ("config.json", dict(quantization_config={"quant_method": "gptq"}),
                  "quantization_config={'quant_method': 'gptq'} is not supported (quantised weights)"),
    "unknown key": ("config.json", dict(sliding_window_pattern=4), "unknown key sliding_window_pattern=4"),
    "tied flag, distinct stored head": ("config.json", dict(tie_word_embeddings=True),
                                        "model.safetensors: tie_word_embeddings is true but the file stores "
                                        "an lm_head.weight that differs"),
    "rope formats disagree": ("config.json", dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
                              "rope_scaling={'rope_type': 'linear', 'factor': 2.0} and rope_parameters="),
    "repetition penalty": ("generation_config.json", dict(repetition_penalty=1.2),
                           "repetition_penalty=1.2 is not supported (repetition penalty)"),
    "beam search": ("generation_config.json", dict(num_beams=4), "num_beams=4 is not supported (beam search)"),
    "unknown generation key": ("generation_config.json", dict(watermarking_config={}),
                               "unknown key watermarking_config"),
    "tokenizer class": ("tokenizer_config.json", dict(tokenizer_class="BertTokenizer"),
                        "tokenizer_class='BertTokenizer' is not supported"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_each_refused_feature_raises_an_error_naming_it(tmp_path, llama3_dir, case):
    file, edits, message = REFUSED[case]
    folder = tmp_path / "refused"
    shutil.copytree(llama3_dir, folder)
    edit_json(folder / file, **edits)
    with pytest.raises(ModelLoadError) as info:
        make(folder)
    assert message in str(info.value)
    assert str(folder) in str(info.value)  # the error names the folder's file


def test_checkpoint_dtype_is_the_default_and_an_explicit_dtype_wins(tmp_path, llama3_dir):
    folder = tmp_path / "bf16"
    shutil.copytree(llama3_dir, folder)
    edit_json(folder / "config.json", dtype="bfloat16")
    assert make(folder).model.lm_head.weight.dtype == torch.bfloat16
    assert make(folder, dtype="float32").model.lm_head.weight.dtype == torch.float32
    assert make(llama3_dir).model.lm_head.weight.dtype == torch.float32  # saved as float32


def test_generation_config_sampling_defaults_apply_when_no_params_are_given(tmp_path, llama3_dir, references):
    folder = tmp_path / "gen"
    shutil.copytree(llama3_dir, folder)
    edit_json(folder / "generation_config.json", do_sample=False, max_new_tokens=5)
    llm = make(folder)
    assert llm.generation.sampling_params(3).temperature == 0
    out, = llm.generate([PROMPTS[0]])
    assert out.token_ids == references["llama3"][0][:5]
    edit_json(folder / "generation_config.json", do_sample=True, temperature=0.6, top_p=0.9)
    params = make(folder).generation.sampling_params(3)
    # top_k unset: transformers' generate default, 50
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.9, 50, 5)


def test_generation_config_max_length_counts_the_prompt_when_no_params_are_given(tmp_path, llama3_dir, references):
    """max_length is prompt plus new tokens, as in transformers' generate: a request without
    SamplingParams makes what its prompt leaves of it, the same greedy tokens."""
    folder = tmp_path / "gen"
    shutil.copytree(llama3_dir, folder)
    prompt = make(folder).tokenizer.encode(PROMPTS[0])
    edit_json(folder / "generation_config.json", drop=("max_new_tokens",), do_sample=False, max_length=len(prompt) + 5)
    out, = make(folder).generate([PROMPTS[0]])
    assert out.prompt_token_ids == prompt and out.token_ids == references["llama3"][0][:5]


def test_a_report_names_the_weights_the_loader_reads_by_checksum(llama3_sharded_dir, llama3_dir, drafter_dir,
                                                                   tmp_path):
    """The target's checksum is its model.safetensors' (which the loader reads even beside an
    index) or, sharded, one over the index and every shard, so a change to any shard changes it;
    the drafter's is its model.safetensors'."""
    import hashlib

    from engine.loader import model_checksums, weights_sha256

    def sha(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()
    assert model_checksums(llama3_dir, drafter_dir) == {"target": sha(llama3_dir / "model.safetensors"),
                                                       "drafter": sha(drafter_dir / "model.safetensors")}
    assert model_checksums(llama3_sharded_dir)["target"] == weights_sha256(llama3_sharded_dir)
    assert weights_sha256(llama3_sharded_dir) != weights_sha256(llama3_dir)
    both = tmp_path / "both"
    shutil.copytree(llama3_sharded_dir, both)
    shutil.copy(llama3_dir / "model.safetensors", both / "model.safetensors")
    assert weights_sha256(both) == sha(both / "model.safetensors")
    (both / "model.safetensors").unlink()
    last = sorted(both.glob("model-*-of-*.safetensors"))[-1]
    data = bytearray(last.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor
    last.write_bytes(bytes(data))
    assert weights_sha256(both) != weights_sha256(llama3_sharded_dir)


@pytest.mark.parametrize("damage, message", [
    ("index names a missing shard", "which the folder does not have"),
    ("index without weight_map", "must be JSON with a 'weight_map' object"),
])
def test_a_damaged_shard_index_is_refused_by_name(tmp_path, llama3_sharded_dir, damage, message):
    folder = tmp_path / "damaged"
    shutil.copytree(llama3_sharded_dir, folder)
    if damage == "index names a missing shard":
        next(folder.glob("model-00002-of-*.safetensors")).unlink()
    else:
        (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=message):
        make(folder)


def test_an_index_that_maps_tensors_to_a_shard_without_them_names_the_first_five(tmp_path, llama3_sharded_dir):
    folder = tmp_path / "remapped"
    shutil.copytree(llama3_sharded_dir, folder)
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    moved = [name for name, file in index["weight_map"].items() if file != last]  # every tensor to one shard
    assert len(moved) > 5, "the message lists five: the case needs more"
    index["weight_map"].update(dict.fromkeys(moved, last))
    index_path.write_text(json.dumps(index))
    with pytest.raises(ModelLoadError) as refused:
        make(folder)
    assert str(refused.value) == f"{index_path} maps {moved[:5]} to {last}, which does not hold them"


def test_an_unreadable_tokenizer_json_is_refused_by_name(tmp_path, llama3_dir):
    folder = tmp_path / "badtok"
    shutil.copytree(llama3_dir, folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json / tokenizer_config\.json cannot be read"):
        make(folder)


@pytest.mark.parametrize("eos", ["absent", "null"])
def test_a_config_without_eos_token_id_follows_transformers_llama_config(tmp_path, llama3_dir, eos):
    """No eos_token_id key: transformers' LlamaConfig default, id 2, ends a request; an explicit
    null: nothing does. Checked against the config and the greedy run transformers makes of it."""
    folder = tmp_path / "no-eos"
    shutil.copytree(llama3_dir, folder)
    (folder / "generation_config.json").unlink()
    if eos == "absent":
        edit_json(folder / "config.json", drop=("eos_token_id",))
    else:
        edit_json(folder / "config.json", eos_token_id=None)
    theirs = transformers.GenerationConfig.from_model_config(transformers.AutoConfig.from_pretrained(folder))
    llm = make(folder)
    assert llm.eos_token_ids == ({2} if eos == "absent" else set()) == set(
        [theirs.eos_token_id] if theirs.eos_token_id is not None else [])
    outs = specgate_greedy(llm, PROMPTS, ignore_eos=False)
    assert [o.token_ids for o in outs] == hf_greedy(folder, PROMPTS)


def test_a_tokenizer_with_more_tokens_than_the_model_is_refused_naming_both(tmp_path, llama3_dir):
    folder = tmp_path / "small-vocab"
    shutil.copytree(llama3_dir, folder)
    edit_json(folder / "config.json", vocab_size=399)
    with pytest.raises(SpecgateError, match=r"tokenizer\.json has 400 tokens, more than the model's vocab_size 399$"):
        make(folder)
