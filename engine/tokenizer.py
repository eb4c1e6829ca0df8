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
# tokenizer_class values whose encoding transformers takes from tokenizer.json as it stands.
TOKENIZER_CLASSES = (None, "PreTrainedTokenizerFast", "TokenizersBackend", "LlamaTokenizerFast", "LlamaTokenizer")


class HFTokenizer:
    """A folder's tokenizer.json through Hugging Face's `tokenizers`, encoded as transformers 5
    encodes it: tokenizer.json's own post-processor adds BOS/EOS (or nothing, without one), and
    tokenizer_config.json's add_bos_token / add_eos_token are ignored, since transformers drops
    them whenever a tokenizer.json is present (tests/engine/test_tokenizer_hf.py compares every case with
    AutoTokenizer). decode drops special tokens."""

    def __init__(self, folder: str | os.PathLike):
        from tokenizers import Tokenizer
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
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """add_bos=False: the bare text, without the special tokens the post-processor adds."""
        return self._tok.encode(text, add_special_tokens=add_bos).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def load_tokenizer(folder: str | os.PathLike) -> "ByteTokenizer | HFTokenizer":
    """The folder's own tokenizer when it has tokenizer.json, else the byte tokenizer."""
    if (Path(folder) / TOKENIZER_FILE).is_file():
        return HFTokenizer(folder)
    return ByteTokenizer()
