"""The flex attention backend (FlexAttention reading K/V through the block table, no gather)
against the reference SDPA backend, on random paged caches: several requests of mixed query
and context lengths in one flattened batch (prefill, decode and verify rows together), GQA,
block tables that are shuffled and padded with the sink block. On the CPU flex_attention runs
its unfused reference implementation (which applies mask_mod over the whole cache and ignores
the block list), so one case also runs the compiled CPU kernel, which reads only the listed
blocks. tests/engine/test_cuda_path.py runs the same comparison with the CUDA kernel."""
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import flex_attention

from engine.attention import (
    GQA_MATH_MAX_QUERY,
    RECOMPILE_LIMIT,
    build_attention_metadata,
    compile_fullgraph,
    flex_kernels,
    paged_attention,
)
from engine.config import EngineConfig
from engine.errors import SpecgateError
from helpers.paged_batches import BLOCK, NUM_BLOCKS, paged_batch, ragged_rows


def attend(q, k, v, cache, inputs, flex=None):
    """paged_attention on a copy of the cache; returns the output and the cache it wrote."""
    cache = cache.clone()
    meta = build_attention_metadata(**inputs, flex=flex, num_cache_slots=cache.shape[1])
    return paged_attention(q, k, v, cache, meta), cache


ROWS = ragged_rows(max_query_len=9, max_past=30)


@settings(max_examples=25, deadline=None)
@given(rows=ROWS, gqa=st.sampled_from([(4, 2), (4, 1), (2, 2)]), seed=st.integers(0, 1000))
def test_flex_equals_the_reference_on_mixed_ragged_batches(rows, gqa, seed):
    heads, kv_heads = gqa
    q, k, v, cache, inputs = paged_batch(rows, heads, kv_heads, seed)
    ref, ref_cache = attend(q, k, v, cache, inputs)
    with warnings.catch_warnings(record=True) as caught:  # the unfused CPU path is meant: no warning each step
        warnings.simplefilter("always")
        out, flex_cache = attend(q, k, v, cache, inputs, flex_kernels("cpu", BLOCK).any_shapes)
    assert not [w for w in caught if "flex_attention" in str(w.message)], [str(w.message) for w in caught]
    assert torch.equal(flex_cache, ref_cache)  # both write the step's K/V at the same slots
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(8, 2, 8), (4, 2, 2)], ids=["dim-eq-heads", "dim-eq-kv-heads"])
def test_flex_equals_the_reference_when_the_head_dim_equals_a_head_count(heads, kv_heads, head_dim):
    """GQA is told apart by the head counts, never by the head size: here one of them is it."""
    q, k, v, cache, inputs = paged_batch([(3, 9), (1, 6)], heads, kv_heads, seed=0, head_dim=head_dim)
    ref, _ = attend(q, k, v, cache, inputs)
    out, _ = attend(q, k, v, cache, inputs, flex_kernels("cpu", BLOCK).any_shapes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


MIXED = [(7, 7), (1, 22), (4, 13), (1, 1), (5, 32)]  # prefill, decode, verify, a 1-token prompt, a chunk to a block end


def test_flex_mixed_batch_is_really_mixed():
    """The fixed batch the compiled case uses holds every kind of row, GQA and shuffled tables."""
    q, _, _, _, inputs = paged_batch(MIXED, 4, 2, seed=0)
    tables = inputs["block_tables"]
    assert {ql for ql, _ in MIXED} >= {1, 4, 7} and q.shape[1] != 2
    assert any((row[1:] - row[:-1] != 1).any() for row in tables[:, :2])  # non-contiguous blocks


def test_compiled_cpu_flex_reads_only_the_listed_blocks_and_equals_the_reference():
    """The longest request fills its block table and holds block 0, which also names the mask's
    unused block-list entries: a block count one too high would read it twice."""
    q, k, v, cache, inputs = paged_batch(MIXED, 4, 2, seed=0, full_table=True)
    longest = inputs["block_tables"][max(range(len(MIXED)), key=lambda i: MIXED[i][1])]
    assert 0 in longest.tolist() and NUM_BLOCKS not in longest.tolist()  # no sink: the table is full
    ref, _ = attend(q, k, v, cache, inputs)

    def flex(q, k, v, block_mask, gqa):
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)

    kernel = torch.compile(flex, dynamic=False, fullgraph=True)
    out, _ = attend(q, k, v, cache, inputs, kernel)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # Negative control: a kernel handed one block fewer per request must change the longest
    # rows, proving the compiled kernel follows the block list, not the mask alone.
    meta = build_attention_metadata(**inputs, flex=kernel, num_cache_slots=cache.shape[1])
    meta.block_mask.kv_num_blocks.sub_(1).clamp_(min=0)
    short = paged_attention(q, k, v, cache.clone(), meta)
    assert not torch.allclose(short, ref, atol=1e-3)


def test_compiled_kernels_have_room_for_every_bucket():
    """Flex on CUDA compiles one specialisation per graph bucket shape; dynamo's default limit (8)
    failed the fullgraph compile past 8 (seen on the H200: every flex arm red once a process had
    compiled 8 flex shapes). A trivial function under dynamo's eager backend stands in for flex:
    the limit is dynamo's, before any backend."""
    shapes = RECOMPILE_LIMIT * 3 // 4
    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default, whatever ran before
        plain = torch.compile(lambda x: x * 2, dynamic=False, fullgraph=True, backend="eager")  # negative control
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            for n in range(1, shapes + 1):
                plain(torch.ones(n))
        kernel = compile_fullgraph(lambda x: x * 2, dynamic=False, backend="eager")
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
        for n in range(1, shapes + 1):
            assert torch.equal(kernel(torch.ones(n)), torch.full((n,), 2.0))


@pytest.mark.parametrize("kwargs, message", [
    (dict(attention_backend="flash"), "attention_backend must be one of"),
    (dict(attention_backend="flex", device="cuda", block_size=8), "multiple of 16"),
])
def test_unknown_or_unrunnable_backends_are_refused(kwargs, message):
    with pytest.raises(SpecgateError, match=message):
        EngineConfig(model="unused", **kwargs)


@pytest.mark.parametrize("block_size", [16, 32])
def test_flex_on_cuda_takes_any_block_size_that_is_a_multiple_of_16(block_size):
    assert EngineConfig(model="unused", attention_backend="flex", device="cuda", block_size=block_size).block_size \
        == block_size


def test_the_uncompiled_flex_reference_raises_no_warning_that_it_is_uncompiled(make_llm, monkeypatch):
    """flex's unfused path on the CPU is the point of the reference: torch's warning about it is
    silenced there. torch warns once a process, so its record of warnings shown starts empty."""
    import warnings

    import torch.nn.attention.flex_attention as flex

    from engine.sampling import SamplingParams
    monkeypatch.setattr(flex, "_WARNINGS_SHOWN", set())
    llm = make_llm(attention_backend="flex")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=3))
    assert not [w for w in caught if "without torch.compile" in str(w.message)]


def test_flex_engine_gives_the_reference_tokens_on_cpu():
    """The fixture target, greedy, ngram spec (k=3), async runner over the graph arm (padded on
    the CPU): mixed prompts and arrivals give the same tokens under both backends, and with
    flex under the fused layers of compile=True."""
    from engine.llm import LLM
    from engine.sampling import SamplingParams
    from fixtures import TARGET_DIR
    prompts = ["def main(", "x = 1\nx = 1\nx =", "import os\nimport sys\n"]
    from engine.attention import FlexKernels
    tokens, routes, calls = {}, {}, {b: {"fixed_shapes": 0, "any_shapes": 0} for b in ("sdpa", "flex")}

    def counted(backend, kind, kernel):
        def run(*args):
            calls[backend][kind] += 1
            return kernel(*args)
        return run

    calls["flex-fused"] = {"fixed_shapes": 0, "any_shapes": 0}
    for backend in ("sdpa", "flex", "flex-fused"):
        llm = LLM(TARGET_DIR, max_model_len=64, max_num_seqs=3, spec="ngram", num_spec_tokens=3, graph=True,
                  async_runner=True, trace=True, attention_backend=backend.removesuffix("-fused"))
        if backend == "flex-fused":  # compile=True's fused layers, uncompiled: flex reads their cache
            from engine.fused import FusedForward, eager_kernels
            llm.runner.forward = FusedForward(llm.runner.model, eager_kernels())
        if llm.runner.flex is not None:
            llm.runner.flex = FlexKernels(*(counted(backend, kind, getattr(llm.runner.flex, kind))
                                            for kind in calls[backend]))
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                            arrival_steps=[0, 2, 3])
        tokens[backend] = [o.token_ids for o in outs]
        routes[backend] = {t.route for t in llm.trace}
    assert tokens["flex"] == tokens["flex-fused"] == tokens["sdpa"]
    assert routes["flex"] == routes["flex-fused"] >= {"async/graph", "async/eager"}
    # Each engine attended with the backend it was asked for: flex with a graph bucket's kernel in
    # graph steps and the dynamic one in eager steps, sdpa never with flex (the two give the same
    # tokens, so tokens alone cannot tell).
    assert calls["flex"]["fixed_shapes"] > 0 and calls["flex"]["any_shapes"] > 0, calls
    assert calls["flex-fused"] == calls["flex"], calls
    assert calls["sdpa"] == {"fixed_shapes": 0, "any_shapes": 0}, calls


@pytest.mark.parametrize("block_size, tile", [(16, 16), (32, 32), (48, 16), (64, 64), (128, 64)])
def test_cuda_flex_kernels_are_built_as_asked(monkeypatch, block_size, tile):
    """What flex_kernels asks of torch for CUDA, checked on any machine (torch.compile is
    lazy): the graph arm's kernel fixed-shape and the eager arm's dynamic, both fullgraph under
    inductor; each calls flex_attention with q, k, v, the block mask and GQA as given, a key tile
    dividing the cache block, and the main template forced. On the CPU the reference runs."""
    compiled, calls = [], []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(kw) or fn)
    monkeypatch.setattr("engine.attention.flex_attention", lambda *a, **kw: calls.append((a, kw)) or "out")
    kernels = flex_kernels("cuda:0", block_size)
    assert compiled == [dict(dynamic=False, fullgraph=True, backend="inductor"),
                        dict(dynamic=True, fullgraph=True, backend="inductor")]
    for kernel in (kernels.fixed_shapes, kernels.any_shapes):
        assert kernel("q", "k", "v", "mask", True) == "out"
    options = {"BLOCK_N": tile, "FORCE_USE_FLEX_ATTENTION": True}
    assert calls == [(("q", "k", "v"), dict(block_mask="mask", enable_gqa=True, kernel_options=options))] * 2
    assert flex_kernels("cpu", block_size).any_shapes is flex_kernels("cpu", block_size).fixed_shapes
    assert not compiled[2:]  # the CPU's reference is not compiled


def test_the_fused_forward_compiles_each_piece_whole_for_any_shape(monkeypatch):
    from engine.fused import compiled
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    compiled(abs)
    assert asked == [dict(dynamic=True, fullgraph=True, backend="inductor")]


@pytest.mark.parametrize("max_query", [GQA_MATH_MAX_QUERY, GQA_MATH_MAX_QUERY + 1])
def test_a_long_grouped_query_is_read_with_expanded_heads_and_a_short_one_with_enable_gqa(max_query, monkeypatch):
    """SDPA's math kernel is the only one that takes enable_gqa with a mask, and it holds the whole
    [R, H, Q, L] score matrix: a long query must reach SDPA with every head's keys expanded (the
    memory-efficient kernel's input), a short one with the grouped keys; both read the same."""
    rows = [(max_query, max_query + 9), (1, 30)]
    q, k, v, cache, inputs = paged_batch(rows, heads=4, kv_heads=2, seed=3)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        calls.append((key.shape[1], kwargs.get("enable_gqa", False)))
        return real(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    meta = build_attention_metadata(**inputs)
    out = paged_attention(q, k, v, cache.clone(), meta)
    long_query = max_query > GQA_MATH_MAX_QUERY
    assert calls == [(4, False)] if long_query else calls == [(2, True)]
    monkeypatch.undo()
    expanded_keys = dict(inputs)
    reference = paged_attention(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
                                cache.repeat_interleave(2, dim=2),
                                build_attention_metadata(**expanded_keys))
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
