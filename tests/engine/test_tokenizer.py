"""The byte tokenizer: every string round-trips, BOS leads, special ids vanish in decode."""
import json

from hypothesis import given
from hypothesis import strategies as st

from engine.tokenizer import BOS_ID, EOS_ID, MASK_ID, NUM_BYTES, PAD_ID, VOCAB_SIZE, ByteTokenizer

tok = ByteTokenizer()
SPECIALS = [BOS_ID, EOS_ID, PAD_ID, MASK_ID]


@given(text=st.text())
def test_decode_encode_round_trip(text):
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, add_bos=False)) == text


@given(text=st.text())
def test_encode_is_bos_then_utf8_bytes(text):
    ids = tok.encode(text)
    assert ids[0] == BOS_ID
    assert bytes(ids[1:]) == text.encode("utf-8")
    assert tok.encode(text, add_bos=False) == ids[1:]
    assert all(0 <= i < NUM_BYTES for i in ids[1:])


@given(text=st.text(), data=st.data())
def test_special_ids_are_dropped_in_decode(text, data):
    ids = tok.encode(text)
    for _ in range(data.draw(st.integers(1, 6))):
        ids.insert(data.draw(st.integers(0, len(ids))), data.draw(st.sampled_from(SPECIALS)))
    assert tok.decode(ids) == text


@given(raw=st.binary())
def test_decode_of_any_bytes_matches_utf8_with_replacement(raw):
    assert tok.decode(list(raw)) == raw.decode("utf-8", errors="replace")


def test_ids_agree_with_the_fixture_config(target_dir):
    config = json.loads((target_dir / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (BOS_ID, EOS_ID, PAD_ID)
    assert config["vocab_size"] == VOCAB_SIZE == tok.vocab_size == NUM_BYTES + len(SPECIALS)
    assert len(set(SPECIALS)) == 4 and min(SPECIALS) == NUM_BYTES


def test_multibyte_characters():
    assert tok.encode("é→🐍") == [BOS_ID, 0xC3, 0xA9, 0xE2, 0x86, 0x92, 0xF0, 0x9F, 0x90, 0x8D]
    assert tok.encode("") == [BOS_ID]
    assert tok.decode([]) == ""
