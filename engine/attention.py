"""Attention over a paged KV cache for a flattened ragged batch, in plain PyTorch.

A step's tokens are flattened to [T]; request r owns rows query_start_loc[r]:query_start_loc[r+1].
Keys live in a paged cache addressed by slot = block_table[r, pos // block_size] * block_size +
pos % block_size, so a rejected draft needs no rollback: the next step overwrites its slot.
Queries are scattered into a padded [R, max_query_len] layout so one batched call serves every
request; no Python loop over requests.

Three backends (EngineConfig.attention_backend):
- "sdpa", the reference: gathers each request's context out of the cache into a dense
  [R, L, Hkv, D] copy (L: the step's context bucket) and runs SDPA under a boolean mask.
- "flex": FlexAttention reads K/V in place, the whole cache being one [1, Hkv, slots, D]
  sequence. A block mask built from the block tables lists, per request, the physical blocks
  to visit (kv_indices), and its mask_mod maps a physical slot back to the key position it
  holds (physical_to_logical) to apply causality and the sequence length. On CUDA the kernel
  is compiled (engine.attention.flex_kernels); the host never reads a device value.
- "paged": a Triton kernel (engine/paged_kernel.py) reads K/V in place through the block tables
  for decode and verify steps, each key once for all the query heads of its group; a step whose
  queries do not fit it (a prefill) takes sdpa's path.
"""
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from engine.compile_cache import inductor_cache_dir

if TYPE_CHECKING:  # the kernel's module imports Triton, which only the paged backend needs
    from engine.paged_kernel import PagedRead, PagedSizes

ATTENTION_BACKENDS = ("sdpa", "flex", "paged")
# SDPA has no fused kernel for grouped-query heads under a mask: with enable_gqa and a mask it
# falls back to the math kernel, which materialises [R, H, Q, L] scores in float32 (a 32k-token
# prefill of a 32-head model: about 137 GB, an out-of-memory at long prompts). A query longer than
# this gets its keys and values expanded to every query head instead, and the memory-efficient
# kernel reads them in tiles; a decode or verify query (a few rows) keeps the math kernel, whose
# scores are small, and reads its context once rather than once per query head.
GQA_MATH_MAX_QUERY = 64
FLEX_Q_BLOCK = 128  # query rows per block-mask row; a step's padded query fits one or a few


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor   # [T] cache slot each new token's K/V is written to
    context_slots: torch.Tensor | None  # [R, L] cache slot of key position j for request r (sdpa)
    query_req: torch.Tensor      # [T] request row of each token
    query_offset: torch.Tensor   # [T] index of each token inside its request's query
    attn_mask: torch.Tensor | None  # [R, 1, Q, L] True where the query may attend the key (sdpa)
    max_query_len: int
    block_mask: BlockMask | None = None  # flex: which cache blocks each request reads, and how
    flex: Callable | None = None         # flex: the kernel (compiled on CUDA)
    paged: "PagedRead | None" = None     # paged: the kernel's read, bound to this step's tables

    @property
    def num_reqs(self) -> int:
        if self.paged is not None:
            return self.paged.block_tables.shape[0]
        return (self.context_slots if self.block_mask is None else self.block_mask.kv_num_blocks).shape[0]


def context_slots(block_tables: torch.Tensor, key_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """[R, L]: the cache slot of key position key_pos[j] of request r (the slot formula above)."""
    return block_tables[:, key_pos // block_size] * block_size + key_pos % block_size


def build_attention_metadata(positions: torch.Tensor, query_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int,
                             max_query_len: int, max_context_len: int, flex: Callable | None = None,
                             num_cache_slots: int = 0, paged: "PagedSizes | None" = None) -> AttentionMetadata:
    """All inputs are device tensors; the two sizes are host integers (upper bounds are fine).
    With `flex` (the flex backend's kernel) the metadata is the block mask over a cache of
    num_cache_slots slots instead of a gather and a dense mask; with `paged` (the paged kernel's
    launch sizes) it is the block tables themselves."""
    device = positions.device
    num_tokens = positions.numel()
    num_reqs = query_start_loc.numel() - 1
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    query_req = torch.repeat_interleave(torch.arange(num_reqs, device=device), query_lens,
                                        output_size=num_tokens)
    query_offset = torch.arange(num_tokens, device=device) - query_start_loc[query_req]
    slot_mapping = (block_tables[query_req, positions // block_size] * block_size
                    + positions % block_size)
    if paged is not None:
        read = paged.bind(block_tables, query_start_loc, positions, seq_lens)
        return AttentionMetadata(slot_mapping, None, query_req, query_offset, None, max_query_len, paged=read)
    query_pos = torch.full((num_reqs, max_query_len), -1, dtype=positions.dtype, device=device)
    query_pos[query_req, query_offset] = positions
    if flex is not None:
        block_mask = paged_block_mask(query_pos, seq_lens, block_tables, block_size, num_cache_slots)
        return AttentionMetadata(slot_mapping, None, query_req, query_offset, None, max_query_len, block_mask, flex)
    key_pos = torch.arange(max_context_len, device=device)
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos < seq_lens[:, None])[:, None, :]
    # A padded query row sees key 0 only, so softmax has a finite input; its output is discarded.
    mask[:, :, 0] |= query_pos < 0
    return AttentionMetadata(slot_mapping, context_slots(block_tables, key_pos, block_size), query_req,
                             query_offset, mask[:, None], max_query_len)


@dataclass(frozen=True)
class FlexKernels:
    fixed_shapes: Callable  # graph-arm steps: one compiled kernel per bucket's shapes
    any_shapes: Callable    # eager steps: any batch and query length (dynamic shapes)


# Distinct specialisations a compiled function may hold: the graph arm's flex kernel compiles one
# per bucket shape (dynamic=False); sizes 0 and 1 specialise, and each model shape or dtype in one
# process is another. Past dynamo's default of 8 a fullgraph compile fails outright.
RECOMPILE_LIMIT = 64


def flex_kernels(device: str, block_size: int) -> FlexKernels:
    """The flex backend's kernels. On CUDA they are compiled (flex_attention unfused is slow and
    materialises the scores) before any graph capture: the runner warms a bucket up outside its
    graph. On the CPU the unfused reference implementation runs: correct, for tests only."""
    if not device.startswith("cuda"):
        return FlexKernels(_flex_reference, _flex_reference)
    # The kernel's key tile must divide the mask's key block (one cache block); 64 is its usual tile.
    # The main kernel serves every query length: the flex-decoding template inductor picks for
    # short queries at a power-of-two GQA ratio finds no valid config for this block mask (H200,
    # torch 2.11: NoValidChoicesError, on the 1B shape and in test_flex_kernel_replays_inside_a_cuda_graph).
    options = {"BLOCK_N": next(n for n in (64, 32, 16) if block_size % n == 0), "FORCE_USE_FLEX_ATTENTION": True}

    def flex(q, k, v, block_mask, gqa):
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options=options)

    return FlexKernels(compile_fullgraph(flex, dynamic=False), compile_fullgraph(flex, dynamic=True))


def compile_fullgraph(fn: Callable, dynamic: bool, backend: str = "inductor", **settings) -> Callable:
    """torch.compile(fn, fullgraph=True, **settings: mode or options), with dynamo's recompile limit
    raised to RECOMPILE_LIMIT (a process-wide setting: dynamo counts it per code object, shared by
    every engine built in the process, so it cannot be given to one engine alone; past it a
    fullgraph compile fails rather than run the function eagerly), and inductor's kernels kept in
    specgate's cache across runs (engine/compile_cache.py)."""
    inductor_cache_dir()
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, dynamic=dynamic, fullgraph=True, backend=backend, **settings)


def _flex_reference(q, k, v, block_mask, gqa):
    with warnings.catch_warnings():  # that this is the unfused implementation is the point here
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)


def paged_block_mask(query_pos: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                     block_size: int, num_cache_slots: int) -> BlockMask:
    """The flex backend's mask over the whole cache for queries at query_pos [R, Q] (-1: a
    padded query, which attends nothing and gets zeros). Request r visits the first
    ceil(seq_len / block_size) blocks of its table; inside them, key slot s holds key position
    physical_to_logical[r, s // block_size] * block_size + s % block_size."""
    num_reqs, width = block_tables.shape
    num_blocks = num_cache_slots // block_size
    physical_to_logical = torch.full((num_reqs, num_blocks), -1, dtype=torch.long, device=block_tables.device)
    # A padded table repeats the sink block; whichever entry wins, its positions lie past seq_len.
    physical_to_logical.scatter_(1, block_tables, torch.arange(width, device=block_tables.device).expand(num_reqs, -1))

    def mask_mod(b, h, q_idx, kv_idx):
        logical_block = physical_to_logical[b, kv_idx // block_size]
        key_pos = logical_block * block_size + kv_idx % block_size
        return (logical_block >= 0) & (key_pos <= query_pos[b, q_idx]) & (key_pos < seq_lens[b])

    max_query_len = query_pos.shape[1]
    num_q_blocks = -(-max_query_len // FLEX_Q_BLOCK)
    kv_num_blocks = (seq_lens + block_size - 1) // block_size
    kv_num_blocks = kv_num_blocks.to(torch.int32)[:, None, None].expand(-1, 1, num_q_blocks).contiguous()
    # kv_indices spans every cache block (the kernel checks it covers the key length); only the
    # first kv_num_blocks entries of a row are read.
    kv_indices = torch.zeros(num_reqs, 1, num_q_blocks, num_blocks, dtype=torch.int32, device=block_tables.device)
    kv_indices[..., :width] = block_tables[:, None, None, :].to(torch.int32)
    return BlockMask.from_kv_blocks(kv_num_blocks, kv_indices, BLOCK_SIZE=(FLEX_Q_BLOCK, block_size),
                                    mask_mod=mask_mod, seq_lengths=(max_query_len, num_cache_slots),
                                    compute_q_blocks=False)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, Hkv, D]; kv_cache: [2, num_slots, Hkv, D]. Returns [T, H, D]."""
    write_cache(kv_cache, k, v, meta.slot_mapping)
    return read_cache(q, kv_cache, meta)


def write_cache(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """k and v [T, Hkv, D] into their slots, as one indexed write into the whole cache: inside a
    compiled function inductor then writes it in place, where a write through kv_cache[0] and
    kv_cache[1] (views) is lowered to a copy of each whole half (engine/fused.py)."""
    kv_cache[:, slot_mapping] = torch.stack((k, v))


def read_cache(q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Attention of the step's queries over the cache (their own keys already written)."""
    if meta.paged is not None:
        return meta.paged(q, kv_cache)
    if meta.block_mask is None:
        return sdpa_read(q, kv_cache, meta.query_req, meta.query_offset, meta.context_slots, meta.attn_mask,
                         meta.max_query_len, kv_cache.shape[2] != q.shape[1])
    padded_q = _pad_queries(q, meta.query_req, meta.query_offset, meta.num_reqs, meta.max_query_len)
    keys, values = (kv_cache[i].transpose(0, 1)[None] for i in range(2))   # [1, Hkv, slots, D], in place
    out = meta.flex(padded_q.transpose(1, 2), keys, values, meta.block_mask, kv_cache.shape[2] != q.shape[1])
    return out.transpose(1, 2)[meta.query_req, meta.query_offset]


def sdpa_read(q: torch.Tensor, kv_cache: torch.Tensor, query_req: torch.Tensor, query_offset: torch.Tensor,
              context_slots: torch.Tensor, attn_mask: torch.Tensor, max_query_len: int, gqa: bool) -> torch.Tensor:
    """The sdpa backend: each request's context gathered out of the cache, then SDPA under the mask
    (gqa: fewer key/value heads than query heads)."""
    padded_q = _pad_queries(q, query_req, query_offset, context_slots.shape[0], max_query_len)
    keys = kv_cache[0][context_slots].transpose(1, 2)    # [R, Hkv, L, D]
    values = kv_cache[1][context_slots].transpose(1, 2)
    if gqa and max_query_len > GQA_MATH_MAX_QUERY:
        group = q.shape[1] // keys.shape[1]
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        gqa = False
    out = F.scaled_dot_product_attention(padded_q.transpose(1, 2), keys, values, attn_mask=attn_mask,
                                         enable_gqa=gqa)
    return out.transpose(1, 2)[query_req, query_offset]


def _pad_queries(q: torch.Tensor, query_req: torch.Tensor, query_offset: torch.Tensor, num_reqs: int,
                 max_query_len: int) -> torch.Tensor:
    """[R, max_query_len, H, D]: each request's queries in its own row, zeros after them."""
    padded_q = q.new_zeros(num_reqs, max_query_len, *q.shape[1:])
    padded_q[query_req, query_offset] = q
    return padded_q
