"""The CUDA device path, on a GPU only (skipped elsewhere): the compiled flex kernel against the
reference attention, in float32 and bfloat16; the kernel inside a CUDA graph; and the fixture
target giving, in float32, the CPU's greedy tokens in every arm (eager/graph, sync/async,
attention_backend sdpa/flex/paged) with ngram spec (k=3), several requests of mixed lengths and
arrival steps, with the reference forward and the fused one compiled by inductor (engine/fused.py).
Graphs are captured at start-up, for every (batch, context) bucket. And flex's floor on the head
dimension: refused under 16 on CUDA, by name. The paged backend's Triton kernel, compiled, against
the reference on decode and verify rows, split and whole, and inside a CUDA graph. engine/gemv.py's
projections and attention_inputs compiled on the 1B sizes, and one-token steps running them inside
the compiled engine."""
import gc
import os

import pytest
import torch

from engine.attention import build_attention_metadata, flex_kernels, paged_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BLOCK = 16  # the flex backend's CUDA kernel needs a multiple of 16
MIXED = [(7, 7), (1, 40), (4, 21), (1, 1), (33, 70), (5, 5)]  # prefill, decode, verify, chunks
TOLERANCE = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def batch(dtype, heads=8, kv_heads=2, seed=0, head_dim=64):
    """head_dim 64 as the 1B shape's; the kernel refuses below 16 (NYI in torch's flex lowering)."""
    from helpers.paged_batches import paged_batch
    return paged_batch(MIXED, heads, kv_heads, seed, block=BLOCK, num_blocks=32, dtype=dtype, device="cuda",
                       head_dim=head_dim)


def reference(q, k, v, cache, inputs):
    """The SDPA backend in float32 on the same (rounded) values."""
    meta = build_attention_metadata(**inputs)
    return paged_attention(q.float(), k.float(), v.float(), cache.float().clone(), meta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("head_dim", [64, 48], ids=["d64", "d48-fixture"])
def test_compiled_flex_kernel_equals_the_reference_attention(dtype, gqa, head_dim):
    q, k, v, cache, inputs = batch(dtype, *gqa, head_dim=head_dim)
    meta = build_attention_metadata(**inputs, flex=flex_kernels("cuda", BLOCK).any_shapes,
                                    num_cache_slots=cache.shape[1])
    out = paged_attention(q, k, v, cache.clone(), meta)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(q, k, v, cache, inputs), **TOLERANCE[dtype])


def test_flex_kernel_replays_inside_a_cuda_graph():
    """Compiled and warmed up outside, captured, then replayed on new cache contents: the
    replay reads the cache in place (no gather), so it sees the new values."""
    q, k, v, cache, inputs = batch(torch.float32)
    meta = build_attention_metadata(**inputs, flex=flex_kernels("cuda", BLOCK).fixed_shapes,
                                    num_cache_slots=cache.shape[1])
    replay_sees_new_cache_contents(q, k, v, cache, inputs, meta)


def replay_sees_new_cache_contents(q, k, v, cache, inputs, meta) -> None:
    """Warm the read up outside a graph (kernels compile at their first call), capture it, write new
    cache contents and replay: the output must be the reference's on the new contents."""
    cache = cache.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        paged_attention(q, k, v, cache, meta)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_attention(q, k, v, cache, meta)
    cache.copy_(torch.randn_like(cache))
    graph.replay()
    torch.testing.assert_close(out, reference(q, k, v, cache, inputs), **TOLERANCE[torch.float32])


SHORT = [(1, 40), (4, 21), (1, 1), (5, 70), (5, 5)]  # decode and verify rows: what the paged kernel takes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gqa", [(8, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("head_dim", [64, 48], ids=["d64", "d48-fixture"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_the_paged_kernel_equals_the_reference_attention(dtype, gqa, head_dim, num_splits):
    from engine.paged_kernel import BLOCK_N, PagedSizes, paged_read
    from helpers.paged_batches import paged_batch
    q, k, v, cache, inputs = paged_batch(SHORT, *gqa, seed=1, block=BLOCK, num_blocks=32, dtype=dtype,
                                         device="cuda", head_dim=head_dim)
    sizes = PagedSizes(32, num_splits, BLOCK_N * (2 // num_splits + 1), BLOCK)
    assert sizes.num_splits * sizes.split_len >= inputs["max_context_len"]
    cache = cache.clone()
    meta = build_attention_metadata(**inputs)
    expected = paged_attention(q, k, v, cache, meta)  # writes the step's keys
    out = paged_read(q, cache, inputs["block_tables"], inputs["query_start_loc"], inputs["positions"],
                     inputs["seq_lens"], sizes)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(q, k, v, cache, inputs), **TOLERANCE[dtype])
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


def test_the_paged_kernel_replays_inside_a_cuda_graph():
    from engine.paged_kernel import paged_sizes
    from helpers.paged_batches import paged_batch
    q, k, v, cache, inputs = paged_batch(SHORT, 8, 2, seed=2, block=BLOCK, num_blocks=32, device="cuda")
    sizes = paged_sizes(len(SHORT), 2, 4, inputs["max_query_len"], inputs["max_context_len"], BLOCK)
    replay_sees_new_cache_contents(q, k, v, cache, inputs, build_attention_metadata(**inputs, paged=sizes))


def test_flex_on_cuda_refuses_a_head_dimension_under_16_and_takes_16_and_sdpa_takes_any(tmp_path,
                                                                                      hf_tokenizer_dir):
    """torch's flex lowering does not implement a head dimension under 16: the engine refuses it by
    name for flex on CUDA only, from 16 up flex builds, and sdpa builds at any head dimension."""
    from conftest import LLAMA3, save_llama  # tests/conftest.py
    from engine.errors import SpecgateError
    from engine.llm import LLM
    heads = {dim: save_llama(tmp_path / f"d{dim}", hf_tokenizer_dir, seed=3, **{**LLAMA3, "head_dim": dim})
             for dim in (8, 16)}
    with pytest.raises(SpecgateError) as refused:
        LLM(heads[8], device="cuda", attention_backend="flex", max_model_len=64)
    assert str(refused.value) == ("attention_backend='flex' on CUDA needs a head dimension of at least 16 (torch's "
                                  "flex kernel), this model has 8; use attention_backend='sdpa'")
    built = dict(device="cuda", max_model_len=64, graph=False)  # no capture: what is built is judged
    assert LLM(heads[16], attention_backend="flex", **built).runner.flex is not None
    assert LLM(heads[8], attention_backend="sdpa", **built).runner.flex is None


PROMPTS = ["def main(", "x = 1\nx = 1\nx = 1\nx =", "import os\nimport sys\nimport re\n", "class A:\n    def f(self):",
           "for i in range(10):\n    print(i)\n"]
ARRIVALS = [0, 0, 2, 3, 6]
# Under mutation mutmut routes every engine function through its trampoline, which reads a
# ContextVar that dynamo cannot trace: a compiled engine cannot run mutated code. The eager arms
# run the same functions.
NOT_UNDER_MUTATION = pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "mutation",
                                        reason="dynamo cannot trace mutmut's trampolines")
ARMS = [pytest.param(dict(graph=g, async_runner=a, attention_backend=b, compile=c), marks=[NOT_UNDER_MUTATION] * c)
        for c in (False, True) for b in ("sdpa", "flex", "paged") for g in (False, True) for a in (False, True)]


def run(device, spec="ngram", **arm):
    from engine.llm import LLM
    from engine.sampling import SamplingParams
    from fixtures import TARGET_DIR
    llm = LLM(TARGET_DIR, device=device, dtype="float32", max_model_len=128, max_num_seqs=4, spec=spec,
              num_spec_tokens=3, trace=True, **arm)
    lengths = [24, 9, 17, 30, 12]
    outs = llm.generate(PROMPTS, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths],
                        arrival_steps=ARRIVALS)
    return llm, [o.token_ids for o in outs]


@pytest.fixture(scope="module")
def cpu_tokens():
    return run("cpu")[1]


@pytest.mark.parametrize("arm", ARMS, ids=lambda a: "{attention_backend}-{g}-{r}{c}".format(
    g="graph" if a["graph"] else "eager", r="async" if a["async_runner"] else "sync",
    c="-compiled" if a["compile"] else "", **a))
def test_fixture_target_gives_the_cpu_tokens_in_every_arm(arm, cpu_tokens):
    llm, tokens = run("cuda", **arm)
    assert tokens == cpu_tokens
    assert gc.isenabled(), "the graph capture left garbage collection off"
    arms = {t.route.split("/")[1] for t in llm.trace}
    assert max(t.num_reqs for t in llm.trace) > 1
    if arm["graph"]:
        planner = llm.runner.planner
        assert len(llm.runner.graphs) == len(planner.buckets) * len(planner.context_buckets)  # all at start-up
        assert "graph" in arms and llm.runner.num_graph_replays > 0
        # each capture synchronises once, inside the wait the no-sync gate knows by this name
        assert llm.runner.declared_syncs.counts["graph capture"] == len(llm.runner.graphs)
    if arm["graph"] and arm["attention_backend"] != "flex":
        assert len(planner.context_buckets) > 1  # the context is bucketed, not padded to the table


@NOT_UNDER_MUTATION
@pytest.mark.parametrize("backend", ["paged", "sdpa"])
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_plain_decoding_compiled_on_cuda_runs_one_token_steps_through_the_gemv_and_gives_the_cpu_tokens(
        graph, backend, monkeypatch):
    """The compiled forward on CUDA takes engine/gemv.py's Triton GEMVs for one-token steps (the
    longest request decoding alone at the end here) and cuBLAS for the rest: the CPU's plain greedy
    tokens, in float32, eager and replayed in the CUDA graphs, after the paged kernel and sdpa's read."""
    import dataclasses

    import engine.fused as fused
    rows, build = [], fused._one_token_kernels

    def counted(fn):  # counts the calls made eagerly and while capturing
        return lambda x, *a, **kw: rows.append((fn.__name__, x.shape[0])) or fn(x, *a, **kw)
    monkeypatch.setattr(fused, "_one_token_kernels", lambda: dataclasses.replace(
        build(), attention_inputs=counted(build().attention_inputs), project=counted(build().project)))
    llm, tokens = run("cuda", spec=None, compile=True, graph=graph, attention_backend=backend)
    assert isinstance(llm.runner.forward, fused.FusedForward), "not the compiled forward"
    assert {name for name, _ in rows} == {"attention_inputs", "project"} and {t for _, t in rows} == {1}, rows
    one_token = [t for t in llm.trace if sum(len(r.input_ids) for r in t.requests) + t.num_padding_rows == 1]
    assert one_token and len(one_token) < len(llm.trace), "no one-token step, or no several-token one"
    assert all(t.route.endswith("/graph") == graph for t in one_token), "a one-token step ran in the other arm"
    assert tokens == run("cpu", spec=None)[1]


def test_result_ring_copies_each_step_into_its_own_buffer_and_refuses_a_fourth_unread():
    """The pinned result ring (engine/step_result.py): each download lands in the next buffer, the
    event says when it is there, a buffer is refilled only after release, and one more unread
    step than the ring holds is refused rather than overwritten."""
    from engine.step_result import ResultRing
    ring = ResultRing(max_rows=4, width=5)
    slots = []
    for step in range(ResultRing.DEPTH):
        packed = torch.full((3, 5), step, dtype=torch.long, device="cuda")
        host, event, slot = ring.download(packed)
        event.synchronize()
        assert host.shape == (3, 5) and host.is_pinned() and host.tolist() == [[step] * 5] * 3
        slots.append(slot)
    assert sorted(slots) == list(range(ResultRing.DEPTH))
    with pytest.raises(RuntimeError, match="unread"):
        ring.download(torch.zeros((1, 5), dtype=torch.long, device="cuda"))
    ring.release(slots[0])
    host, event, slot = ring.download(torch.full((2, 5), 9, dtype=torch.long, device="cuda"))
    event.synchronize()
    assert slot == slots[0] and host.tolist() == [[9] * 5] * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_compiled_layer_writes_the_cuda_cache_in_place(dtype):
    """The engine's compiled attention_inputs (dynamic shapes, as the runner builds it) writes k
    and v into the cache without a copy of it: the peak memory of the call stays far under a cache
    half (a copy would allocate one per half, every layer of every step); the cache matches the
    uncompiled function's."""
    from engine.fused import attention_inputs, compiled
    from helpers.fused_layer import layer_inputs
    num_slots = 1 << 18
    args = layer_inputs("cuda", num_slots, dtype)
    expected_args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    fn = compiled(attention_inputs)
    fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])  # compile outside the measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(*args)
    torch.cuda.synchronize()
    cache, half = args[-2], args[-2][0].numel() * args[-2].element_size()
    assert torch.cuda.max_memory_allocated() - before < half / 8, "the compiled layer copies the cache"
    attention_inputs(*expected_args)
    assert torch.allclose(cache.float(), expected_args[-2].float(), **TOLERANCE[dtype])
    assert cache[:, args[-1]].abs().sum() > 0


@pytest.mark.parametrize("kind", ["plain", "norm", "residual", "silu * up, residual"])
def test_the_gemv_projections_compiled_equal_the_torch_arithmetic_in_bfloat16(kind):
    """engine/gemv.py compiled for the GPU, with the engine's own tiles, on the 1B shape's QKV,
    gate/up, o_proj and down sizes: within a few of bfloat16's roundings of cuBLAS's arithmetic,
    and within one rounding of the kernel's own arithmetic done exactly."""
    from engine.gemv import tiles_for
    from helpers.projections import assert_within_one_rounding, exact, gemv, inputs, reference
    n, k = {"plain": (3072, 2048), "norm": (16384, 2048), "residual": (2048, 2048),
            "silu * up, residual": (2048, 8192)}[kind]
    x, w, norm, res = (t.cuda() for t in inputs(n, k, torch.bfloat16, seed=n))
    out, ref = gemv(kind, x, w, norm, res, tiles_for(n, k)), reference(kind, x, w, norm, res)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref.float()).abs().max() <= 2 ** -5 * ref.float().abs().max()
    assert_within_one_rounding(out, exact(kind, x, w, norm, res))


def test_the_gemv_attention_inputs_compiled_are_near_the_torch_arithmetic_in_bfloat16():
    """engine/gemv.py's attention_inputs (norm, QKV, rotary, cache write) compiled for the GPU on
    the 1B shape (hidden 2,048; 32 q and 8 kv heads of 64), at a position far from 0: q and the
    written slot within a few of bfloat16's roundings of fused.attention_inputs' torch arithmetic,
    and every other slot untouched."""
    from engine.fused import attention_inputs
    from engine.gemv import attention_inputs as gemv_attention_inputs
    from helpers.fused_layer import layer_inputs
    shape = dict(tokens=1, heads=32, kv_heads=8, head_dim=64, hidden=2048, slots=[1000], positions=[4097])
    args, expected = (layer_inputs("cuda", 4096, torch.bfloat16, **shape) for _ in range(2))
    before = args[-2].clone()
    q, ref = gemv_attention_inputs(*args), attention_inputs(*expected)
    for got, want in ((q, ref), (args[-2][:, 1000], expected[-2][:, 1000])):
        assert (got.float() - want.float()).abs().max() <= 2 ** -6 * want.float().abs().max()
    assert torch.equal(args[-2][:, :1000], before[:, :1000]) and torch.equal(args[-2][:, 1001:], before[:, 1001:])
