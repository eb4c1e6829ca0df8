"""The projections of decode and verify steps as Triton GEMVs, each with its neighbours fused in.

A decode or verify step multiplies a few rows (one per query token) by each weight matrix: the
time is reading the weights, and on a 1B model each layer's four matmuls are each surrounded by
small kernels of their own (the norm before QKV and gate/up, act * up before down, cuBLAS's
split-K reduce after it), each paying a launch and a ramp during which no weight is read. Here one
kernel does a projection and what surrounds it:

    norm prologue:      rms_norm(x) @ W.T           (input_layernorm + QKV, post_norm + gate/up)
    act * up prologue:  (act(gate) * up) @ W.T      (the MLP's down projection; x = [gate | up])
    residual epilogue:  ... + residual              (o_proj and down add the residual stream)

One program computes BLOCK_N output columns for every row (rows padded to tl.dot's 16): it reads
its BLOCK_N weight rows once, in BLOCK_K chunks, and the input rows (a few KB, from L2) with them.
The norm's sum of squares is a first pass over the input rows in each program: recomputing it
costs less than a kernel launch. The arithmetic is the inductor version's: float32 norm and
activation, and one rounding after the residual add.

Only steps of at most MAX_ROWS tokens take this path (decode and verify); a prefill's matmuls are
compute-bound and stay on cuBLAS. On the CPU the kernel runs only under Triton's interpreter.
"""
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.fused import GEMV_MAX_ROWS as MAX_ROWS  # tokens a step may have to take this path

NO_PROLOGUE, NORM, SILU_MUL = 0, 1, 2


@dataclass(frozen=True)
class Tiles:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def tiles_for(n: int, k: int, m: int) -> Tiles:
    """The tiles a projection of N outputs over K inputs runs with: at least one program per SM's
    worth of weight rows, each reading BLOCK_K columns a step."""
    return Tiles(block_n=16 if n <= 4096 else 32, block_k=256 if k >= 256 else max(16, triton.next_power_of_2(k)),
                 num_warps=4, num_stages=4)


@triton.jit
def _projection(x_ptr, w_ptr, out_ptr, res_ptr, norm_ptr, M, N, K, eps, stride_x, stride_res, stride_out,
                PROLOGUE: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, DOT_FP32: tl.constexpr):
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    x_rows = x_ptr + rows[:, None] * stride_x
    if PROLOGUE == 1:  # rms_norm: the rows' sum of squares first, in float32
        squares = tl.zeros([BLOCK_M], tl.float32)
        for start in range(0, K, BLOCK_K):
            ks = start + tl.arange(0, BLOCK_K)
            xk = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & (ks < K)[None, :], other=0.0).to(tl.float32)
            squares += tl.sum(xk * xk, 1)
        inv_rms = tl.rsqrt(squares / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for start in range(0, K, BLOCK_K):
        ks = start + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if PROLOGUE == 1:  # normalised in float32, cast back, then scaled by the norm's weight
            weight = tl.load(norm_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            normed = (x.to(tl.float32) * inv_rms[:, None]).to(w_ptr.dtype.element_ty).to(tl.float32)
            x = (normed * weight[None, :]).to(w_ptr.dtype.element_ty)  # rounded as weight * normed is
        elif PROLOGUE == 2:  # x holds [gate | up]: silu(gate) * up, in float32
            up = tl.load(x_rows + K + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            gate = x.to(tl.float32)
            x = (gate * tl.sigmoid(gate) * up.to(tl.float32)).to(w_ptr.dtype.element_ty)
        w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_FP32:  # float32 weights, or Triton's interpreter (whose bfloat16 tl.dot is wrong)
            acc = tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    out_mask = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        acc += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=out_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


def project(x: torch.Tensor, weight: torch.Tensor, *, norm: torch.Tensor | None = None, eps: float = 0.0,
            silu_mul: bool = False, residual: torch.Tensor | None = None, tiles: Tiles | None = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] with silu_mul) times weight [N, K].T, with the optional norm or
    silu(gate) * up prologue and residual [M, N] epilogue. M at most MAX_ROWS."""
    n, k = weight.shape
    m = x.shape[0]
    assert m <= MAX_ROWS and x.shape[1] == (2 * k if silu_mul else k) and x.stride(1) == 1 and weight.is_contiguous()
    assert not (silu_mul and norm is not None)
    tiles = tiles or tiles_for(n, k, m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res = residual if residual is not None else out
    block_m = max(16, triton.next_power_of_2(m))
    prologue = NORM if norm is not None else SILU_MUL if silu_mul else NO_PROLOGUE
    grid = (triton.cdiv(n, tiles.block_n), triton.cdiv(m, block_m))
    _projection[grid](x, weight, out, res, norm if norm is not None else weight, m, n, k, eps, x.stride(0),
                      res.stride(0), out.stride(0), PROLOGUE=prologue, RESIDUAL=residual is not None,
                      BLOCK_M=block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                      DOT_FP32=x.dtype == torch.float32 or os.environ.get("TRITON_INTERPRET") == "1",
                      num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return out
