"""The n-gram (prompt lookup) proposer, called directly on small token buffers.

Contract: for each row, take the committed tokens t[:c]; for n from max_n down to min_n, find the
EARLIEST start s with t[s:s+n] == t[c-n:c] and s + n < c (the match and the token after it are
committed). The first n that matches wins; the drafts are the (up to k) committed tokens that
followed it, t[s+n : min(c, s+n+k)], then PAD_ID. Tokens past c in the buffer are stale and never
matched or proposed."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.proposers import NgramProposer, ProposeInput
from engine.sampling import SamplingTensors
from engine.tokenizer import PAD_ID
from helpers.strategies import examples


def propose(rows: list[list[int]], committed: list[int], k: int, **sizes):
    tokens = torch.tensor(rows, dtype=torch.long)
    r = len(rows)
    inp = ProposeInput(token_ids=tokens, num_committed=torch.tensor(committed, dtype=torch.long),
                       sampling=SamplingTensors(temperature=torch.zeros(r), top_k=torch.zeros(r, dtype=torch.long),
                                                top_p=torch.ones(r), keys=torch.zeros(r, dtype=torch.long)),
                       slots=torch.arange(r), block_tables=torch.zeros(r, 1, dtype=torch.long))
    drafts, num_draft, q = NgramProposer(k, **sizes).propose(inp)
    assert q is None, "n-gram drafts are one-hot: no q"
    assert drafts.shape == (r, k) and drafts.dtype == torch.long
    return drafts.tolist(), num_draft.tolist()


def reference(row: list[int], c: int, k: int, min_n: int = 1, max_n: int = 3) -> tuple[list[int], int]:
    for n in range(max_n, min_n - 1, -1):
        suffix = row[c - n:c]
        starts = [s for s in range(0, c - n) if row[s:s + n] == suffix]
        if c >= n + 1 and starts:
            follow = row[starts[0] + n:c][:k]
            return follow + [PAD_ID] * (k - len(follow)), len(follow)
    return [PAD_ID] * k, 0


P = PAD_ID
CASES = [
    # id, row, committed, k, (max_n,), expected drafts, expected num_draft
    ("buffer_of_n_plus_1_tokens", [5, 5], 2, 3, {}, [5, P, P], 1),
    ("only_n_1_fits_buffer_of_two", [5, 5], 2, 1, {"max_n": 3}, [5], 1),
    ("match_ending_at_last_buffer_token", [1, 2, 1, 2], 4, 4, {}, [1, 2, P, P], 2),
    ("earliest_match_wins", [3, 4, 3, 4, 3], 5, 4, {}, [4, 3, P, P], 2),
    ("longest_n_wins_over_earlier_short_match", [2, 9, 1, 2, 5, 1, 2], 7, 3, {}, [5, 1, 2], 3),
    ("continuation_capped_at_k", [7, 8, 9, 10, 11, 7], 6, 2, {}, [8, 9], 2),
    ("stale_tokens_after_committed_ignored", [4, 5, 4, 5, 5, 5], 3, 3, {}, [5, 4, P], 2),
    ("no_match_proposes_nothing", [1, 2, 3, 4], 4, 2, {}, [P, P], 0),
    ("one_committed_token_proposes_nothing", [6, 6, 6], 1, 2, {}, [P, P], 0),
    ("k_zero", [5, 5, 5], 3, 0, {}, [], 0),
    ("one_size_only_skips_shorter_ngrams", [1, 2, 3, 1], 4, 2, {"min_n": 2, "max_n": 2}, [P, P], 0),
    ("unigrams_only", [1, 2, 3, 1], 4, 2, {"min_n": 1, "max_n": 1}, [2, 3], 2),
]


@pytest.mark.parametrize("row, committed, k, sizes, drafts, num_draft",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_proposes_what_followed_the_earliest_longest_match(row, committed, k, sizes, drafts, num_draft):
    assert propose([row], [committed], k, **sizes) == ([drafts], [num_draft])
    assert reference(row, committed, k, **sizes) == (drafts, num_draft)


def test_rows_of_a_batch_are_independent():
    rows = [[5, 5, 9, 9, 9, 9], [1, 2, 1, 2, 1, 2], [7, 8, 9, 1, 2, 3], [4, 4, 4, 4, 4, 4]]
    committed = [2, 6, 6, 3]
    got = propose(rows, committed, 3)
    want = [reference(r, c, 3) for r, c in zip(rows, committed)]
    assert got == ([d for d, _ in want], [n for _, n in want])
    assert got == ([[5, P, P], [1, 2, P], [P, P, P], [4, P, P]], [1, 2, 0, 1])


@pytest.mark.parametrize("min_n, max_n", [(0, 3), (-1, 2), (3, 2), (2, 1)])
def test_ngram_sizes_must_be_at_least_one_and_ordered(min_n, max_n):
    message = rf"^n-gram sizes must satisfy 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}$"
    with pytest.raises(ValueError, match=message):
        NgramProposer(2, min_n=min_n, max_n=max_n)


@st.composite
def buffers(draw):
    length = draw(st.integers(1, 12))
    row = draw(st.lists(st.integers(0, 3), min_size=length, max_size=length))
    return row, draw(st.integers(0, length)), draw(st.integers(0, 4))


@examples(60)
@given(buffers())
def test_matches_the_reference_lookup(case):
    row, committed, k = case
    drafts, num_draft = propose([row], [committed], k)
    assert (drafts[0], num_draft[0]) == reference(row, committed, k)
