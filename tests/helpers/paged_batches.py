"""Random paged batches for the attention backends' tests: several requests of mixed query and
context lengths flattened into one step, their blocks drawn at random from a shuffled pool."""
import torch
from hypothesis import strategies as st

BLOCK, NUM_BLOCKS, HEAD_DIM = 4, 64, 8


def paged_batch(rows, heads, kv_heads, seed, block=BLOCK, num_blocks=NUM_BLOCKS, dtype=torch.float32,
                device="cpu", head_dim=None, full_table=False):
    """rows: (query_len, seq_len) per request; the query is the last query_len positions.
    Returns the flattened q, k, v, a random cache (block num_blocks is the sink) and the
    metadata inputs, with each request's blocks drawn at random from a shuffled pool.
    full_table: the tables are exactly as wide as the longest request's blocks (it is at its
    context limit), and that request holds block 0."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-seq_len // block) for _, seq_len in rows) + (0 if full_table else 1)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    longest = max(range(len(rows)), key=lambda i: rows[i][1])
    tables, positions, query_lens, seq_lens = [], [], [], []
    for i, (query_len, seq_len) in enumerate(rows):
        owned = [pool.pop() for _ in range(-(-seq_len // block))]
        if full_table and i == longest and 0 not in owned:
            swap = next(table for table in tables if 0 in table) if 0 not in pool else pool
            swap[swap.index(0)], owned[-1] = owned[-1], 0
        tables.append(owned + [num_blocks] * (width - len(owned)))
        positions += range(seq_len - query_len, seq_len)
        query_lens.append(query_len)
        seq_lens.append(seq_len)
    num_tokens = len(positions)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    d = head_dim or HEAD_DIM
    cache = rand(2, (num_blocks + 1) * block, kv_heads, d)
    q, k, v = rand(num_tokens, heads, d), rand(num_tokens, kv_heads, d), rand(num_tokens, kv_heads, d)

    def t(x):
        return torch.tensor(x, device=device)

    inputs = dict(positions=t(positions), query_start_loc=t([0] + torch.tensor(query_lens).cumsum(0).tolist()),
                  seq_lens=t(seq_lens), block_tables=t(tables), block_size=block,
                  max_query_len=max(query_lens), max_context_len=width * block)
    return q, k, v, cache, inputs


def ragged_rows(max_query_len: int, max_past: int, min_size: int = 1, max_size: int = 5):
    """Hypothesis: (query_len, seq_len) per request, each query the last query_len of its context."""
    row = st.tuples(st.integers(1, max_query_len), st.integers(0, max_past)).map(lambda t: (t[0], t[0] + t[1]))
    return st.lists(row, min_size=min_size, max_size=max_size)
