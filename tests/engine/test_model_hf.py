"""External check: our Llama equals Hugging Face's LlamaForCausalLM on the fixture weights.

Hugging Face's implementation is built from the same config.json and loaded with the same
safetensors file (tied embeddings), in float32. Greedy tokens must agree exactly; logits agree
to float32 rounding.
"""
import pytest
import torch
from safetensors.torch import load_file

from engine import SamplingParams
from engine.tokenizer import EOS_ID, PAD_ID, ByteTokenizer

# One pytest-xdist worker builds the session's Hugging Face folders (and imports transformers):
# `make test` runs --dist loadgroup, which keeps this group together.
pytestmark = pytest.mark.xdist_group("hf-folders")

transformers = pytest.importorskip("transformers")

SNIPPET_100 = ('def read_lines(path):\n    with open(path) as f:\n        return [line.rstrip() '
               'for line in f]\n\n\n')
SNIPPET_200 = ('class Stack:\n    """A last-in, first-out container."""\n\n    def __init__(self):\n'
               '        self._items = []\n\n    def push(self, item):\n        self._items.append(item)'
               '\n\n    def pop(self):\n        return self.')
# Greedy decoding writes "\n" and then EOS after this prompt: a file's end.
EOS_PROMPT = 'if __name__ == "__main__":\n    main()'
PROMPTS = ["def main(", "import os\n", "x", SNIPPET_100, SNIPPET_200, EOS_PROMPT]
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def hf_model(target_dir):
    config = transformers.LlamaConfig.from_pretrained(target_dir)
    model = transformers.LlamaForCausalLM(config).float().eval()
    missing, unexpected = model.load_state_dict(load_file(str(target_dir / "model.safetensors")),
                                                strict=False)
    assert (missing, unexpected) == (["lm_head.weight"], [])  # tied: stored once, as the embedding
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # Never stop on EOS inside generate(); each test decides where EOS ends a comparison.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = PAD_ID
    return model


def hf_greedy(model, prompt: str, max_new_tokens: int, eos_token_id=None) -> list[int]:
    ids = torch.tensor([ByteTokenizer().encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                             pad_token_id=PAD_ID)
    return out[0, ids.shape[1]:].tolist()


@pytest.fixture(scope="module")
def hf_reference(hf_model):
    return {p: hf_greedy(hf_model, p, MAX_NEW_TOKENS) for p in PROMPTS}


def test_hf_reference_runs_full_length_through_eos(hf_reference):
    # The comparison below is only meaningful if neither side cut a sequence at EOS.
    assert all(len(ids) == MAX_NEW_TOKENS for ids in hf_reference.values())
    assert EOS_ID in hf_reference[EOS_PROMPT]
    assert hf_reference[EOS_PROMPT].index(EOS_ID) < MAX_NEW_TOKENS - 1


@pytest.mark.parametrize("async_runner", [True, False])
def test_greedy_batch_equals_hf_token_for_token(make_llm, hf_reference, async_runner):
    llm = make_llm(async_runner=async_runner, max_num_seqs=4)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True))
    assert llm.is_async is async_runner
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_reference[prompt], prompt
        assert out.finish_reason == "length"
    assert len({tuple(ids) for ids in hf_reference.values()}) == len(PROMPTS)  # not a trivial output


def test_eos_stops_where_hf_stops(make_llm, hf_model):
    expected = hf_greedy(hf_model, EOS_PROMPT, MAX_NEW_TOKENS, eos_token_id=EOS_ID)
    assert expected[-1] == EOS_ID and len(expected) < MAX_NEW_TOKENS
    out, = make_llm().generate([EOS_PROMPT], SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS))
    assert out.token_ids == expected
    assert out.finish_reason == "stop"


def test_dense_logits_match_hf(make_llm, hf_model):
    model = make_llm().model
    for prompt in PROMPTS:
        ids = torch.tensor([ByteTokenizer().encode(prompt)])
        with torch.no_grad():
            ours, _ = model.forward_dense(ids)
            theirs = hf_model(ids).logits
        assert ours.shape == theirs.shape == (1, ids.shape[1], 260)
        torch.testing.assert_close(ours, theirs.float(), atol=1e-4, rtol=1e-4)
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_every_activation_a_config_may_name_is_transformers_own():
    """`hidden_act` picks the MLP's activation: each name we accept computes exactly what
    transformers' ACT2FN computes for it (same formula, same rounding), over a range where the
    tanh approximations and the cubic terms matter, and we know every name transformers knows."""
    from transformers.activations import ACT2CLS, ACT2FN

    from engine.activations import ACTIVATIONS, TRANSFORMERS_ACTIVATIONS
    x = torch.linspace(-6.0, 6.0, 1201)
    for name, fn in ACTIVATIONS.items():
        assert torch.equal(fn(x), ACT2FN[name](x)), name
    assert TRANSFORMERS_ACTIVATIONS == set(ACT2CLS)
