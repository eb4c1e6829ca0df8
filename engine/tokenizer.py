"""Byte-level tokenizer: ids 0..255 are bytes, then four special ids.

Nothing to download: every string has exactly one encoding, and decode(encode(s)) == s.
"""
from dataclasses import dataclass

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
