"""engine/gemv.py's one-row projections against the torch arithmetic they replace (engine/fused.py's
attention_inputs and mlp_block: rms_norm then the QKV or gate/up matmul, silu(gate) * up then the
down matmul, the residual adds), on the CPU under Triton's interpreter (the root conftest sets it):
every prologue and epilogue, sizes that are not a multiple of the tiles, float32 and bfloat16,
against torch's arithmetic and, within one rounding, against the kernel's own arithmetic done
exactly (helpers/projections.py's exact); and attention_inputs, the norm, QKV, rotary and cache
write of one token in one kernel, against engine/fused.py's.
test_fused.py runs the projections inside a whole engine, and test_cuda_path.py compiled on a GPU."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.fused import attention_inputs as fused_attention_inputs
from engine.gemv import Tiles, project, tiles_for
from engine.gemv import attention_inputs as gemv_attention_inputs
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
    down, K past one chunk for down; then down's K of 8,192, whose tiles are its own."""
    for kind, (n, k) in [("norm", (96, 64)), ("residual", (64, 64)), ("silu * up, residual", (64, 2304)),
                         ("silu * up, residual", (8, 8192))]:
        x, w, norm, res = inputs(n, k, torch.float32, seed=n + k)
        torch.testing.assert_close(gemv(kind, x, w, norm, res, tiles_for(n, k)), reference(kind, x, w, norm, res),
                                   atol=1e-5, rtol=1e-5)


def test_the_tiles_read_two_outputs_a_program_in_chunks_of_up_to_1024_columns_and_four_for_down():
    assert tiles_for(3072, 2048) == Tiles(block_n=2, block_k=1024, num_warps=4)
    assert tiles_for(2048, 8192) == Tiles(block_n=4, block_k=4096, num_warps=8)
    assert tiles_for(2048, 8191).block_k == 1024
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


def one_token_layer(dtype: torch.dtype, seed: int = 0, **shape) -> tuple[list, list]:
    """attention_inputs' arguments for one token, twice (each call writes its own cache)."""
    from helpers.fused_layer import layer_inputs
    return (layer_inputs("cpu", 23, dtype, tokens=1, seed=seed, **shape),
            layer_inputs("cpu", 23, dtype, tokens=1, seed=seed, **shape))


@settings(max_examples=10, deadline=None)
@given(kv_heads=st.integers(1, 3), group=st.integers(1, 3), half=st.integers(1, 9), hidden=st.integers(1, 70),
       slot=st.integers(0, 22), position=st.integers(0, 5000), block_n=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 1000))
def test_attention_inputs_for_one_token_equal_the_fused_layers_in_float32(kv_heads, group, half, hidden, slot,
                                                                           position, block_n, seed):
    """The norm, QKV, rotary and cache write as one kernel: fused.attention_inputs' queries and
    its whole cache after the write (the token's slot, and every other slot untouched), on GQA and
    MHA, head sizes whose halves straddle a program's rows, and any slot and position."""
    shape = dict(heads=kv_heads * group, kv_heads=kv_heads, head_dim=2 * half, hidden=hidden, slots=[slot],
                 positions=[position])
    args, expected = one_token_layer(torch.float32, seed, **shape)
    q = gemv_attention_inputs(*args, tiles=Tiles(block_n=block_n, block_k=32, num_warps=4))
    torch.testing.assert_close(q, fused_attention_inputs(*expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(args[-2], expected[-2], atol=1e-5, rtol=1e-5)


def test_attention_inputs_for_one_token_in_bfloat16_are_near_the_fused_layers():
    """bfloat16, the 1B shape's heads (32 q, 8 kv, 64 wide) on a narrower row: within a few of
    bfloat16's roundings of the largest value (the interpreter rounds float32 -> bfloat16 toward
    zero, CUDA to nearest: test_cuda_path.py bounds it on a GPU), every other slot untouched."""
    args, expected = one_token_layer(torch.bfloat16, heads=32, kv_heads=8, head_dim=64, hidden=96, slots=[11])
    before = args[-2].clone()
    q, ref = gemv_attention_inputs(*args), fused_attention_inputs(*expected)
    assert q.dtype == torch.bfloat16 and q.shape == ref.shape == (1, 32, 64)
    for got, want in ((q, ref), (args[-2][:, 11], expected[-2][:, 11])):
        assert (got.float() - want.float()).abs().max() <= 2 ** -5 * want.float().abs().max()
    others = [s for s in range(23) if s != 11]
    assert torch.equal(args[-2][:, others], before[:, others]) and not torch.equal(args[-2][:, 11], before[:, 11])


def test_attention_inputs_refuse_what_they_cannot_compute():
    args, _ = one_token_layer(torch.float32)
    x, norm, eps, qkv, cos, sin, heads, kv_heads, head_dim, cache, slot = args
    with pytest.raises(ValueError, match="one contiguous row of 32"):
        gemv_attention_inputs(torch.cat([x, x]), *args[1:])
    with pytest.raises(ValueError, match="are not 4 \\+ 2 x 2 heads of an even 16"):
        gemv_attention_inputs(x, norm, eps, qkv[:-1], *args[4:])
    with pytest.raises(ValueError, match="are not 4 \\+ 2 x 2 heads of an even 15"):  # rotate_half needs pairs
        gemv_attention_inputs(x, norm, eps, qkv[:120], cos, sin, heads, kv_heads, 15, cache, slot)
    with pytest.raises(ValueError, match="are not 5 \\+ 2 x 2 heads"):
        gemv_attention_inputs(x, norm, eps, qkv, cos, sin, 5, kv_heads, head_dim, cache, slot)
    with pytest.raises(ValueError, match="cos and sin must be one token's 16 angles"):
        gemv_attention_inputs(x, norm, eps, qkv, torch.cat([cos, cos]), torch.cat([sin, sin]), *args[6:])
    with pytest.raises(ValueError, match="one contiguous row of 32 against a contiguous \\[128, 32\\]"):
        gemv_attention_inputs(x, norm, eps, qkv.T.contiguous().T, *args[4:])  # the weight's shape, strided
    strided = torch.zeros(2, 23, kv_heads, 2 * head_dim)[..., ::2]  # the cache's shape, every other element
    for bad_cache, bad_slot in ((cache[:, :, :1], slot), (cache.double(), slot), (cache.transpose(0, 1), slot),
                                (strided, slot), (cache, torch.cat([slot, slot]))):
        with pytest.raises(ValueError, match="the cache must be a contiguous \\[2, slots, 2, 16\\]"):
            gemv_attention_inputs(x, norm, eps, qkv, cos, sin, heads, kv_heads, head_dim, bad_cache, bad_slot)
