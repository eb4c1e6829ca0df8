"""Bad input is refused with an error that names what is wrong, and refusing it changes nothing.
Over 300 lines because it is one table per kind of input (folders, arguments, sampling, requests),
and a user looking for what an error means should find every refusal in one place.

Model folders: each case copies the fixture target into tmp_path and damages one thing.
Requests: a refused request leaves every other request's tokens exactly as they would be
without it.
"""
import json
import math
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError, RequestError, SpecgateError


@pytest.fixture
def model_copy(tmp_path, target_dir):
    folder = tmp_path / "model"
    shutil.copytree(target_dir, folder)
    return folder


def edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for name, value in changes.items():
        if value is None:
            config.pop(name)
        else:
            config[name] = value
    path.write_text(json.dumps(config))


def test_error_hierarchy():
    assert issubclass(ModelLoadError, SpecgateError) and issubclass(RequestError, SpecgateError)
    assert issubclass(SpecgateError, ValueError)


# ---- model folders -------------------------------------------------------------------------

def test_no_model_folder_is_refused_naming_the_argument():
    with pytest.raises(ModelLoadError, match=r"^LLM\(\) needs model=<a Hugging Face-format folder> \(the fixture "
                                             r"target is fixtures\.TARGET_DIR; the specgate command and the test "
                                             r"fixtures pass it\)$"):
        LLM()


def test_the_block_drafter_without_a_folder_is_refused_naming_the_argument(target_dir):
    with pytest.raises(ModelLoadError) as refused:
        LLM(target_dir, spec="block", max_model_len=128)
    assert str(refused.value) == ("spec='block' needs drafter=<a block drafter folder> (the fixture drafter is "
                                  "fixtures.DRAFTER_DIR; the specgate command and the test fixtures pass it)")


def test_missing_model_folder(tmp_path):
    with pytest.raises(ModelLoadError, match=r"model folder .*nowhere does not exist"):
        LLM(tmp_path / "nowhere")


def test_model_path_is_a_file(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"weights\.bin does not exist or is not a folder"):
        LLM(tmp_path / "weights.bin")


def test_folder_without_config_json(model_copy):
    (model_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"model folder .* has no config\.json"):
        LLM(model_copy)


@pytest.mark.parametrize("text, match", [
    ('{"vocab_size": 260,', r"config\.json is not valid JSON"),
    ("", r"config\.json is not valid JSON"),
    ("[1, 2]", r"config\.json must hold a JSON object"),
])
def test_malformed_config_json(model_copy, text, match):
    (model_copy / "config.json").write_text(text)
    with pytest.raises(ModelLoadError, match=match):
        LLM(model_copy)


CONFIG_CASES = [
    # (edits to config.json, error class, what the message must say)
    (dict(hidden_size=None), ModelLoadError, r"missing required fields: hidden_size$"),
    (dict(vocab_size=None, num_hidden_layers=None), ModelLoadError,
     r"missing required fields: vocab_size, num_hidden_layers$"),
    (dict(model_type="gpt2", architectures=["GPT2LMHeadModel"]), ModelLoadError,
     r"only the Llama architecture is supported, got model_type='gpt2'"),
    (dict(architectures=["MistralForCausalLM"]), ModelLoadError, r"only the Llama architecture.*Mistral"),
    (dict(hidden_size="192"), ModelLoadError, r"hidden_size must be a positive integer, got '192'"),
    (dict(num_attention_heads=0), ModelLoadError, r"num_attention_heads must be a positive integer, got 0"),
    (dict(num_key_value_heads=3), ModelLoadError,
     r"num_attention_heads \(4\) must be a multiple of num_key_value_heads \(3\)"),
    (dict(num_attention_heads=5, num_key_value_heads=5), ModelLoadError,
     r"hidden_size \(192\) must divide by num_attention_heads \(5\)"),
    (dict(rope_scaling={"type": "yarn", "factor": 2.0}), ModelLoadError, r"rope_type='yarn' is not supported"),
    (dict(sliding_window=4096), ModelLoadError, r"sliding_window=4096 is not supported \(sliding-window attention\)"),
    (dict(some_new_key=1), ModelLoadError, r"unknown key some_new_key=1: specgate refuses keys it does not know"),
    (dict(eos_token_id=300), ModelLoadError, r"eos_token_id must be a token id in \[0, 260\).*got 300"),
    # The config parses, but the weights do not fit it: the tensor is named with both shapes.
    (dict(hidden_size=256), ModelLoadError,
     r"tensor model\.embed_tokens\.weight has shape \(260, 192\), the config implies \(260, 256\)"),
    (dict(intermediate_size=384), ModelLoadError,
     r"tensor model\.layers\.0\.mlp\.(gate_proj\.weight has shape \(512, 192\), the config implies \(384, 192\)|"
     r"down_proj\.weight has shape \(192, 512\), the config implies \(192, 384\))"),
    (dict(vocab_size=300), ModelLoadError,
     r"embed_tokens\.weight has shape \(260, 192\), the config implies \(300, 192\)"),
    (dict(num_hidden_layers=5), ModelLoadError, r"tensors do not match the config: missing \['model\.layers\.4\."),
    (dict(num_hidden_layers=3), ModelLoadError, r"missing \[\], unexpected \['model\.layers\.3\."),
    (dict(tie_word_embeddings=False), ModelLoadError, r"missing \['lm_head\.weight'\]"),
    (dict(vocab_size=200, eos_token_id=None, bos_token_id=None, pad_token_id=None), SpecgateError,
     r"vocab_size 200 is smaller than the byte tokenizer's 260"),
    (dict(max_position_embeddings=128), SpecgateError,
     r"max_model_len \(256\) exceeds the model's max_position_embeddings \(128\)"),
]


@pytest.mark.parametrize("edits, error, match", CONFIG_CASES, ids=[str(c[0]) for c in CONFIG_CASES])
def test_bad_config_is_refused_by_name(model_copy, edits, error, match):
    edit_config(model_copy, **edits)
    with pytest.raises(error, match=match):
        LLM(model_copy, max_model_len=256, max_num_batched_tokens=1024)


def test_missing_weights_file(model_copy):
    (model_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"model folder .* has no model\.safetensors"):
        LLM(model_copy)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_safetensors(model_copy, damage):
    path = model_copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[:len(data) // 2], "garbage": b"not a tensor file " * 8,
                      "empty": b""}[damage])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is not a readable safetensors file"):
        LLM(model_copy)


def test_undamaged_copy_loads(model_copy, make_llm):
    """The control for the cases above: the copy itself is fine."""
    params = SamplingParams(temperature=0, max_tokens=8)
    out, = LLM(model_copy, max_model_len=256, max_num_batched_tokens=1024).generate(["def main("], params)
    assert out.token_ids == make_llm().generate(["def main("], params)[0].token_ids


# ---- engine arguments ----------------------------------------------------------------------

ENGINE_CASES = [
    (dict(max_num_seqs=0), r"max_num_seqs must be an integer in \[1, 256\], got 0"),
    (dict(max_num_seqs=2.5), r"max_num_seqs must be an integer in \[1, 256\], got 2\.5"),
    (dict(dtype="float16"), r"dtype must be one of \['bfloat16', 'float32'\], got 'float16'"),
    (dict(block_size=0), r"block_size must be an integer in \[1, 1024\], got 0"),
    (dict(max_model_len=1), r"max_model_len must be an integer in \[2, 65536\], got 1"),
    (dict(max_num_batched_tokens=100), r"max_num_batched_tokens \(100\) must be at least max_model_len \(256\)"),
    (dict(num_kv_blocks=5),
     r"num_kv_blocks \(5\) must hold at least one full-length request \(\d+ blocks of 16 tokens\)"),
    (dict(num_kv_blocks=20.5), r"num_kv_blocks must be None or an integer, got 20\.5"),
    (dict(device="tpu"), r"device must be 'cpu' or 'cuda\[:N\]', got 'tpu'"),
    (dict(spec="eagle"), r"spec must be one of .*got 'eagle'"),
    (dict(spec="ngram", num_spec_tokens=0), r"num_spec_tokens must be an integer in \[1, 16\], got 0"),
    (dict(spec="ngram", num_spec_tokens=8, max_model_len=4, max_num_batched_tokens=4),
     r"max_num_batched_tokens \(4\) must be at least num_spec_tokens \+ 1 \(9\) so a verify step fits"),
    (dict(seed="0"), r"seed must be an integer .*got '0'"),
    (dict(max_model_len=2048, max_num_batched_tokens=2048),
     r"max_model_len \(2048\) exceeds the model's max_position_embeddings \(1024\)"),
]


@pytest.mark.parametrize("kwargs, match", ENGINE_CASES, ids=[str(c[0]) for c in ENGINE_CASES])
def test_bad_engine_arguments_are_refused_by_name(make_llm, kwargs, match):
    with pytest.raises(SpecgateError, match=match):
        make_llm(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device(make_llm):
    with pytest.raises(SpecgateError, match=r"device='cuda' was asked for, but no CUDA device"):
        make_llm(device="cuda")


def test_bad_async_runner_environment_variable(make_llm, monkeypatch):
    monkeypatch.setenv("VT_ASYNC_RUNNER", "yes")
    with pytest.raises(SpecgateError, match=r"VT_ASYNC_RUNNER must be 0 or 1, got 'yes'"):
        make_llm()


# ---- sampling parameters -------------------------------------------------------------------

SAMPLING_CASES = [
    ("temperature", -0.5), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "1"),
    ("temperature", True),
    ("top_p", 0), ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.1), ("top_p", math.nan), ("top_p", True),
    ("top_k", -2), ("top_k", 2.5), ("top_k", True), ("top_k", "5"),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 2.0), ("max_tokens", True),
    ("seed", "1"), ("seed", 1.0), ("seed", True), ("seed", -1), ("seed", 2 ** 64),
    ("stop_token_ids", ["a"]), ("stop_token_ids", [1.0]), ("stop_token_ids", [True]),
    ("logits_processors", [1]),
]


@pytest.mark.parametrize("field, value", SAMPLING_CASES, ids=[f"{f}={v!r}" for f, v in SAMPLING_CASES])
def test_bad_sampling_params_are_refused_by_name(field, value):
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert message.startswith(f"{field} must be"), message
    if field != "logits_processors":
        assert repr(value) in message


@pytest.mark.parametrize("field, value", [("temperature", 0), ("top_p", 1), ("top_p", 1e-9), ("top_k", -1),
                                          ("top_k", 0), ("top_k", 1), ("max_tokens", 1), ("seed", 0),
                                          ("seed", 2 ** 64 - 1), ("stop_token_ids", [0, 259])])
def test_boundary_sampling_params_are_accepted(field, value):
    assert getattr(SamplingParams(**{field: value}), field) == value


# ---- requests ------------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=8)
BAD_REQUESTS = [
    # (prompt, params, what the message must say), named by what is wrong with the request
    pytest.param("", GREEDY, r"^prompt is empty$", id="empty-string"),
    pytest.param([], GREEDY, r"^prompt is empty$", id="empty-ids"),
    pytest.param([256, 72, 260], GREEDY, r"token ids outside the vocabulary \[0, 260\): \[260\]", id="id-past-vocab"),
    pytest.param([256, -1], GREEDY, r"outside the vocabulary \[0, 260\): \[-1\]", id="negative-id"),
    pytest.param([256, 65.0], GREEDY, r"outside the vocabulary \[0, 260\): \[65\.0\]", id="float-id"),
    pytest.param([256, True], GREEDY, r"outside the vocabulary \[0, 260\): \[True\]", id="bool-id"),
    pytest.param("def f(", SamplingParams(stop_token_ids=[999]), r"outside the vocabulary \[0, 260\): \[999\]",
                 id="stop-id-past-vocab"),
    pytest.param("a" * 255, GREEDY, r"prompt has 256 tokens; the context holds 256 \(max_model_len\)",
                 id="prompt-fills-context"),
    pytest.param([256] * 300, GREEDY, r"prompt has 300 tokens; the context holds 256", id="prompt-past-context"),
    pytest.param(b"def f(", GREEDY, r"a prompt must be a string or a list of token ids, got bytes", id="bytes-prompt"),
    pytest.param(12, GREEDY, r"a prompt must be a string or a list of token ids, got int", id="int-prompt"),
    pytest.param("def f(", {"temperature": 0}, r"params must be a SamplingParams, got dict", id="dict-params"),
]


@pytest.fixture(scope="module")
def shared_llm(target_dir):
    return LLM(target_dir, max_model_len=256, max_num_batched_tokens=1024)


@pytest.mark.parametrize("prompt, params, match", BAD_REQUESTS)
def test_bad_request_is_refused_when_added(shared_llm, prompt, params, match):
    with pytest.raises(RequestError, match=match):
        shared_llm.add_request(prompt, params)
    assert not shared_llm.has_unfinished()  # nothing was queued


@pytest.mark.parametrize("arrival_step", [-1, True, 1.5, "2"])
def test_bad_arrival_step_is_refused(shared_llm, arrival_step):
    with pytest.raises(RequestError, match=rf"arrival_step must be an integer >= 0, got {arrival_step!r}"):
        shared_llm.add_request("x", GREEDY, arrival_step=arrival_step)
    assert not shared_llm.has_unfinished()


def test_the_first_and_last_vocabulary_ids_are_valid_prompt_and_stop_ids(make_llm):
    llm = make_llm()
    last = llm.model_config.vocab_size - 1
    out, = llm.generate([[0, last]], SamplingParams(temperature=0, max_tokens=2, stop_token_ids=[0, last]))
    assert out.prompt_token_ids == [0, last] and 1 <= len(out.token_ids) <= 2


def test_a_refusal_lists_the_first_five_bad_ids(shared_llm):
    with pytest.raises(RequestError) as info:
        shared_llm.add_request([256, -1, 260, 261, 262, 263, 264], GREEDY)
    assert str(info.value) == "token ids outside the vocabulary [0, 260): [-1, 260, 261, 262, 263]"


def test_longest_prompt_that_fits_gets_one_token(shared_llm):
    out, = shared_llm.generate(["a" * 254], GREEDY)  # 255 tokens with BOS, max_model_len 256
    assert len(out.token_ids) == 1 and out.finish_reason == "context"


def test_context_and_max_tokens_reached_together_is_length(shared_llm):
    out, = shared_llm.generate(["a" * 254], SamplingParams(temperature=0, max_tokens=1))
    assert len(out.token_ids) == 1 and out.finish_reason == "length"


PROMPTS = ["def main(", "import os\n", "class Stack:\n    def push(self, item):\n", "x"]
PARAMS = [SamplingParams(temperature=0, max_tokens=10),
          SamplingParams(temperature=0.8, seed=11, max_tokens=9),
          SamplingParams(temperature=1.0, max_tokens=10),   # unseeded: key from the engine's seed
          SamplingParams(temperature=0.7, top_k=10, max_tokens=7)]


@pytest.mark.parametrize("async_runner", [True, False])
def test_refused_request_leaves_other_requests_untouched(make_llm, async_runner):
    reference = make_llm(seed=5, async_runner=async_runner).generate(PROMPTS, PARAMS)
    llm = make_llm(seed=5, async_runner=async_runner, max_num_seqs=2)
    reqs = [llm.add_request(PROMPTS[0], PARAMS[0])]
    with pytest.raises(RequestError, match="prompt is empty"):
        llm.add_request("", PARAMS[2])
    reqs.append(llm.add_request(PROMPTS[1], PARAMS[1]))
    llm.step()
    llm.step()
    # Refused while others run: one with a token outside the vocabulary, one too long.
    with pytest.raises(RequestError, match=r"outside the vocabulary"):
        llm.add_request([256, 300], PARAMS[2])
    with pytest.raises(RequestError, match=r"prompt has 301 tokens"):
        llm.add_request("a" * 300, PARAMS[2])
    reqs += [llm.add_request(p, q) for p, q in zip(PROMPTS[2:], PARAMS[2:])]
    num_steps = 2
    while llm.has_unfinished():
        llm.step()
        num_steps += 1
    outs = [llm.output(r) for r in reqs]
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert [o.finish_reason for o in outs] == [o.finish_reason for o in reference]
    assert [o.request_id for o in outs] == [0, 1, 2, 3]  # refused requests took no id
    assert all(len(o.token_ids) == p.max_tokens for o, p in zip(outs, PARAMS))


@pytest.mark.parametrize("prompts", [None, 12, 3.5])
def test_generate_refuses_prompts_that_are_not_a_prompt_or_a_list(shared_llm, prompts):
    with pytest.raises(RequestError, match=r"prompt"):
        shared_llm.generate(prompts, GREEDY)


@pytest.mark.parametrize("prompts, params, arrivals, match", [
    (PROMPTS[:2] + [""] + PROMPTS[2:], None, None, r"^request 2: prompt is empty$"),
    (PROMPTS + [[256, 1000]], None, None, r"^request 4: token ids outside the vocabulary"),
    (PROMPTS, PARAMS[:1] + ["greedy"] + PARAMS[2:], None, r"^request 1: params must be a SamplingParams, got str"),
    (PROMPTS, None, [0, 0, 0, -2], r"^request 3: arrival_step must be an integer >= 0, got -2"),
    (PROMPTS, PARAMS[:2], None, r"got 4 prompts, 2 params and 4 arrival steps"),
])
def test_generate_refuses_a_bad_batch_before_running_anything(make_llm, prompts, params, arrivals, match):
    llm = make_llm()
    with pytest.raises(RequestError, match=match):
        llm.generate(prompts, params, arrival_steps=arrivals)
    assert not llm.has_unfinished()
    # Nothing ran and nothing was queued: the next batch starts at request 0 and
    # gives the tokens a fresh engine gives.
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.request_id for o in outs] == [0, 1, 2, 3]
    assert [o.token_ids for o in outs] == [o.token_ids for o in make_llm().generate(PROMPTS, GREEDY)]
