"""The Llama 2 pipeline transformers rebuilds around a tokenizer.json (engine/tokenizer.py's
llama_pipeline), on inputs the shared layout tests do not reach: leading runs of spaces, where the
decoder's Strip must take exactly one; a tokenizer.json stored without byte fallback, which
transformers turns on whatever the file says; and a Llama class over a model that is not BPE,
refused by name; a tokenizer_config.json that is not JSON, refused by its path; and a vocabulary
without some byte tokens, where transformers' rebuilt model has no unk token and drops what it
cannot encode. Each case is compared with transformers' AutoTokenizer."""
import json

import pytest

from engine.errors import ModelLoadError
from engine.tokenizer import load_tokenizer
from gates.hf_folders import write_tokenizer
from helpers.tokenizers import assert_same_as_transformers

pytestmark = pytest.mark.xdist_group("hf-folders")
transformers = pytest.importorskip("transformers")

# Texts that open with more than one space: the Metaspace pre-tokenizer keeps them as "▁" runs,
# and only the first space of the decoded text is the one the pipeline prepended.
LEADING_SPACES = ("  two", "   three x", "  \tx", "    ")


@pytest.mark.parametrize("layout", ["llama2", "llama2-legacy", "llama2-no-prefix-space"])
def test_leading_runs_of_spaces_encode_and_decode_as_transformers(tmp_path, layout):
    assert_same_as_transformers(write_tokenizer(tmp_path, layout), LEADING_SPACES)


def test_a_tokenizer_json_stored_without_byte_fallback_still_falls_back_to_bytes(tmp_path):
    """transformers' LlamaTokenizer rebuilds the BPE model with byte_fallback on: characters
    outside the learned vocabulary become byte tokens, never <unk>."""
    folder = write_tokenizer(tmp_path, "llama2")
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["model"]["byte_fallback"] = False
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    texts = ("é→🐍 naïve", "ünïcödé")
    assert_same_as_transformers(folder, texts)
    unk = raw["model"]["vocab"]["<unk>"]
    assert all(unk not in load_tokenizer(folder).encode(text) for text in texts)


@pytest.mark.parametrize("fuse_unk", [True, False])
def test_a_character_without_vocabulary_entry_or_byte_tokens_is_dropped_as_transformers_drops_it(tmp_path,
                                                                                                   fuse_unk):
    """transformers rebuilds the Llama BPE without an unk_token (and with fuse_unk on): the snake,
    whose four byte tokens are taken out of the vocabulary, encodes to nothing, once or twice."""
    folder = write_tokenizer(tmp_path, "llama2")
    raw = json.loads((folder / "tokenizer.json").read_text())
    missing = {f"<0x{b:02X}>" for b in "🐍".encode()}
    raw["model"]["vocab"] = {t: i for t, i in raw["model"]["vocab"].items() if t not in missing}
    raw["model"]["fuse_unk"] = fuse_unk
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), load_tokenizer(folder)
    for text in ("x🐍🐍y", "🐍", "a 🐍 b"):
        assert ours.encode(text) == theirs.encode(text), text
    assert ours.encode("x🐍🐍y") == ours.encode("xy")


@pytest.mark.parametrize("model", [
    {"type": "WordLevel", "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3}, "unk_token": "<unk>"},
    {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0], ["a", -1.0]]},
])
def test_a_llama_class_over_a_model_that_is_not_bpe_is_refused_by_name(tmp_path, model):
    folder = write_tokenizer(tmp_path, "llama2")
    raw = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**raw, "model": model, "added_tokens": []}))
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(folder)
    assert str(refused.value) == (f"{folder / 'tokenizer_config.json'}: tokenizer_class='LlamaTokenizer' over a "
                                  f"'{model['type']}' tokenizer.json is not supported (only BPE, as Llama 2 ships)")


@pytest.mark.parametrize("text, why", [
    ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ('["LlamaTokenizer"]', "is not a JSON object (it holds a list)"),
])
def test_a_tokenizer_config_that_cannot_be_read_is_refused_by_its_path(tmp_path, text, why):
    (tmp_path / "tokenizer_config.json").write_text(text)
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(tmp_path)
    assert str(refused.value) == f"{tmp_path / 'tokenizer_config.json'} {why}"
