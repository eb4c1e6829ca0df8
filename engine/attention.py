"""Attention over a paged KV cache for a flattened ragged batch, in plain PyTorch.

A step's tokens are flattened to [T]; request r owns rows query_start_loc[r]:query_start_loc[r+1].
Keys live in a paged cache addressed by slot = block_table[r, pos // block_size] * block_size +
pos % block_size, so a rejected draft needs no rollback: the next step overwrites its slot.
Queries are scattered into a padded [R, max_query_len] layout so one batched SDPA call serves
every request; no Python loop over requests.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor   # [T] cache slot each new token's K/V is written to
    context_slots: torch.Tensor  # [R, L] cache slot of key position j for request r
    query_req: torch.Tensor      # [T] request row of each token
    query_offset: torch.Tensor   # [T] index of each token inside its request's query
    attn_mask: torch.Tensor      # [R, 1, Q, L] True where the query may attend the key
    max_query_len: int


def context_slots(block_tables: torch.Tensor, key_pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """[R, L]: the cache slot of key position key_pos[j] of request r (the slot formula above)."""
    return block_tables[:, key_pos // block_size] * block_size + key_pos % block_size


def build_attention_metadata(positions: torch.Tensor, query_start_loc: torch.Tensor,
                             seq_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int,
                             max_query_len: int, max_context_len: int) -> AttentionMetadata:
    """All inputs are device tensors; the two sizes are host integers (upper bounds are fine)."""
    device = positions.device
    num_tokens = positions.numel()
    num_reqs = query_start_loc.numel() - 1
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    query_req = torch.repeat_interleave(torch.arange(num_reqs, device=device), query_lens,
                                        output_size=num_tokens)
    query_offset = torch.arange(num_tokens, device=device) - query_start_loc[query_req]
    key_pos = torch.arange(max_context_len, device=device)
    slot_mapping = (block_tables[query_req, positions // block_size] * block_size
                    + positions % block_size)
    query_pos = torch.full((num_reqs, max_query_len), -1, dtype=positions.dtype, device=device)
    query_pos[query_req, query_offset] = positions
    mask = (key_pos[None, None, :] <= query_pos[:, :, None]) & (key_pos < seq_lens[:, None])[:, None, :]
    # A padded query row sees key 0 only, so softmax has a finite input; its output is discarded.
    mask[:, :, 0] |= query_pos < 0
    return AttentionMetadata(slot_mapping, context_slots(block_tables, key_pos, block_size), query_req,
                             query_offset, mask[:, None], max_query_len)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, Hkv, D]; kv_cache: [2, num_slots, Hkv, D]. Returns [T, H, D]."""
    kv_cache[0].index_copy_(0, meta.slot_mapping, k)
    kv_cache[1].index_copy_(0, meta.slot_mapping, v)
    keys = kv_cache[0][meta.context_slots].transpose(1, 2)    # [R, Hkv, L, D]
    values = kv_cache[1][meta.context_slots].transpose(1, 2)
    num_reqs = meta.context_slots.shape[0]
    padded_q = q.new_zeros(num_reqs, meta.max_query_len, *q.shape[1:])
    padded_q[meta.query_req, meta.query_offset] = q
    out = F.scaled_dot_product_attention(padded_q.transpose(1, 2), keys, values,
                                         attn_mask=meta.attn_mask,
                                         enable_gqa=keys.shape[1] != q.shape[1])
    return out.transpose(1, 2)[meta.query_req, meta.query_offset]
