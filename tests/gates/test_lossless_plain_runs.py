"""lossless's plain runs (gates/lossless.py plain_greedy), on the CPU: their staggered arrivals hold
one-token steps, and count_gemv_calls counts each layer's call of engine/gemv.py's attention_inputs
in a forward that has the GEMV path (CUDA's compiled forward; here the fused forward built with
the GEMV kernels, under Triton's interpreter with wide tiles) and says None for a forward without one."""
from dataclasses import replace

from engine import SamplingParams
from engine.fused import FusedForward, eager_kernels
from gates.lossless import PLAIN_ARRIVALS, count_gemv_calls
from gates.workloads import PROMPTS
from helpers.projections import wide_one_token_kernels


def test_the_gemv_calls_are_counted_per_layer_of_each_one_token_step(make_llm):
    llm = make_llm(trace=True)
    assert count_gemv_calls(llm) is None, "the reference forward has no GEMV path"
    llm.runner.forward = FusedForward(llm.runner.model, replace(eager_kernels(), gemv=wide_one_token_kernels()))
    calls = count_gemv_calls(llm)
    outputs = llm.generate(list(PROMPTS[:3]), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                           arrival_steps=PLAIN_ARRIVALS[:3])
    one_token = sum(sum(len(r.input_ids) for r in s.requests) + s.num_padding_rows == 1 for s in llm.trace)
    assert one_token > 0, "the staggered arrivals left no request decoding alone"
    assert len(calls) == one_token * len(llm.runner.forward.layers) and all(len(o.token_ids) == 8 for o in outputs)


def test_one_token_steps_routed_away_from_the_gemv_count_no_call(make_llm):
    """The negative control: a forward with the GEMV path whose one-token steps do not take it (an
    activation the kernels do not compute, so FusedForward routes every step to cuBLAS) counts
    zero calls beside one-token steps, which lossless's plain-runs test reports red."""
    llm = make_llm(trace=True)
    forward = FusedForward(llm.runner.model, replace(eager_kernels(), gemv=wide_one_token_kernels()))
    llm.runner.forward, forward.act = forward, "gelu_pytorch_tanh"
    calls = count_gemv_calls(llm)
    llm.generate(list(PROMPTS[:2]), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                 arrival_steps=[0, 3])
    assert calls == [] and any(sum(len(r.input_ids) for r in s.requests) == 1 for s in llm.trace)
