"""Grouped-query attention of decode and verify queries over the paged KV cache, in Triton.

The "paged" attention backend (EngineConfig.attention_backend). sdpa's read gathers each request's
context into a dense copy, builds a mask and runs SDPA's math kernel, which expands every key head
to its query heads: about ten kernels a layer, and some 20 bytes moved per byte of context. Here
one program handles one request, one key head and one split of the context: it loads the
request's queries of all the head's query heads at once (rows = query x head in the group), walks
the block table to read each key and value once, where it lies in the cache, and keeps an online
softmax (flash-decoding). With one split it writes the output itself; with several (long
contexts, few requests) a second kernel merges the splits' partial results.

Only short queries take this path (decode and verify: at most MAX_ROWS query rows per key head);
a step holding a prefill takes sdpa's (engine/attention.py decides, on the host sizes).
On the CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1, as the tests do).
"""
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MAX_ROWS = 128        # query rows (queries x query heads per key head) one program holds
BLOCK_N = 64          # keys per tile
TARGET_PROGRAMS = 1024  # split the context until requests x key heads x splits reaches this


@dataclass(frozen=True)
class PagedSizes:
    """The host sizes a paged read is launched with, fixed per graph bucket."""
    block_m: int      # query rows per program, a power of two of at least 16 (tl.dot's minimum)
    num_splits: int
    split_len: int    # keys per split, a multiple of BLOCK_N
    block_size: int   # the cache's

    def bind(self, block_tables: torch.Tensor, query_start_loc: torch.Tensor, positions: torch.Tensor,
             seq_lens: torch.Tensor) -> "PagedRead":
        return PagedRead(block_tables, query_start_loc, positions, seq_lens, self)


@dataclass(frozen=True)
class PagedRead:
    """One step's paged read: called with the queries [T, H, D] and a layer's cache."""
    block_tables: torch.Tensor     # [R, W]
    query_start_loc: torch.Tensor  # [R + 1]
    positions: torch.Tensor        # [T]: query t attends key positions 0..positions[t] of its request
    seq_lens: torch.Tensor         # [R]
    sizes: PagedSizes

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return paged_read(q, kv_cache, self.block_tables, self.query_start_loc, self.positions, self.seq_lens,
                          self.sizes)


def paged_sizes(num_reqs: int, num_kv_heads: int, group: int, max_query_len: int, max_context_len: int,
                block_size: int) -> PagedSizes:
    block_m = max(16, triton.next_power_of_2(max_query_len * group))
    tiles = max(1, math.ceil(max_context_len / BLOCK_N))
    num_splits = min(tiles, max(1, math.ceil(TARGET_PROGRAMS / (num_reqs * num_kv_heads))))
    split_len = math.ceil(tiles / num_splits) * BLOCK_N
    return PagedSizes(block_m, math.ceil(tiles * BLOCK_N / split_len), split_len, block_size)


def head_pad(head_dim: int) -> int:
    """The head dimension the kernels compute in: a power of two, at least tl.dot's 16."""
    return max(16, triton.next_power_of_2(head_dim))


def fits(max_query_len: int, group: int) -> bool:
    """Whether a step's queries fit one program's rows (decode and verify steps do)."""
    return max_query_len * group <= MAX_ROWS


@triton.jit
def _split_attention(q_ptr, k_ptr, v_ptr, out_ptr, acc_ptr, ml_ptr, block_tables_ptr, query_start_ptr,
                     positions_ptr, seq_lens_ptr, stride_qt, stride_qh, stride_slot, stride_kvh, stride_bt,
                     num_tokens, num_heads, scale, block_size, split_len,
                     GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, ONE_SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    req, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_ptr + req)
    q_len = tl.load(query_start_ptr + req + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + req)
    rows = tl.arange(0, BLOCK_M)
    token = q_start + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_ok = rows // GROUP < q_len
    dims = tl.arange(0, HEAD_PAD)  # a head dimension that is not a power of two is padded, masked
    dim_ok = dims < HEAD_DIM
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    query_pos = tl.load(positions_ptr + token, mask=row_ok, other=-1)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], tl.float32)
    key_end = tl.minimum(split * split_len + split_len, seq_len)
    for start in range(split * split_len, key_end, BLOCK_N):
        key_pos = start + tl.arange(0, BLOCK_N)
        key_ok = key_pos < key_end
        block = tl.load(block_tables_ptr + req * stride_bt + key_pos // block_size, mask=key_ok, other=0)
        slot = (block.to(tl.int64) * block_size + key_pos % block_size)[:, None] * stride_slot
        offsets = slot + kv_head * stride_kvh + dims[None, :]
        k = tl.load(k_ptr + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        v = tl.load(v_ptr + offsets, mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        scores = tl.where(key_ok[None, :] & (key_pos[None, :] <= query_pos[:, None]), scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: nothing to rescale
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    if ONE_SPLIT:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # rows past the queries have no key
        tl.store(out_ptr + token[:, None] * (num_heads * HEAD_DIM) + head[:, None] * HEAD_DIM + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    else:  # partial results: [splits, T, H, D] unnormalised, and [splits, 2, T, H] max and sum
        row = (split * num_tokens + token) * num_heads + head
        tl.store(acc_ptr + row[:, None] * HEAD_DIM + dims[None, :], acc, mask=row_ok[:, None] & dim_ok[None, :])
        ml_row = (split * 2 * num_tokens + token) * num_heads + head
        tl.store(ml_ptr + ml_row, m_i, mask=row_ok)
        tl.store(ml_ptr + ml_row + num_tokens * num_heads, l_i, mask=row_ok)


@triton.jit
def _merge_attention_splits(out_ptr, acc_ptr, ml_ptr, num_tokens, num_heads, num_splits,
                  HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, SPLITS: tl.constexpr):
    token, head = tl.program_id(0), tl.program_id(1)
    splits = tl.arange(0, SPLITS)
    split_ok = splits < num_splits
    ml_row = (splits * 2 * num_tokens + token) * num_heads + head
    m = tl.load(ml_ptr + ml_row, mask=split_ok, other=float("-inf"))
    l_s = tl.load(ml_ptr + ml_row + num_tokens * num_heads, mask=split_ok, other=0.0)
    m_max = tl.max(m, 0)  # finite: split 0 holds key 0, which every query sees
    weight = tl.where(split_ok & (m > float("-inf")), tl.exp(m - m_max), 0.0)
    dims = tl.arange(0, HEAD_PAD)
    dim_ok = dims < HEAD_DIM
    acc_row = (splits * num_tokens + token) * num_heads + head
    acc = tl.load(acc_ptr + acc_row[:, None] * HEAD_DIM + dims[None, :], mask=split_ok[:, None] & dim_ok[None, :],
                  other=0.0)
    out = tl.sum(acc * weight[:, None], 0) / tl.sum(l_s * weight, 0)
    tl.store(out_ptr + (token * num_heads + head) * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty), mask=dim_ok)


def paged_read(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, query_start_loc: torch.Tensor,
               positions: torch.Tensor, seq_lens: torch.Tensor, sizes: PagedSizes) -> torch.Tensor:
    """q: [T, H, D] (the step's queries, their own keys already written); kv_cache [2, slots, Hkv, D].
    Returns [T, H, D]: query t attends key positions 0..positions[t] of its request."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = kv_cache.shape[2]
    keys, values = kv_cache[0], kv_cache[1]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    one_split = sizes.num_splits == 1
    acc = q.new_empty(0 if one_split else sizes.num_splits * num_tokens * num_heads * head_dim, dtype=torch.float32)
    ml = q.new_empty(0 if one_split else sizes.num_splits * 2 * num_tokens * num_heads, dtype=torch.float32)
    grid = (block_tables.shape[0], num_kv_heads, sizes.num_splits)
    _split_attention[grid](
        q, keys, values, out, acc, ml, block_tables, query_start_loc, positions, seq_lens,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), block_tables.stride(0),
        num_tokens, num_heads, head_dim ** -0.5, sizes.block_size, sizes.split_len,
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, HEAD_PAD=head_pad(head_dim), BLOCK_M=sizes.block_m,
        BLOCK_N=BLOCK_N, ONE_SPLIT=one_split, PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    if not one_split:
        _merge_attention_splits[(num_tokens, num_heads)](
            out, acc, ml, num_tokens, num_heads, sizes.num_splits, HEAD_DIM=head_dim, HEAD_PAD=head_pad(head_dim),
            SPLITS=triton.next_power_of_2(sizes.num_splits))
    return out
