"""Tokenizers. The byte-level one: ids 0..255 are bytes, then four special ids.

Nothing to download: every string has exactly one encoding, and decode(encode(s)) == s.
A model folder with its own tokenizer.json is read by HFTokenizer instead (load_tokenizer).
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
# tokenizer_class values whose encoding is tokenizer.json's, adjusted only by add_bos_token /
# add_eos_token; the Llama classes default add_bos_token to true.
TOKENIZER_CLASSES = {None: False, "PreTrainedTokenizerFast": False, "TokenizersBackend": False,
                     "LlamaTokenizerFast": True, "LlamaTokenizer": True}


class HFTokenizer:
    """A folder's tokenizer.json through Hugging Face's `tokenizers`, with BOS/EOS handling as
    transformers applies tokenizer_config.json: an explicit add_bos_token / add_eos_token (or a
    tokenizer.json without a post-processor) replaces the post-processor by BOS? text EOS?;
    otherwise tokenizer.json's own post-processor decides. decode drops special tokens."""

    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer, processors
        folder = Path(folder)
        cfg_path = folder / TOKENIZER_CONFIG_FILE
        try:
            self._tok = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
            cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        except Exception as e:  # tokenizers raises its own exception types for a bad file
            raise ModelLoadError(f"{folder}: tokenizer.json / tokenizer_config.json cannot be read: {e}") from None
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{cfg_path} must hold a JSON object")
        cls = cfg.get("tokenizer_class")
        if cls not in TOKENIZER_CLASSES:
            raise ModelLoadError(f"{cfg_path}: tokenizer_class={cls!r} is not supported "
                                 f"(supported: {', '.join(c for c in TOKENIZER_CLASSES if c)})")
        self.bos_token = _content(cfg.get("bos_token"))
        self.eos_token = _content(cfg.get("eos_token"))
        self.bos_id = self._id(self.bos_token, cfg_path)
        self.eos_id = self._id(self.eos_token, cfg_path)
        explicit = "add_bos_token" in cfg or "add_eos_token" in cfg
        if explicit or self._tok.post_processor is None or TOKENIZER_CLASSES[cls]:
            add_bos = cfg.get("add_bos_token", TOKENIZER_CLASSES[cls]) and self.bos_token is not None
            add_eos = cfg.get("add_eos_token", False) and self.eos_token is not None
            single = " ".join([f"{self.bos_token}:0"] * add_bos + ["$A:0"] + [f"{self.eos_token}:0"] * add_eos)
            special = [(self.bos_token, self.bos_id)] * add_bos + [(self.eos_token, self.eos_id)] * add_eos
            self._tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=special)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def _id(self, token: str | None, where) -> int | None:
        if token is None:
            return None
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise ModelLoadError(f"{where}: special token {token!r} is not in tokenizer.json's vocabulary")
        return token_id

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """add_bos=False: the bare text, without the special tokens the post-processor adds."""
        return self._tok.encode(text, add_special_tokens=add_bos).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def _content(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def load_tokenizer(folder: str | os.PathLike) -> "ByteTokenizer | HFTokenizer":
    """The folder's own tokenizer when it has tokenizer.json, else the byte tokenizer."""
    if (Path(folder) / TOKENIZER_FILE).is_file():
        return HFTokenizer(folder)
    return ByteTokenizer()
