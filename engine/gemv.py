"""One-token steps' projections as Triton GEMVs, each with its neighbours fused in.

A plain decode step at one request multiplies a single row by each weight matrix: the time is
reading the weights. On a 1B model each layer's four matmuls are surrounded by small kernels of
their own (the norm before QKV and gate/up, act * up before down, cuBLAS's split-K reduce after
it), each paying a launch and a ramp during which no weight is read. Here one kernel does a
projection and what surrounds it:

    norm prologue:      rms_norm(x) @ W.T           (input_layernorm + QKV, post_norm + gate/up)
    act * up prologue:  (silu(gate) * up) @ W.T     (the MLP's down projection; x = [gate | up])
    residual epilogue:  ... + residual              (o_proj and down add the residual stream)
    rotary epilogue:    q and k rotated, k and v written into the KV cache (attention_inputs:
                        fused.attention_inputs whole, the norm, QKV, rotary and cache write)

One program computes BLOCK_N outputs: it streams its BLOCK_N weight rows in BLOCK_K chunks,
multiplies each chunk by the matching slice of the row in float32 registers and sums the chunk
into BLOCK_N running totals. No tl.dot: tl.dot stages its operands in shared memory and pads one
row to 16, which made an earlier version (commit 29ab227) 2.9x slower than cuBLAS on an H100.
Narrow tiles (2 or 4 outputs) keep enough programs in flight to read at cuBLAS's bandwidth without
splitting K; summing each chunk at once, rather than keeping a [BLOCK_N, BLOCK_K] accumulator to
the end, frees the registers that let longer chunks and more programs run at once (a step's 64
kernels 979 -> 829 us on an H100, docs/measurements.md, 2026-12-07, fifth session). The norm's sum
of squares is a first pass over the row in each program: the row is a few KB from L2, far cheaper
than a kernel launch.

The arithmetic is the torch version's: the norm in float32, rounded as rms_norm rounds; silu(gate)
* up in float32, rounded once; one rounding after the residual add; QKV's output rounded, then
rotated in float32 and rounded again, as rotate() does. Only one-token steps take this
path (FusedForward.__call__); rows of several tokens stay on cuBLAS. On the CPU the kernel
runs only under Triton's interpreter, whose bfloat16 arithmetic is wrong, so every product here
is taken in float32.
"""
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NO_PROLOGUE, NORM, SILU_MUL = 0, 1, 2


@dataclass(frozen=True)
class Tiles:
    block_n: int    # outputs (weight rows) per program
    block_k: int    # columns of the row read per loop step
    num_warps: int


def tiles_for(n: int, k: int) -> Tiles:
    """The tiles a sweep of 510 settings timed best on an H100 for the 1B shape's four matrices
    (docs/measurements.md, 2026-12-07, fifth session): two outputs a program in chunks of 1,024
    columns, four warps; for the long K of down, four outputs in chunks of 4,096 with eight warps."""
    if k >= 8192:
        return Tiles(block_n=4, block_k=4096, num_warps=8)
    return Tiles(block_n=2, block_k=min(1024, max(16, triton.next_power_of_2(k))), num_warps=4)


@triton.jit
def _dot(x_ptr, w_ptr, norm_ptr, rows, row_ok, K, eps, PROLOGUE: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr):
    """[BLOCK_N] float32: the row, through its prologue, times weight rows `rows` (any rows: each
    is read along K, so they need not be neighbours)."""
    dtype = w_ptr.dtype.element_ty
    if PROLOGUE == 1:  # rms_norm: the row's sum of squares first, in float32
        squares = tl.zeros([BLOCK_K], tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
            squares += xk * xk
        inv_rms = tl.rsqrt(tl.sum(squares, 0) / K + eps)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
        if PROLOGUE == 1:  # normalised, cast back, then scaled by the norm's weight: rms_norm's roundings
            weight = tl.load(norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = ((x * inv_rms).to(dtype).to(tl.float32) * weight).to(dtype).to(tl.float32)
        elif PROLOGUE == 2:  # the row holds [gate | up]
            up = tl.load(x_ptr + K + ks, mask=k_ok, other=0.0).to(tl.float32)
            x = (x * tl.sigmoid(x) * up).to(dtype).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * x[None, :], 1)
    return acc


@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, res_ptr, norm_ptr, N, K, eps, PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    out = _dot(x_ptr, w_ptr, norm_ptr, cols, col_ok, K, eps, PROLOGUE, BLOCK_N, BLOCK_K)
    if RESIDUAL:
        out += tl.load(res_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + cols, out.to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _attention_inputs(x_ptr, w_ptr, norm_ptr, cos_ptr, sin_ptr, q_ptr, cache_ptr, slot_ptr, K, eps, HEADS,
                      KV_HEADS, cache_half, cache_slot, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """rms_norm, QKV, rotary, cache write. Each program's BLOCK_N weight rows are BLOCK_N / 2 pairs
    (d, d + HEAD_DIM / 2) of one head's columns, the pairs rotate_half mixes, interleaved: the
    rotary then needs nothing from another program."""
    HALF: tl.constexpr = HEAD_DIM // 2
    dtype = w_ptr.dtype.element_ty
    pair = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2
    head = pair // HALF  # q heads, then k heads, then v heads
    d = pair % HALF + (tl.arange(0, BLOCK_N) % 2) * HALF  # the column inside the head
    ok = head < HEADS + 2 * KV_HEADS
    h = _dot(x_ptr, w_ptr, norm_ptr, head * HEAD_DIM + d, ok, K, eps, 1, BLOCK_N, BLOCK_K)
    h = h.to(dtype).to(tl.float32)  # the QKV matmul's rounding, as F.linear rounds before rotate()
    # rotate(): [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], in float32, rounded once
    x1, x2 = tl.split(tl.reshape(h, [BLOCK_N // 2, 2]))
    partner = tl.reshape(tl.join(-x2, x1), [BLOCK_N])
    rotated = h * tl.load(cos_ptr + d) + partner * tl.load(sin_ptr + d)
    value = tl.where(head < HEADS + KV_HEADS, rotated, h).to(dtype)  # v is not rotated
    tl.store(q_ptr + head * HEAD_DIM + d, value, mask=ok & (head < HEADS))
    # k into cache[0, slot], v into cache[1, slot] (write_cache's layout: [2, slots, KV_HEADS, HEAD_DIM])
    is_v = head >= HEADS + KV_HEADS
    kv_head = head - HEADS - tl.where(is_v, KV_HEADS, 0)
    at = tl.where(is_v, cache_half, 0) + tl.load(slot_ptr) * cache_slot + kv_head * HEAD_DIM + d
    tl.store(cache_ptr + at, value, mask=ok & (head >= HEADS))


def project(x: torch.Tensor, weight: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 0.0,
            silu_mul: bool = False, residual: torch.Tensor | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """x [1, K] (or [1, 2K] = [gate | up] with silu_mul) times weight [N, K].T, with the optional
    rms_norm or silu(gate) * up prologue and the residual [1, N] epilogue."""
    n, k = weight.shape
    if x.shape != (1, 2 * k if silu_mul else k) or not (x.is_contiguous() and weight.is_contiguous()):
        raise ValueError(f"project takes one contiguous row of {2 * k if silu_mul else k} against a contiguous "
                         f"[{n}, {k}] weight, got x {tuple(x.shape)}")
    if silu_mul and norm is not None:
        raise ValueError("project computes one prologue: the norm or silu(gate) * up, not both")
    if residual is not None and not (residual.shape == (1, n) and residual.is_contiguous()):
        raise ValueError(f"the residual must be one contiguous row of {n}, got {tuple(residual.shape)}")
    tiles = tiles or tiles_for(n, k)
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    prologue = NORM if norm is not None else SILU_MUL if silu_mul else NO_PROLOGUE
    _gemv[(triton.cdiv(n, tiles.block_n),)](
        x, weight, out, residual if residual is not None else out, norm if norm is not None else weight, n, k, eps,
        PROLOGUE=prologue, RESIDUAL=residual is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
        num_warps=tiles.num_warps)
    return out


def attention_inputs(x: torch.Tensor, norm: torch.Tensor, eps: float, qkv: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int, cache: torch.Tensor,
                     slot_mapping: torch.Tensor, tiles: Tiles | None = None) -> torch.Tensor:
    """engine/fused.py's attention_inputs for one token, as one kernel: rms_norm(x) @ qkv.T, the
    rotary on q and k (cos and sin [.., head_dim] in float32, rotary_angles'), k and v written into
    the cache [2, slots, kv_heads, head_dim] at slot_mapping[0]; returns q [1, heads, head_dim]."""
    n, k = qkv.shape
    if x.shape != (1, k) or not (x.is_contiguous() and qkv.is_contiguous()):
        raise ValueError(f"attention_inputs takes one contiguous row of {k} against a contiguous [{n}, {k}] "
                         f"weight, got x {tuple(x.shape)}")
    if n != (heads + 2 * kv_heads) * head_dim or head_dim % 2:
        raise ValueError(f"the QKV weight's {n} rows are not {heads} + 2 x {kv_heads} heads of an even {head_dim}")
    if not all(t.numel() == head_dim and t.is_contiguous() for t in (cos, sin)):
        raise ValueError(f"cos and sin must be one token's {head_dim} angles, got {tuple(cos.shape)}")
    if cache.shape[:1] + cache.shape[2:] != (2, kv_heads, head_dim) or not cache.is_contiguous() \
            or slot_mapping.shape != (1,) or cache.dtype != x.dtype:
        raise ValueError(f"the cache must be a contiguous [2, slots, {kv_heads}, {head_dim}] of {x.dtype} and "
                         f"slot_mapping one slot, got {tuple(cache.shape)} {cache.dtype}, {tuple(slot_mapping.shape)}")
    tiles = tiles or tiles_for(n, k)
    q = torch.empty(1, heads, head_dim, dtype=x.dtype, device=x.device)
    _attention_inputs[(triton.cdiv(n, tiles.block_n),)](
        x, qkv, norm, cos, sin, q, cache, slot_mapping, k, eps, heads, kv_heads, cache.stride(0), cache.stride(1),
        HEAD_DIM=head_dim, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.num_warps)
    return q


@dataclass(frozen=True)
class OneTokenKernels:
    """What FusedForward runs for a one-token step: four kernels a layer around the attention read."""
    attention_inputs: Callable  # norm, QKV, rotary and cache write
    project: Callable           # o_proj + residual; norm + gate/up; silu(gate) * up + down + residual


ONE_TOKEN = OneTokenKernels(attention_inputs, project)
