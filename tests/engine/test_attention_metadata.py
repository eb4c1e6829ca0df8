"""Paged attention metadata and the attention over it, against hand-computed layouts and a
dense reference: causal within each request, bounded by its seq_len, padded queries harmless."""
import pytest
import torch
import torch.nn.functional as F

from engine.attention import build_attention_metadata, paged_attention


def metadata(positions, query_lens, seq_lens, block_tables, block_size, max_query_len, max_context_len):
    qsl = torch.nn.functional.pad(torch.tensor(query_lens).cumsum(0), (1, 0))
    return build_attention_metadata(torch.tensor(positions), qsl, torch.tensor(seq_lens),
                                    torch.tensor(block_tables), block_size, max_query_len, max_context_len)


def test_metadata_of_a_verify_row_and_a_decode_row():
    # Request 0 verifies at positions 4..6 (seq_len 7); request 1 decodes at position 2 (seq_len 3),
    # so its query has two padded places. Block size 4: blocks [3, 1] and [0, 2].
    m = metadata([4, 5, 6, 2], [3, 1], [7, 3], [[3, 1], [0, 2]], 4, 3, 8)
    assert m.slot_mapping.tolist() == [4, 5, 6, 2]
    assert m.context_slots.tolist() == [[12, 13, 14, 15, 4, 5, 6, 7], [0, 1, 2, 3, 8, 9, 10, 11]]
    assert m.query_req.tolist() == [0, 0, 0, 1] and m.query_offset.tolist() == [0, 1, 2, 0]
    assert m.max_query_len == 3
    key0 = [True] + [False] * 7
    assert m.attn_mask.tolist() == [
        [[[True] * 5 + [False] * 3, [True] * 6 + [False] * 2, [True] * 7 + [False]]],
        [[[True] * 3 + [False] * 5, key0, key0]],  # a padded query sees key 0 only
    ]


def reference_mask(positions, query_lens, seq_lens, max_query_len, max_context_len):
    mask = torch.zeros(len(query_lens), 1, max_query_len, max_context_len, dtype=torch.bool)
    start = 0
    for r, (n, seq_len) in enumerate(zip(query_lens, seq_lens)):
        for q in range(max_query_len):
            for j in range(max_context_len):
                if q < n:
                    mask[r, 0, q, j] = j <= positions[start + q] and j < seq_len
                else:
                    mask[r, 0, q, j] = j == 0
        start += n
    return mask


@pytest.mark.parametrize("positions, query_lens, seq_lens, max_query_len, max_context_len", [
    ([0, 1, 2], [3], [3], 3, 4),                # a prefill, with an upper-bound context length
    ([0, 1, 2, 5], [3, 1], [3, 6], 4, 8),       # prefill and decode, both padded
    ([2, 3, 4, 0], [3, 1], [3, 1], 3, 8),       # keys past seq_len stay hidden from later queries
    ([6, 0, 1], [1, 2], [4, 0], 2, 8),          # an empty context hides every key, key 0 included
], ids=["prefill", "mixed", "seq-len-bound", "empty-context"])
def test_attention_mask_is_causal_and_bounded_by_seq_len(positions, query_lens, seq_lens, max_query_len,
                                                         max_context_len):
    tables = [[r, len(query_lens) + r] for r in range(len(query_lens))]
    m = metadata(positions, query_lens, seq_lens, tables, 4, max_query_len, max_context_len)
    assert torch.equal(m.attn_mask, reference_mask(positions, query_lens, seq_lens, max_query_len,
                                                   max_context_len))


@pytest.mark.parametrize("heads, kv_heads, head_dim, lens, max_context_len", [
    (2, 2, 4, [3, 5], 6),   # plain multi-head
    (4, 2, 8, [3, 4], 4),   # grouped-query, context length equal to the head count
    (4, 2, 2, [3, 5], 6),   # grouped-query, head_dim equal to the kv head count
    (4, 2, 4, [3, 5], 6),   # grouped-query, head_dim equal to the query head count
    (6, 3, 4, [2, 6], 6),
], ids=["mha", "gqa-ctx-eq-heads", "gqa-dim-eq-kv-heads", "gqa-dim-eq-heads", "gqa-3"])
def test_paged_attention_equals_dense_causal_attention(heads, kv_heads, head_dim, lens, max_context_len):
    """Prefill every request but its last token, then decode that token from the cache: each
    output row equals dense causal attention over the request alone."""
    gen = torch.Generator().manual_seed(0)
    block_size = 2
    tables = [[2 * r + 1, 2 * r, 8 + r] for r in range(len(lens))]  # scattered, not in order
    cache = torch.zeros(2, 12 * block_size, kv_heads, head_dim)
    qkv = [[torch.randn(n, h, head_dim, generator=gen) for h in (heads, kv_heads, kv_heads)] for n in lens]

    def run(parts, positions, query_lens, seq_lens):
        m = metadata(positions, query_lens, seq_lens, tables, block_size, max(query_lens), max_context_len)
        return paged_attention(*(torch.cat(t) for t in zip(*parts)), cache, m)

    prefill = run([[t[:n - 1] for t in x] for x, n in zip(qkv, lens)], [p for n in lens for p in range(n - 1)],
                  [n - 1 for n in lens], [n - 1 for n in lens])
    decode = run([[t[n - 1:] for t in x] for x, n in zip(qkv, lens)], [n - 1 for n in lens], [1] * len(lens), lens)
    start = 0
    for r, (n, (q, k, v)) in enumerate(zip(lens, qkv)):
        dense = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                               is_causal=True, enable_gqa=heads != kv_heads).transpose(0, 1)
        assert torch.allclose(prefill[start:start + n - 1], dense[:n - 1], atol=1e-5)
        assert torch.allclose(decode[r], dense[n - 1], atol=1e-5)
        start += n - 1
