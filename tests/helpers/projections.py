"""engine/gemv.py's projections and the torch arithmetic each replaces, on one set of inputs."""
from functools import partial

import torch
import torch.nn.functional as F

from engine.gemv import OneTokenKernels, Tiles, attention_inputs, project
from engine.model import rms_norm

KINDS = ["plain", "norm", "residual", "silu * up, residual"]
SMALL_TILES = Tiles(block_n=4, block_k=32, num_warps=4)  # small sizes still span several programs and chunks
# Under Triton's interpreter a program costs about the same whatever its tile: 64 outputs a program
# run a fixture layer about 15x faster than the engine's 4 (tiles_for, the GPU's choice, which
# test_gemv.py checks on a layer's shapes and test_cuda_path.py runs compiled).
WIDE_TILES = Tiles(block_n=64, block_k=256, num_warps=4)


def wide_one_token_kernels() -> OneTokenKernels:
    """engine/gemv.py's one-token kernels with WIDE_TILES, for whole engines under the interpreter."""
    return OneTokenKernels(partial(attention_inputs, tiles=WIDE_TILES), partial(project, tiles=WIDE_TILES))


def inputs(n: int, k: int, dtype: torch.dtype, seed: int):
    """One row x [1, 2K] (gate | up), the weight [N, K], a norm weight [K] and a residual [1, N]."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)  # noqa: E731
    return rand(1, 2 * k), rand(n, k) / k ** 0.5, 1 + rand(k) / 4, rand(1, n)


def reference(kind: str, x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    k = w.shape[1]
    if kind == "norm":
        return F.linear(rms_norm(x[:, :k], norm, 1e-5), w)
    if kind == "silu * up, residual":
        gate, up = x.chunk(2, dim=-1)
        return res + F.linear(F.silu(gate) * up, w)
    if kind == "residual":
        return res + F.linear(x[:, :k], w)
    return F.linear(x[:, :k], w)


def exact(kind: str, x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic with its intermediates computed in float32 and rounded where the
    kernel rounds them (the norm as rms_norm rounds it, silu(gate) * up once), then the matmul and
    the residual add in float64, the output not rounded: a correct kernel differs from it by its
    one output rounding and float32 summation order."""
    k = w.shape[1]
    if kind == "norm":
        inputs_ = rms_norm(x[:, :k], norm, 1e-5)
    elif kind == "silu * up, residual":
        gate, up = x.float().chunk(2, dim=-1)
        inputs_ = (gate * torch.sigmoid(gate) * up).to(w.dtype)
    else:
        inputs_ = x[:, :k]
    out = inputs_.double() @ w.double().T
    return out + res.double() if kind in ("residual", "silu * up, residual") else out


def assert_within_one_rounding(out: torch.Tensor, exact_out: torch.Tensor) -> None:
    """Each output within one rounding of the exact value (a unit in the last place: 2^-7 relative
    in bfloat16, 2^-23 in float32) plus float32 summation's error, 2^-12 of the outputs' root mean
    square: a kernel that drops a single column of K lands 13 to 240 times that far off (measured
    under the interpreter on the sizes the tests use)."""
    unit = torch.finfo(out.dtype).eps
    bound = unit * exact_out.abs() + 2 ** -12 * exact_out.pow(2).mean().sqrt()
    excess = (out.double() - exact_out).abs() - bound
    assert excess.max() <= 0, f"{(excess > 0).sum().item()} outputs beyond one rounding, worst by {excess.max():.3g}"


def gemv(kind: str, x: torch.Tensor, w: torch.Tensor, norm: torch.Tensor, res: torch.Tensor, tiles=SMALL_TILES):
    k = w.shape[1]
    if kind == "norm":
        return project(x[:, :k].contiguous(), w, norm=norm, eps=1e-5, tiles=tiles)
    if kind == "silu * up, residual":
        return project(x, w, silu_mul=True, residual=res, tiles=tiles)
    return project(x[:, :k].contiguous(), w, residual=res if kind == "residual" else None, tiles=tiles)
