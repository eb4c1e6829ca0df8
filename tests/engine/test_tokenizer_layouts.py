"""Tokenizer layouts as checkpoints ship them, against transformers' AutoTokenizer (issue 35):
the Llama 2 layout with `legacy` and `add_prefix_space` either way, a tokenizer.json's
`truncation` and `padding` sections (transformers' encode ignores them), and what is refused
with one line: a folder without tokenizer.json (never bytes by default), split_special_tokens,
and a token tokenizer_config.json names that tokenizer.json lacks."""
import json
import shutil

import pytest

from engine.errors import ModelLoadError
from engine.tokenizer import BYTE_TOKENIZER_CLASS, ByteTokenizer, HFTokenizer, load_tokenizer
from gates.hf_folders import TEXTS, TOKENIZER_LAYOUTS, write_tokenizer
from helpers.tokenizers import assert_same_as_transformers

pytestmark = pytest.mark.xdist_group("hf-folders")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("layout", TOKENIZER_LAYOUTS)
def test_each_layout_encodes_and_decodes_as_transformers(tmp_path, layout):
    assert_same_as_transformers(write_tokenizer(tmp_path, layout), TEXTS)


@pytest.mark.parametrize("layout", ["llama3", "llama2"])
def test_truncation_and_padding_in_tokenizer_json_are_ignored_as_transformers_ignores_them(tmp_path, layout):
    folder = write_tokenizer(tmp_path, layout)
    raw = json.loads((folder / "tokenizer.json").read_text())
    raw["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    raw["padding"] = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None,
                      "pad_id": 2, "pad_type_id": 0, "pad_token": "</s>" if layout == "llama2" else "<|eot_id|>"}
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    long_text = "the quick brown fox jumps over the lazy dog " * 4
    assert len(load_tokenizer(folder).encode(long_text)) > 8
    assert len(load_tokenizer(folder).encode("hi")) < 8
    assert_same_as_transformers(folder, TEXTS)


def test_a_folder_without_tokenizer_json_is_refused_and_bytes_are_chosen_only_by_name(tmp_path):
    (tmp_path / "vocab.json").write_text("{}")
    (tmp_path / "merges.txt").write_text("")
    with pytest.raises(ModelLoadError, match=r"has no tokenizer\.json \(it has merges\.txt, vocab\.json\); "
                                             r"specgate reads only tokenizer\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    with pytest.raises(ModelLoadError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path)
    # a SentencePiece-only folder (Llama 2's tokenizer.model) is named as such
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a")
    with pytest.raises(ModelLoadError, match=r"\(it has merges\.txt, tokenizer\.model, vocab\.json\)"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": BYTE_TOKENIZER_CLASS}))
    assert isinstance(load_tokenizer(tmp_path), ByteTokenizer)


def test_a_folder_with_no_tokenizer_file_at_all_is_refused_with_the_one_line_alone(tmp_path):
    """A weights-only folder: the refusal names no file the folder has, and says how to save one."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(tmp_path)
    assert str(refused.value) == (f"{tmp_path} has no tokenizer.json; specgate reads only tokenizer.json: save one "
                                  f"with transformers' AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")


def test_the_fixture_target_names_the_byte_tokenizer(target_dir):
    assert isinstance(load_tokenizer(target_dir), ByteTokenizer)


def test_split_special_tokens_is_refused(tmp_path):
    folder = write_tokenizer(tmp_path, "llama3")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "split_special_tokens": True}))
    with pytest.raises(ModelLoadError, match="split_special_tokens=true .* is not supported: remove the key"):
        HFTokenizer(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "split_special_tokens": False}))
    assert_same_as_transformers(folder, TEXTS)


@pytest.mark.parametrize("key, value, named", [
    ("extra_special_tokens", ["<|new|>"], "'<|new|>'"),
    ("extra_special_tokens", {"image_token": "<|new|>"}, "'<|new|>'"),  # transformers 5's named form
    ("additional_special_tokens", ["<|new|>"], "'<|new|>'"),  # the older name, read without extra_special_tokens
    ("added_tokens_decoder", {"401": {"content": "<|new|>", "special": True}}, "'<|new|>' at id 401"),
    ("added_tokens_decoder", {"5": {"content": "<|begin_of_text|>", "special": True}},  # tokenizer.json: id 0
     "'<|begin_of_text|>' at id 5"),
    ("pad_token", "<|pad|>", "'<|pad|>'"),
])
def test_a_token_tokenizer_config_names_that_tokenizer_json_lacks_is_refused(tmp_path, key, value, named):
    """transformers would add it (a new id, and text containing it encodes differently)."""
    folder = write_tokenizer(tmp_path, "llama3")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, key: value}))
    with pytest.raises(ModelLoadError) as refused:
        HFTokenizer(folder)
    at = named[named.index(" at id"):] if " at id" in named else ""
    assert str(refused.value) == (
        f"{folder / 'tokenizer_config.json'} names the token {named}, which tokenizer.json does not hold as an "
        f"added token{at}; transformers would add it, specgate does not: add it to tokenizer.json's added_tokens "
        f"(tokenizers' Tokenizer.add_special_tokens)")


def test_tokens_tokenizer_json_holds_may_be_named_again(tmp_path):
    folder = write_tokenizer(tmp_path / "t", "llama3")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        **cfg, "extra_special_tokens": ["<|eot_id|>"],
        "added_tokens_decoder": {"0": {"content": "<|begin_of_text|>", "special": True}}}))
    assert_same_as_transformers(folder, TEXTS)
    shutil.rmtree(folder)
