"""The paged backend's Triton kernel (engine/paged_kernel.py) against the sdpa backend, the
reference, on random paged caches: several requests of mixed context lengths, decode and verify
queries, GQA, shuffled block tables padded with the sink block, one split and several. On the CPU
the kernel runs under Triton's interpreter (the root conftest sets it); test_cuda_path.py runs the
compiled kernel on a GPU."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention import build_attention_metadata, read_cache, write_cache
from engine.paged_kernel import BLOCK_N, PagedSizes, fits, paged_read, paged_sizes
from helpers.paged_batches import paged_batch, ragged_rows


def both_reads(q, k, v, cache, inputs, sizes: PagedSizes):
    """sdpa's read and the kernel's over the same cache, the step's K/V written first."""
    meta = build_attention_metadata(**{n: x for n, x in inputs.items()})
    write_cache(cache, k, v, meta.slot_mapping)
    ref = read_cache(q, cache, meta)
    out = paged_read(q, cache, inputs["block_tables"], inputs["query_start_loc"], inputs["positions"],
                     inputs["seq_lens"], sizes)
    return out, ref


DECODE_OR_VERIFY = ragged_rows(max_query_len=5, max_past=60, min_size=2, max_size=4)


@settings(max_examples=8, deadline=None)
@given(rows=DECODE_OR_VERIFY, gqa=st.sampled_from([(4, 2), (4, 1), (2, 2)]), seed=st.integers(0, 1000))
def test_the_kernel_equals_the_sdpa_read_on_decode_and_verify_batches(rows, gqa, seed):
    heads, kv_heads = gqa
    q, k, v, cache, inputs = paged_batch(rows, heads, kv_heads, seed)
    sizes = paged_sizes(len(rows), kv_heads, heads // kv_heads, inputs["max_query_len"], inputs["max_context_len"],
                        inputs["block_size"])
    out, ref = both_reads(q, k, v, cache, inputs, sizes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_splits", [2, 3])
def test_splits_of_a_long_context_merge_to_the_sdpa_read(num_splits):
    """Contexts over several splits and several key tiles each, one request's verify queries
    straddling a split boundary (keys past a query's position masked inside a split, a whole
    split masked for the early queries) and a short request whose later splits hold no key."""
    rows = [(5, 3 * BLOCK_N + 2), (1, 7), (3, 2 * BLOCK_N)]
    q, k, v, cache, inputs = paged_batch(rows, 4, 2, seed=3, num_blocks=128)
    split_len = BLOCK_N * (-(-(3 * BLOCK_N + 2) // BLOCK_N) // num_splits + 1)
    sizes = PagedSizes(block_m=16, num_splits=num_splits, split_len=split_len, block_size=inputs["block_size"])
    assert sizes.num_splits * sizes.split_len >= inputs["max_context_len"] > sizes.split_len
    out, ref = both_reads(q, k, v, cache, inputs, sizes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_a_head_dim_that_is_not_a_power_of_two_is_padded_and_masked():
    """The fixture target's head dimension is 48; the kernel computes in 64 and must not read past 48."""
    q, k, v, cache, inputs = paged_batch([(1, 9), (5, 20)], 4, 2, seed=1, head_dim=12)
    sizes = paged_sizes(2, 2, 2, inputs["max_query_len"], inputs["max_context_len"], inputs["block_size"])
    out, ref = both_reads(q, k, v, cache, inputs, sizes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_a_wrong_block_table_changes_the_output():
    """Negative control: the kernel reads keys through the block table, not the cache's order:
    given another request's table, its output moves."""
    q, k, v, cache, inputs = paged_batch([(1, 30), (1, 30)], 4, 2, seed=2)
    sizes = paged_sizes(2, 2, 2, 1, inputs["max_context_len"], inputs["block_size"])
    out, ref = both_reads(q, k, v, cache, inputs, sizes)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    swapped = paged_read(q, cache, inputs["block_tables"].flip(0), inputs["query_start_loc"], inputs["positions"],
                         inputs["seq_lens"], sizes)
    assert not torch.allclose(swapped, ref, atol=1e-2)


def test_sizes_split_long_contexts_of_few_requests_and_keep_short_ones_whole():
    one = paged_sizes(num_reqs=8, num_kv_heads=8, group=4, max_query_len=5, max_context_len=128, block_size=16)
    assert (one.block_m, one.num_splits) == (32, 2) and one.split_len == BLOCK_N
    long = paged_sizes(num_reqs=1, num_kv_heads=8, group=4, max_query_len=1, max_context_len=16384, block_size=16)
    assert long.block_m == 16 and long.num_splits * long.split_len >= 16384 and long.num_splits > 1
    assert (long.num_splits - 1) * long.split_len < 16384  # no split wholly past the context
    assert fits(5, 4) and not fits(64, 4)


def test_a_paged_engine_gives_the_sdpa_engine_s_tokens_and_reads_short_queries_with_the_kernel(monkeypatch):
    """The fixture target, greedy, ngram spec (k=3), async runner over the graph arm (padded on the
    CPU), mixed prompts and arrivals, reference and fused layers: the same tokens as the sdpa
    engine; the kernel served every step whose queries fit it (decode, verify, short prefills;
    graph and eager) and sdpa's read the others (a long prompt's prefill)."""
    import engine.paged_kernel as kernel
    from engine.fused import FusedForward, eager_kernels
    from engine.llm import LLM
    from engine.sampling import SamplingParams
    from fixtures import TARGET_DIR
    prompts = ["def main(", "x = 1\nx = 1\nx =", "import os\nimport sys\n" * 4]
    reads = []
    monkeypatch.setattr(kernel, "paged_read", lambda q, *args: reads.append(q.shape[0]) or paged_read(q, *args))
    tokens, routes, kernel_steps = {}, {}, {}
    for backend in ("sdpa", "paged", "paged-fused"):
        llm = LLM(TARGET_DIR, max_model_len=192, max_num_seqs=3, spec="ngram", num_spec_tokens=3, graph=True,
                  async_runner=True, trace=True, attention_backend=backend.removesuffix("-fused"))
        if backend == "paged-fused":
            llm.runner.forward = FusedForward(llm.runner.model, eager_kernels())
        before = len(reads)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                            arrival_steps=[0, 2, 3])
        tokens[backend], routes[backend] = [o.token_ids for o in outs], {t.route for t in llm.trace}
        kernel_steps[backend] = (len(reads) - before) / llm.runner.model.config.num_hidden_layers
        group = llm.runner.group
        fitting = [kernel.fits(max(len(r.input_ids) for r in t.requests), group) for t in llm.trace]
    assert tokens["paged"] == tokens["paged-fused"] == tokens["sdpa"]
    assert routes["paged"] == routes["paged-fused"] >= {"async/graph", "async/eager"}
    assert not all(fitting) and any(fitting)  # both paths ran
    assert kernel_steps["sdpa"] == 0 and kernel_steps["paged"] == kernel_steps["paged-fused"] == sum(fitting)


def test_the_paged_backend_on_the_cpu_needs_triton_s_interpreter(monkeypatch):
    from engine.config import EngineConfig
    from engine.errors import SpecgateError
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SpecgateError, match="TRITON_INTERPRET=1"):
        EngineConfig(model="unused", attention_backend="paged")
    assert EngineConfig(model="unused", attention_backend="paged", device="cuda").attention_backend == "paged"
