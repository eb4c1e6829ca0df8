"""engine/gemv.py's one-row projections against the torch arithmetic they replace (engine/fused.py's
attention_inputs and mlp_block: rms_norm then the QKV or gate/up matmul, silu(gate) * up then the
down matmul, the residual adds), on the CPU under Triton's interpreter (the root conftest sets it):
every prologue and epilogue, sizes that are not a multiple of the tiles, float32 and bfloat16,
against torch's arithmetic and, within one rounding, against the kernel's own arithmetic done
exactly (helpers/projections.py's exact).
test_fused.py runs the projections inside a whole engine, and test_cuda_path.py compiled on a GPU."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.gemv import project, tiles_for
from engine.model import rms_norm
from helpers.projections import KINDS, assert_within_one_rounding, exact, gemv, inputs, reference


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(1, 70), k=st.integers(1, 100), seed=st.integers(0, 1000))
def test_each_projection_equals_the_torch_arithmetic_in_float32(kind, n, k, seed):
    x, w, norm, res = inputs(n, k, torch.float32, seed)
    torch.testing.assert_close(gemv(kind, x, w, norm, res), reference(kind, x, w, norm, res), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_each_projection_in_bfloat16_is_near_the_torch_arithmetic(kind):
    """bfloat16 weights, as on CUDA, against torch's arithmetic (which rounds each matmul before the
    residual add, the kernel once after it): within a few of bfloat16's roundings (epsilon 2^-7)
    of the largest output. The interpreter rounds a float32 -> bfloat16 cast toward zero (CUDA to
    nearest), so the norm's and silu * up's rounded intermediates differ here by up to an ulp
    each; the next test and test_cuda_path.py bound the kernel by one rounding where they can."""
    x, w, norm, res = inputs(48, 96, torch.bfloat16, seed=3)
    out, ref = gemv(kind, x, w, norm, res), reference(kind, x, w, norm, res)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max() <= 2 ** -5 * ref.float().abs().max()


@pytest.mark.parametrize("kind", ["plain", "residual"])
@pytest.mark.parametrize("n, k", [(48, 96), (64, 2304)])
def test_a_projection_without_a_rounded_prologue_is_within_one_rounding_in_bfloat16(kind, n, k):
    x, w, norm, res = inputs(n, k, torch.bfloat16, seed=n)
    assert_within_one_rounding(gemv(kind, x, w, norm, res, tiles_for(n, k)), exact(kind, x, w, norm, res))


@pytest.mark.parametrize("kind", KINDS)
def test_each_projection_is_within_one_rounding_in_float32(kind):
    x, w, norm, res = inputs(64, 2304, torch.float32, seed=1)
    assert_within_one_rounding(gemv(kind, x, w, norm, res, tiles_for(64, 2304)), exact(kind, x, w, norm, res))


def test_the_default_tiles_compute_every_projection_of_a_llama_layer():
    """tiles_for's choice (what the engine runs) on a layer of the 1B shape's proportions, scaled
    down, K past one chunk for down."""
    for kind, (n, k) in {"norm": (96, 64), "residual": (64, 64), "silu * up, residual": (64, 2304)}.items():
        x, w, norm, res = inputs(n, k, torch.float32, seed=n + k)
        torch.testing.assert_close(gemv(kind, x, w, norm, res, tiles_for(n, k)), reference(kind, x, w, norm, res),
                                   atol=1e-5, rtol=1e-5)


def test_the_tiles_read_four_outputs_a_program_in_chunks_of_up_to_1024_columns():
    assert tiles_for(3072, 2048).block_n == 4 and tiles_for(3072, 2048).block_k == 1024
    assert tiles_for(2048, 8192).num_warps == 8 and tiles_for(2048, 2048).num_warps == 4
    assert tiles_for(64, 48).block_k == 64 and tiles_for(64, 8).block_k == 16  # tl.arange's floor of 16


def test_the_norm_without_an_epsilon_is_rms_norm_with_none():
    x, w, norm, _ = inputs(24, 40, torch.float32, seed=2)
    row = x[:, :40].contiguous()
    torch.testing.assert_close(project(row, w, norm=norm), F.linear(rms_norm(row, norm, 0.0), w), atol=1e-5, rtol=1e-5)


def test_anything_but_one_contiguous_row_is_refused():
    x, w, norm, res = inputs(16, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="one contiguous row of 16 against a contiguous"):
        project(torch.cat([x[:, :16], x[:, :16]]), w)
    with pytest.raises(ValueError, match="one contiguous row of 16 against"):
        project(x[:, ::2], w)  # every other element of the row
    with pytest.raises(ValueError, match="one contiguous row of 32 against"):  # [gate | up]
        project(x[:, :16].contiguous(), w, silu_mul=True)
    with pytest.raises(ValueError, match="^project computes one prologue"):
        project(x, w, norm=norm, silu_mul=True)
    with pytest.raises(ValueError, match="residual"):
        project(x[:, :16].contiguous(), w, residual=torch.cat([res, res]))
