"""The fused forward (EngineConfig.compile, engine/fused.py) against the reference modules of
engine/model.py: the same greedy tokens and, per step and request, the same emit counts, for both
drafters and both arms, on Hypothesis batch compositions (several requests, mixed lengths and
arrivals). The Hypothesis cases run the fused functions uncompiled (fast, and what inductor
compiles); one case runs inductor's CPU compile itself, with the block drafter reading the
target's hidden states, the async runner and the graph arm. tests/engine/test_cuda_path.py runs the
compiled step on CUDA, inside the graphs."""
import dataclasses
import os
from collections import Counter

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from engine.fused import FusedForward, eager_kernels
from engine.loader import load_model
from engine.verify import verify
from gates.compare import first_difference, verify_steps
from gates.workloads import workloads
from helpers.strategies import examples


def run(llm, batch, temperature=0.0):
    """Greedy, or seeded sampling under top-k and top-p (request i's seed is i)."""
    params = [SamplingParams(temperature=temperature, top_k=20, top_p=0.9, seed=i, max_tokens=m)
              if temperature else SamplingParams(temperature=0, max_tokens=m) for i, m in enumerate(batch.max_tokens)]
    outs = llm.generate(list(batch.prompts), params, arrival_steps=list(batch.arrival_steps))
    final_len = {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in outs}
    return [o.token_ids for o in outs], verify_steps(llm.trace, final_len)


def assert_same_run(reference, fused):
    (tokens_r, steps_r), (tokens_f, steps_f) = reference, fused
    assert tokens_f == tokens_r
    assert steps_f.keys() == steps_r.keys() and steps_r, "no verify step ran"
    diff = first_difference(steps_r, steps_f, "emit_count")
    assert diff is None, str(diff)


def fused_uncompiled(llm):
    llm.runner.forward = FusedForward(llm.runner.model, eager_kernels())
    return llm


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
@given(batch=workloads(min_reqs=2), k=st.integers(1, 5))
@examples(4)
def test_fused_layers_give_the_reference_tokens_and_emit_counts(make_llm, drafter, graph, batch, k):
    # Room for verify steps, and arrivals by step 1 so the requests share steps (mixed prefill and verify).
    batch = dataclasses.replace(batch, max_tokens=tuple(max(m, 8) for m in batch.max_tokens),
                                arrival_steps=tuple(min(a, 1) for a in batch.arrival_steps))
    kwargs = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=4, trace=True)
    reference = run(make_llm(**kwargs), batch)
    fused = fused_uncompiled(make_llm(**kwargs))
    assert_same_run(reference, run(fused, batch))
    assert max(step.num_reqs for step in fused.trace) > 1, "no step held several requests"
    assert graph == any(step.route.endswith("/graph") for step in fused.trace), "the arm asked for did not run"


def test_gemv_projections_give_the_reference_tokens_and_emit_counts(make_llm):
    """CUDA's one-token steps' projections (engine/gemv.py's Triton kernels, under Triton's
    interpreter here) inside a whole engine decoding plainly (a drafter's verify steps always hold
    k + 1 tokens a request): the reference modules' tokens and per-step emit counts, on a batch
    whose several-token steps (prefills, and decode steps of several requests) take the cuBLAS
    path and whose one-token steps (the first request decoding alone after the others finish)
    take the GEMV one."""
    from engine.bench.workload import Workload
    batch = Workload([[5, 6, 7, 8, 9, 5, 6, 7], [10, 11], [12, 13, 14]], max_tokens=(16, 6, 9),
                     arrival_steps=(0, 1, 2))
    reference = run(make_llm(max_num_seqs=4, trace=True), batch)
    fused = make_llm(max_num_seqs=4, trace=True)
    from helpers.projections import wide_one_token_kernels
    forward = FusedForward(fused.runner.model, dataclasses.replace(eager_kernels(), gemv=wide_one_token_kernels()))
    fused.runner.forward = forward
    rows, one_token = Counter(), forward.kernels.gemv

    def counted(name, fn):
        return lambda x, *a, **kw: rows.update({(name, x.shape[0]): 1}) or fn(x, *a, **kw)
    forward.kernels = dataclasses.replace(forward.kernels, gemv=dataclasses.replace(
        one_token, attention_inputs=counted("gemv attention_inputs", one_token.attention_inputs),
        project=counted("gemv project", one_token.project)),
        attention_inputs=counted("attention_inputs", forward.kernels.attention_inputs))
    got = run(fused, batch)
    assert got[0] == reference[0]
    assert first_difference(reference[1], got[1], "emit_count") is None
    assert rows["gemv attention_inputs", 1] > 0, "no one-token step took the GEMV path"
    assert any(name == "attention_inputs" for name, _ in rows), "no several-token step took the cuBLAS path"
    assert all(name.startswith("gemv") == (tokens == 1) for name, tokens in rows), f"a step took the other path: {rows}"
    assert rows["gemv project", 1] == 3 * rows["gemv attention_inputs", 1], "a projection left the GEMV path"
    assert max(step.num_reqs for step in fused.trace) > 1, "no step held several requests"


def test_fused_layers_over_flex_read_the_cache_through_its_block_mask(make_llm):
    """The fused layers with the flex backend (uncompiled, on the CPU): each layer's read takes
    flex's block mask, and the run is the reference modules' token for token and step for step."""
    from engine.bench.workload import Workload
    batch = Workload([[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]], max_tokens=(16, 10, 12), arrival_steps=(0, 1, 1))
    kwargs = dict(spec="ngram", num_spec_tokens=3, attention_backend="flex", max_num_seqs=4, trace=True)
    reference = run(make_llm(**kwargs), batch)
    fused = fused_uncompiled(make_llm(**kwargs))
    assert_same_run(reference, run(fused, batch))
    assert max(step.num_reqs for step in fused.trace) > 1, "no step held several requests"


@pytest.mark.parametrize("drafter, backend", [("ngram", "sdpa"), ("block", "sdpa"), ("ngram", "flex")])
def test_compile_true_compiles_each_pure_piece_of_the_step_and_nothing_else(make_llm, drafter, backend):
    """Which pieces compile=True hands to inductor (built, not run: compiling happens on first call):
    the layers, the combine, verify, the logits gather, the sdpa metadata, and a proposer that is a
    function of its input; the block drafter (a model with state) and flex's own metadata stay eager."""
    from engine.attention import build_attention_metadata
    from engine.combine import combine_inputs
    from engine.logits import gather_logits

    def compiled_from(fn, original):
        return getattr(fn, "_torchdynamo_orig_callable", None) == original

    kwargs = dict(spec=drafter, num_spec_tokens=3, attention_backend=backend)
    plain, fused = make_llm(**kwargs).runner, make_llm(compile=True, **kwargs).runner
    assert plain.forward is plain.model and isinstance(fused.forward, FusedForward)
    eager = eager_kernels()
    for field in dataclasses.fields(eager):  # every layer function inductor's, built from the eager one
        assert compiled_from(getattr(fused.forward.kernels, field.name), getattr(eager, field.name)), field.name
    for name, original in (("verify", verify), ("gather_logits", gather_logits), ("combine", combine_inputs),
                           ("build_metadata", build_attention_metadata)):
        assert getattr(plain, name) is original, name
        assert compiled_from(getattr(fused, name), original) == (name != "build_metadata" or backend == "sdpa"), name
    assert plain.propose == plain.proposer.propose
    assert compiled_from(fused.propose, fused.proposer.propose) == (drafter == "ngram")
    assert (fused.propose == fused.proposer.propose) == (drafter != "ngram")


def test_the_kernels_take_the_gemv_only_when_asked():
    """compiled_kernels and eager_kernels build engine/gemv.py's kernels only with gemv=True (the
    runner asks on CUDA alone): without it every step's projections stay on the torch path."""
    from engine.fused import compiled_kernels
    from engine.gemv import ONE_TOKEN, attention_inputs, project
    assert (ONE_TOKEN.attention_inputs, ONE_TOKEN.project) == (attention_inputs, project)
    for build in (compiled_kernels, eager_kernels):
        assert build().gemv is None and build(gemv=False).gemv is None
        assert build(gemv=True).gemv is ONE_TOKEN


def test_packing_keeps_the_checkpoint(target_dir):
    """The Hugging Face parameters become views of the packed weights: same names, same values,
    no second copy of the weights."""
    model = load_model(target_dir)
    before = {name: t.clone() for name, t in model.state_dict().items()}
    fused = FusedForward(model, eager_kernels())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)
    attn, mlp, packed = model.model.layers[0].self_attn, model.model.layers[0].mlp, fused.layers[0]
    assert attn.k_proj.weight.untyped_storage().data_ptr() == packed.qkv.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == packed.gate_up.untyped_storage().data_ptr()


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "mutation",
                    reason="inductor's compile costs each mutant ~12 s; the Hypothesis cases above run the "
                           "same functions")
@pytest.mark.xdist_group("inductor")
@pytest.mark.parametrize("drafter, temperature", [("block", 0.0), ("block", 0.8), ("ngram", 0.0)],
                         ids=["block-greedy", "block-seeded-sampling", "ngram-greedy"])
def test_inductor_compiled_step_gives_the_reference_run(make_llm, drafter, temperature):
    """compile=True as a user sets it: inductor's CPU kernels for the layers, the attention
    metadata, the combine, the logits gather, verify (the sampler) and the n-gram proposer; the block drafter
    (aux hidden states) or ngram, async runner, graph arm, a mixed batch with late arrivals;
    greedy, and seeded sampling with top-k and top-p."""
    from engine.combine import combine_inputs
    from engine.logits import gather_logits
    from gates.workloads import MIXED_REFUSALS
    batch = MIXED_REFUSALS
    kwargs = dict(spec=drafter, num_spec_tokens=3, graph=True, async_runner=True, max_num_seqs=4, trace=True)
    compiled = make_llm(compile=True, **kwargs)
    runner = compiled.runner
    assert isinstance(runner.forward, FusedForward) and runner.verify is not verify
    assert runner.combine is not combine_inputs
    assert runner.gather_logits is not gather_logits
    # Only a proposer that is a function of its input is compiled; the block drafter runs a model.
    assert (runner.propose != runner.proposer.propose) == (drafter == "ngram")
    assert_same_run(run(make_llm(**kwargs), batch, temperature), run(compiled, batch, temperature))
    assert max(step.num_reqs for step in compiled.trace) > 1
    assert any(step.route == "async/graph" for step in compiled.trace)


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") == "mutation", reason="an inductor compile (~10 s)")
@pytest.mark.xdist_group("inductor")
def test_the_compiled_layer_writes_the_cache_in_place():
    """The KV cache write inside the compiled attention_inputs: the same cache and outputs as the
    uncompiled function, and no buffer of a cache half's size in inductor's code (an indexed write
    through a view of the cache is lowered to a copy of the whole half, every layer of every step).
    Static shapes, so a copy's buffer would carry the slot count; the CUDA twin measures peak memory
    under the engine's own dynamic compile (test_cuda_path.py)."""
    from torch._inductor.utils import run_and_get_code

    from engine.attention import compile_fullgraph
    from engine.fused import attention_inputs
    from helpers.fused_layer import layer_inputs
    num_slots = 4099  # a count no other buffer of the layer has
    args, expected_args = layer_inputs("cpu", num_slots), layer_inputs("cpu", num_slots)
    q, code = run_and_get_code(compile_fullgraph(attention_inputs, dynamic=False), *args)
    assert torch.allclose(q, attention_inputs(*expected_args), atol=1e-5)
    cache, expected_cache = args[-2], expected_args[-2]
    assert torch.allclose(cache, expected_cache, atol=1e-5) and cache[:, args[-1]].abs().sum() > 0
    allocations = [line for text in code for line in text.splitlines() if "empty_strided" in line and "(" in line]
    assert allocations, "no inductor buffer found: the check would pass on nothing"
    assert not [line for line in allocations if str(num_slots) in line], "the cache is copied"
