"""Every tensor the engine makes is placed on the engine's device explicitly.

A tensor created without `device=` lands on torch's default device: on a CUDA engine that is the
CPU, and the step fails (or, worse, syncs) only on the GPU. CI has no GPU, so the check makes
the default device "meta" (tensors without data): any tensor that falls back to it breaks the run
or its tokens, while a correct engine, whose every tensor names its device, runs unchanged."""
import pytest
import torch

from engine import SamplingParams
from gates.workloads import no_immediate_repeat

PROMPTS = ["def main(", "import os\nimport sys\n", "x = 1\n" * 6, "class Foo:\n    def __init__(self):\n"]
PARAMS = [SamplingParams(max_tokens=30),
          SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_tokens=24),
          SamplingParams(temperature=1.0, max_tokens=20, logits_processors=[no_immediate_repeat]),
          SamplingParams(max_tokens=25, stop_token_ids=[10])]
ARRIVALS = [0, 0, 2, 3]


def run(make_llm, **engine):
    llm = make_llm(max_model_len=64, max_num_seqs=3, num_kv_blocks=5, seed=3, **engine)
    outs = llm.generate(PROMPTS, PARAMS, arrival_steps=ARRIVALS)
    return [(o.token_ids, o.stats.num_preemptions, o.stats.num_draft_tokens, o.stats.num_accepted_tokens)
            for o in outs]


@pytest.mark.parametrize("spec, async_runner, graph", [
    (None, True, True), ("ngram", True, False), ("block", False, False), ("block", True, True)],
    ids=["plain-async-graph", "ngram-async", "block-sync", "block-async-graph"])
def test_no_tensor_falls_back_to_the_default_device(make_llm, spec, async_runner, graph):
    """Same tokens, preemptions and acceptance with "meta" as the default device: a stray tensor
    would break the run, or (indexing with a meta tensor reads garbage) change the drafts, which
    lossless verify hides from the tokens but not from acceptance."""
    engine = dict(async_runner=async_runner, graph=graph)
    if spec:
        engine.update(spec=spec, num_spec_tokens=3)
    expected = run(make_llm, **engine)
    assert sum(preemptions for _, preemptions, _, _ in expected) > 0, "resumes must be covered too"
    with torch.device("meta"):
        assert run(make_llm, **engine) == expected
