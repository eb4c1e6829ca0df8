"""engine/gemv.py's projections against the torch arithmetic they replace (engine/fused.py's
attention_inputs and mlp_block: rms_norm then the QKV or gate/up matmul, silu(gate) * up then the
down matmul, the residual adds), on the CPU under Triton's interpreter (the root conftest sets it):
every prologue and epilogue, row counts from one to the path's limit, sizes that are not a multiple
of the tiles, float32 and bfloat16. test_fused.py runs the projections inside a whole engine, and
test_cuda_path.py compiled on a GPU."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.fused import GEMV_MAX_ROWS
from engine.gemv import project, tiles_for
from helpers.projections import KINDS, gemv, inputs, reference


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(KINDS), m=st.integers(1, GEMV_MAX_ROWS), n=st.integers(1, 70), k=st.integers(1, 100),
       seed=st.integers(0, 1000))
def test_each_projection_equals_the_torch_arithmetic_in_float32(kind, m, n, k, seed):
    x, w, norm, res = inputs(m, n, k, torch.float32, seed)
    torch.testing.assert_close(gemv(kind, x, w, norm, res), reference(kind, x, w, norm, res), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 8, 40])
def test_each_projection_in_bfloat16_is_within_a_rounding_of_the_torch_arithmetic(kind, m):
    """bfloat16 weights, as on CUDA: the same arithmetic up to where float32 sums are rounded (the
    torch reference rounds each matmul before the residual add, the kernel once after it)."""
    x, w, norm, res = inputs(m, 48, 96, torch.bfloat16, seed=m)
    out, ref = gemv(kind, x, w, norm, res), reference(kind, x, w, norm, res)
    assert out.dtype == torch.bfloat16
    # a few of bfloat16's roundings (epsilon 2^-7) of the largest output: the inputs' roundings differ
    # where the two round a float32 intermediate in different places
    assert (out.float() - ref.float()).abs().max() <= 2 ** -5 * ref.float().abs().max()


def test_the_default_tiles_compute_every_projection_of_a_llama_layer():
    """tiles_for's choice (what the engine runs) on a layer of the 1B shape's proportions, scaled down."""
    for kind, (n, k) in {"norm": (96, 64), "residual": (64, 64), "silu * up, residual": (64, 256)}.items():
        x, w, norm, res = inputs(3, n, k, torch.float32, seed=n + k)
        tiles = tiles_for(n, k, 3)
        torch.testing.assert_close(gemv(kind, x, w, norm, res, tiles), reference(kind, x, w, norm, res),
                                   atol=1e-5, rtol=1e-5)


def test_a_step_past_the_row_limit_is_refused():
    x, w, norm, res = inputs(GEMV_MAX_ROWS + 1, 16, 16, torch.float32, seed=0)
    with pytest.raises(AssertionError):
        project(x[:, :16], w)
