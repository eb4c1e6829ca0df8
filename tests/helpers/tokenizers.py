"""A folder's tokenizer against transformers' AutoTokenizer, the independent reference: the
vocabulary size, and for each text the ids with and without special tokens and the decoded text."""
from pathlib import Path

from engine.tokenizer import HFTokenizer, load_tokenizer


def assert_same_as_transformers(folder: Path, texts) -> None:
    import transformers
    theirs, ours = transformers.AutoTokenizer.from_pretrained(folder), load_tokenizer(folder)
    assert isinstance(ours, HFTokenizer) and ours.vocab_size == len(theirs)
    for text in texts:
        ids = theirs.encode(text)
        assert ours.encode(text) == ids, text
        assert ours.encode(text, add_bos=False) == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
