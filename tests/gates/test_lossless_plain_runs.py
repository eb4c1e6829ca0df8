"""lossless's check of the kernels its steps took (gates/gemv_steps.py), on the CPU, where the gates'
own forward has no GEMV path: here the fused forward built with engine/gemv.py's kernels (Triton's
interpreter, wide tiles) runs a staggered workload like ROUTING_WORKLOAD, smaller. count_gemv_calls
records the rows of each layer's call; StepKernels finds nothing to report on the engine's routing,
plain and ngram, and reports every one-token step off the GEMV when the path is switched off (the
negative control); over any steps, a routing at any other limit differs at exactly the sizes
between. That the gate's own workload holds every size is the gate's assertion, run on the CPU too."""
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine.fused import FusedForward, eager_kernels
from gates.gemv_steps import GEMV_STEP_TOKENS, ROUTING_WORKLOAD, StepKernels, count_gemv_calls
from gates.workloads import run
from helpers.projections import wide_one_token_kernels

NUM_REQS = 3  # steps of 1 to 3 decoding requests, and prefills beside them
WORKLOAD = replace(ROUTING_WORKLOAD, prompts=ROUTING_WORKLOAD.prompts[:NUM_REQS], max_tokens=(8,) * NUM_REQS,
                   arrival_steps=ROUTING_WORKLOAD.arrival_steps[:NUM_REQS], ignore_eos=(True,) * NUM_REQS)


def gemv_steps(make_llm, act: str | None = None, **engine) -> StepKernels:
    """WORKLOAD on the fused forward with the GEMV kernels (and act for the checkpoint's activation)."""
    counted = []

    def gemv_forward(llm):
        llm.runner.forward = FusedForward(llm.runner.model, replace(eager_kernels(), gemv=wide_one_token_kernels()))
        llm.runner.forward.act = act or llm.runner.forward.act
        counted.append((count_gemv_calls(llm), len(llm.runner.forward.layers)))
    r = run(make_llm, WORKLOAD, observe=gemv_forward, **engine)
    assert all(len(o.token_ids) == 8 for o in r.outputs)
    return StepKernels.of(r.trace, *counted[0])


def test_the_reference_forward_has_no_gemv_calls_to_count(make_llm):
    assert count_gemv_calls(make_llm()) is None


def test_each_call_is_counted_at_its_rows(make_llm):
    """count_gemv_calls records the rows of the x each call receives (the one-row kernels never get
    more than one, so a forward with stand-in kernels gives it three)."""
    llm = make_llm()
    stand_in = replace(wide_one_token_kernels(), attention_inputs=lambda x, *args, **kwargs: x)
    llm.runner.forward = FusedForward(llm.runner.model, replace(eager_kernels(), gemv=stand_in))
    calls = count_gemv_calls(llm)
    x = torch.zeros(3, 4)
    assert llm.runner.forward.kernels.gemv.attention_inputs(x, "norm", 1e-5) is x and calls == [3]


def test_graph_steps_are_refused_their_calls_uncounted(make_llm):
    """A graph replay calls no Python: a trace with graph steps (here the CPU's padded graph plan)
    is refused, not counted as steps off the GEMV."""
    r = run(make_llm, WORKLOAD, graph=True)
    assert any(s.route.endswith("/graph") for s in r.trace)
    with pytest.raises(ValueError, match="eager steps only"):
        StepKernels.of(r.trace, [], 1)


def test_each_one_token_step_calls_the_gemv_once_a_layer_and_no_longer_step_does(make_llm):
    steps = gemv_steps(make_llm)
    assert {1, 2, NUM_REQS} <= set(steps.step_sizes) and max(steps.step_sizes) > GEMV_STEP_TOKENS
    assert steps.routing_difference() == {}
    assert steps.gemv_rows == (1,) * (steps.step_sizes.count(1) * steps.num_layers)


def test_verify_steps_stay_off_the_gemv(make_llm):
    steps = gemv_steps(make_llm, spec="ngram", num_spec_tokens=3)
    assert {4, 8} <= set(steps.step_sizes) and steps.routing_difference() == {}


def test_a_path_switched_off_leaves_every_one_token_step_off_the_gemv(make_llm):
    """The negative control: an activation the kernels do not compute, so FusedForward routes every
    step to cuBLAS; every one-token step's calls are missing."""
    steps = gemv_steps(make_llm, act="gelu_pytorch_tanh")
    one_token_calls = steps.step_sizes.count(1) * steps.num_layers
    assert steps.gemv_rows == () and steps.routing_difference() == {1: (one_token_calls, 0)}


@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=30), limit=st.integers(0, 40),
       num_layers=st.integers(1, 4))
def test_a_run_routed_at_any_other_limit_differs_at_exactly_the_sizes_between(sizes, limit, num_layers):
    """The arithmetic, over any steps: a forward that routes steps of up to `limit` tokens to the
    GEMV, once a layer, differs from the design exactly at the sizes between the two limits (a
    limit above the design's puts longer steps on the GEMV, which the one-row kernels refuse, so
    only this check covers it)."""
    rows = [t for t in sizes if t <= limit for _ in range(num_layers)]
    difference = StepKernels(tuple(sizes), tuple(rows), num_layers).routing_difference()
    low, high = sorted((limit, GEMV_STEP_TOKENS))
    assert set(difference) == {t for t in sizes if low < t <= high}
    assert all(made == sizes.count(t) * num_layers * (t <= limit) for t, (_, made) in difference.items())
