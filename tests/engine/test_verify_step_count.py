"""Every decode step is a verify step (engine/llm.py _apply, RequestStats.verify_steps), with
drafts or without: a request sampled on the host decodes at spec width 0 beside drafting ones,
and plain decoding verifies no drafts, yet each step emits a token. So for every request of every
run, completion tokens = prefills + verify steps + accepted - truncated, the identity that ties
vLLM's and SGLang's acceptance units (docs/engine.md)."""
import pytest

from engine import SamplingParams
from gates.workloads import no_immediate_repeat

PROMPTS = ["def main(", "for i in range(", "import numpy as np\n", "class A:"]


def identity_holds(out) -> bool:
    s = out.stats
    return len(out.token_ids) == s.num_prefills + s.verify_steps + s.num_accepted_tokens - s.num_truncated


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("spec", [None, "ngram"], ids=["plain", "ngram"])
def test_a_host_sampled_request_beside_drafting_ones_counts_each_decode_step(make_llm, spec, async_runner):
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True,
                             logits_processors=[no_immediate_repeat] if i == 1 else [])
              for i, m in enumerate((20, 16, 24, 9))]
    llm = make_llm(spec=spec, num_spec_tokens=3, max_num_seqs=4, async_runner=async_runner)
    outs = llm.generate(PROMPTS, params)
    assert all(identity_holds(o) for o in outs), [(len(o.token_ids), o.stats) for o in outs]
    host = outs[1].stats
    assert host.num_drafts == 0 and host.verify_steps == len(outs[1].token_ids) - host.num_prefills
    if spec:
        assert sum(o.stats.num_drafts for o in outs) > 0, "no request drafted beside the host-sampled one"
