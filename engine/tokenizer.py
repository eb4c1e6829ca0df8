"""Tokenizers. The byte-level one: ids 0..255 are bytes, then four special ids.

Nothing to download: every string has exactly one encoding, and decode(encode(s)) == s. A folder
uses it only when its tokenizer_config.json names it (BYTE_TOKENIZER_CLASS, as the fixtures do); a
folder with tokenizer.json is read by HFTokenizer (load_tokenizer), and one with neither is refused.
"""
import json
import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelLoadError

NUM_BYTES = 256
BOS_ID, EOS_ID, PAD_ID, MASK_ID = 256, 257, 258, 259
VOCAB_SIZE = 260


@dataclass(frozen=True)
class ByteTokenizer:
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID
    mask_id: int = MASK_ID
    vocab_size: int = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        """Bytes of the text; special ids are dropped, broken UTF-8 is replaced."""
        return bytes(i for i in ids if 0 <= i < NUM_BYTES).decode("utf-8", errors="replace")


TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# tokenizer_class values whose encoding transformers takes from tokenizer.json as it stands.
AS_STORED_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend")
# tokenizer_class values for which transformers rebuilds the pipeline around tokenizer.json's BPE
# vocabulary (transformers' models/llama/tokenization_llama.py): see llama_pipeline.
LLAMA_CLASSES = ("LlamaTokenizerFast", "LlamaTokenizer")
TOKENIZER_CLASSES = (*AS_STORED_CLASSES, *LLAMA_CLASSES)
# Marks a folder whose tokenizer is ByteTokenizer (the fixtures): tokenizer_config.json's class.
BYTE_TOKENIZER_CLASS = "SpecgateByteTokenizer"
# tokenizer_config.json keys naming special tokens, which transformers makes special tokens
NAMED_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class HFTokenizer:
    """A folder's tokenizer.json through Hugging Face's `tokenizers`, encoded as transformers 5
    encodes it: tokenizer.json's own post-processor adds BOS/EOS (or nothing, without one), and
    tokenizer_config.json's add_bos_token / add_eos_token are ignored, since transformers drops
    them whenever a tokenizer.json is present; its `truncation` and `padding` sections are off,
    as transformers' encode leaves them unless asked. For tokenizer_class LlamaTokenizer(Fast)
    over a tokenizer.json that is not byte-level, the pipeline is rebuilt as transformers
    rebuilds it (llama_pipeline: `legacy` and `add_prefix_space` decide the leading "▁"). What
    transformers would do by adding tokens is refused (check_special_tokens). decode drops
    special tokens. tests/engine/test_tokenizer_layouts.py, tests/engine/test_tokenizer_hf.py and the oracle
    gate compare every case with AutoTokenizer."""

    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer
        folder = Path(folder)
        cfg_path = folder / TOKENIZER_CONFIG_FILE
        try:
            text = (folder / TOKENIZER_FILE).read_text()
            raw = json.loads(text)
            cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        except Exception as e:  # a missing or broken file
            raise ModelLoadError(f"{folder}: tokenizer.json / tokenizer_config.json cannot be read: {e}") from None
        for path, value in ((cfg_path, cfg), (folder / TOKENIZER_FILE, raw)):
            if not isinstance(value, dict):
                raise ModelLoadError(f"{path} must hold a JSON object")
        cls = cfg.get("tokenizer_class")
        if cls not in TOKENIZER_CLASSES:
            raise ModelLoadError(f"{cfg_path}: tokenizer_class={cls!r} is not supported "
                                 f"(supported: {', '.join(c for c in TOKENIZER_CLASSES if c)})")
        if cfg.get("split_special_tokens"):
            raise ModelLoadError(f"{cfg_path}: split_special_tokens=true (special-token strings encoded as plain "
                                 f"text) is not supported: remove the key to encode them as special tokens")
        # AutoTokenizer's own test: a Llama class over a byte-level tokenizer.json (Llama 3 folders
        # that declare LlamaTokenizer) loads the file as stored.
        if cls in LLAMA_CLASSES and '"ByteLevel"' not in text:
            raw = llama_pipeline(raw, cfg, cfg_path)
        raw["truncation"] = raw["padding"] = None
        try:
            self._tok = Tokenizer.from_str(json.dumps(raw))
        except Exception as e:  # tokenizers raises its own exception types for a bad file
            raise ModelLoadError(f"{folder}: tokenizer.json / tokenizer_config.json cannot be read: {e}") from None
        check_special_tokens(self._tok, cfg, cfg_path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """add_bos=False: the bare text, without the special tokens the post-processor adds."""
        return self._tok.encode(text, add_special_tokens=add_bos).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def llama_pipeline(raw: dict, cfg: dict, where: Path) -> dict:
    """tokenizer.json as transformers 5's LlamaTokenizer rebuilds it: its BPE vocabulary, merges and
    post-processor kept; byte fallback on and no unk token (a character with neither a vocabulary
    entry nor byte tokens is dropped, as transformers drops it); no normalizer; a Metaspace pre-tokenizer that prepends
    "▁" to the first piece only (legacy false, the default), to every piece after a special token
    too (legacy true), or never (add_prefix_space false); the matching decoder."""
    model = raw.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelLoadError(f"{where}: tokenizer_class={cfg.get('tokenizer_class')!r} over a "
                             f"{model.get('type')!r} tokenizer.json is not supported (only BPE, as Llama 2 ships)")
    add_prefix_space = cfg.get("add_prefix_space")
    add_prefix_space = True if add_prefix_space is None else add_prefix_space
    scheme = ("always" if cfg.get("legacy", False) else "first") if add_prefix_space else "never"
    decoders = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}]
    if add_prefix_space:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {**raw, "normalizer": None,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False},
            "decoder": {"type": "Sequence", "decoders": decoders},
            "model": {**model, "byte_fallback": True, "fuse_unk": True, "dropout": None, "unk_token": None}}


def check_special_tokens(tok, cfg: dict, where: Path) -> None:
    """Every token tokenizer_config.json names (bos/eos/... , extra_special_tokens,
    added_tokens_decoder) must be one tokenizer.json already holds as an added token, at the same
    id: transformers would add the others (new ids, or text that now encodes differently), which
    specgate does not do."""
    added = {t.content: i for i, t in tok.get_added_tokens_decoder().items()}
    named = [cfg.get(key) for key in NAMED_SPECIAL_KEYS]
    extra = cfg.get("extra_special_tokens", cfg.get("additional_special_tokens")) or []
    named += list(extra.values() if isinstance(extra, dict) else extra)
    decoder = cfg.get("added_tokens_decoder") or {}
    named += [(int(i), t) for i, t in decoder.items()]
    for entry in named:
        index, token = entry if isinstance(entry, tuple) else (None, entry)
        content = token.get("content") if isinstance(token, dict) else token
        if content is None:
            continue
        if content not in added or index is not None and added[content] != index:
            at = f" at id {index}" if index is not None else ""
            raise ModelLoadError(f"{where} names the token {content!r}{at}, which tokenizer.json does not hold as "
                                 f"an added token{at}; transformers would add it, specgate does not: add it to "
                                 f"tokenizer.json's added_tokens (tokenizers' Tokenizer.add_special_tokens)")


def load_tokenizer(folder: str | os.PathLike) -> "ByteTokenizer | HFTokenizer":
    """The folder's tokenizer.json, or the byte tokenizer where tokenizer_config.json asks for it
    by class (the fixtures); a folder with neither is refused, never given bytes by default."""
    folder = Path(folder)
    cfg_path = folder / TOKENIZER_CONFIG_FILE
    if (folder / TOKENIZER_FILE).is_file():
        return HFTokenizer(folder)
    if cfg_path.is_file() and _tokenizer_class(cfg_path) == BYTE_TOKENIZER_CLASS:
        return ByteTokenizer()
    others = sorted(p.name for p in folder.glob("*") if p.name in ("tokenizer.model", "vocab.json", "merges.txt"))
    raise ModelLoadError(f"{folder} has no tokenizer.json{' (it has ' + ', '.join(others) + ')' if others else ''}; "
                         f"specgate reads only tokenizer.json: save one with transformers' "
                         f"AutoTokenizer.from_pretrained(folder).save_pretrained(folder)")


def _tokenizer_class(path: Path):
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(cfg, dict):  # a list or a number has no settings we could read: refused, not ignored
        raise ModelLoadError(f"{path} is not a JSON object (it holds a {type(cfg).__name__})")
    return cfg.get("tokenizer_class")
