"""A folder's tokenizer encodes and decodes as transformers' AutoTokenizer (the pinned 5.24) does,
for both kinds of tokenizer.json a Llama folder ships (byte-level BPE as in Llama 3, a Metaspace
BPE with byte fallback as in Llama 2), every tokenizer_class we accept, tokenizer_config.json's
add_bos_token / add_eos_token set either way or absent (transformers ignores them beside a
tokenizer.json), special tokens written as strings or as AddedToken objects, and a tokenizer.json
without a post-processor. A tokenizer_config.json we cannot read is refused by name."""
import json
import shutil
import sysconfig
from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.tokenizer import TOKENIZER_CLASSES, HFTokenizer, load_tokenizer
from helpers.tokenizers import assert_same_as_transformers

pytestmark = pytest.mark.xdist_group("hf-folders")
transformers = pytest.importorskip("transformers")

TEXTS = ["def main(", "", "x = 1\n\tprint('é→🐍')", "<|begin_of_text|>twice<s>"]
SENTENCEPIECE_SPECIALS = ("<unk>", "<s>", "</s>")
FLAGS = [{}, {"add_bos_token": False}, {"add_bos_token": True, "add_eos_token": True}, {"add_eos_token": True}]


def added_token(content: str) -> dict:
    """A special token as transformers saves it in tokenizer_config.json."""
    return {"__type": "AddedToken", "content": content, "lstrip": False, "rstrip": False, "normalized": False,
            "single_word": False, "special": True}


@pytest.fixture(scope="module")
def metaspace_dir(tmp_path_factory) -> Path:
    """A Llama 2-style tokenizer.json: "▁" for spaces, bytes as <0xNN> fallbacks, <s> prepended."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=list(SENTENCEPIECE_SPECIALS), show_progress=False)
    tok.train_from_iterator([(stdlib / "textwrap.py").read_text()], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s>:0 $A:0", special_tokens=[("<s>", 1)])
    # As in Llama 2, the 256 byte tokens follow the three specials, so no text is unknown.
    raw = json.loads(tok.to_str())
    learned = [t for t, _ in sorted(raw["model"]["vocab"].items(), key=lambda kv: kv[1])
               if t not in SENTENCEPIECE_SPECIALS]
    vocab = [*SENTENCEPIECE_SPECIALS, *(f"<0x{i:02X}>" for i in range(256)), *learned]
    raw["model"]["vocab"] = {t: i for i, t in enumerate(vocab)}
    folder = tmp_path_factory.mktemp("metaspace")
    (folder / "tokenizer.json").write_text(json.dumps(raw))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizerFast",
                                                              "bos_token": "<s>", "eos_token": "</s>"}))
    return folder


def variant(base: Path, folder: Path, changes: dict, drop=(), post_processor: bool = True) -> Path:
    shutil.copytree(base, folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    for key in drop:
        cfg.pop(key)
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, **changes}))
    if not post_processor:
        raw = json.loads((folder / "tokenizer.json").read_text())
        (folder / "tokenizer.json").write_text(json.dumps({**raw, "post_processor": None}))
    return folder


@pytest.mark.parametrize("flags", FLAGS, ids=["no-flags", "bos-off", "bos-eos-on", "eos-on"])
@pytest.mark.parametrize("kind", ["byte-level", "metaspace"])
def test_bos_and_eos_come_from_tokenizer_json_whatever_tokenizer_config_says(
        hf_tokenizer_dir, metaspace_dir, tmp_path, kind, flags):
    base = hf_tokenizer_dir if kind == "byte-level" else metaspace_dir
    for i, post_processor in enumerate((True, False)):
        assert_same_as_transformers(variant(base, tmp_path / str(i), flags, post_processor=post_processor), TEXTS)


def test_every_accepted_class_and_either_spelling_of_a_special_token_encodes_alike(hf_tokenizer_dir, tmp_path):
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    for i, cls in enumerate(TOKENIZER_CLASSES):
        changes = {"bos_token": added_token(bos), "eos_token": added_token(eos)} if i % 2 else {}
        drop = ("tokenizer_class",) if cls is None else ()
        assert_same_as_transformers(variant(hf_tokenizer_dir, tmp_path / str(i), {
            **({"tokenizer_class": cls} if cls else {}), **changes}, drop=drop), TEXTS)


@pytest.mark.parametrize("config, message", [
    ("[1, 2]", r"tokenizer_config\.json must hold a JSON object"),
    ('{"tokenizer_class": "Qwen2Tokenizer"}',
     r"tokenizer_class='Qwen2Tokenizer' is not supported \(supported: PreTrainedTokenizerFast, "
     r"TokenizersBackend, LlamaTokenizerFast, LlamaTokenizer\)"),
    ("{not json", r"tokenizer\.json / tokenizer_config\.json cannot be read"),
])
def test_a_tokenizer_config_we_cannot_follow_is_refused_by_name(hf_tokenizer_dir, tmp_path, config, message):
    folder = variant(hf_tokenizer_dir, tmp_path / "bad", {})
    (folder / "tokenizer_config.json").write_text(config)
    with pytest.raises(ModelLoadError, match=message):
        HFTokenizer(folder)
    (folder / "tokenizer_config.json").unlink()  # no tokenizer_config.json: tokenizer.json alone decides
    assert_same_as_transformers(folder, TEXTS)


def test_the_vocabulary_counts_the_tokens_added_to_tokenizer_json(hf_tokenizer_dir, tmp_path):
    """An added token (as `tokenizer.add_tokens` saves it) is an id the model may emit: the size
    the engine checks against the model's vocab_size counts it."""
    from tokenizers import Tokenizer
    folder = tmp_path / "added"
    shutil.copytree(hf_tokenizer_dir, folder)
    base = HFTokenizer(folder).vocab_size
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tok.add_tokens(["<|specgate-extra|>"]) == 1
    tok.save(str(folder / "tokenizer.json"))
    assert HFTokenizer(folder).vocab_size == base + 1


def test_a_bpe_dropout_in_tokenizer_json_is_dropped_as_transformers_drops_it(metaspace_dir, tmp_path):
    """transformers 5 rebuilds a Llama tokenizer's BPE model from its vocabulary and merges, without
    the file's dropout, so encoding stays deterministic; specgate's pipeline must too."""
    folder = variant(metaspace_dir, tmp_path / "dropout", {})
    raw = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**raw, "model": {**raw["model"], "dropout": 0.5}}))
    text = "the textwrap module provides some convenience functions " * 4
    assert len({tuple(load_tokenizer(folder).encode(text)) for _ in range(20)}) == 1
    assert_same_as_transformers(folder, TEXTS)
