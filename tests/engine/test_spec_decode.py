"""Greedy speculative decoding gives token for token the output of plain greedy decoding.

Both drafters, k from 1 to 6, 1 to 8 requests with mixed prompt lengths, arrival steps and
max_tokens, with and without preemption. Each test asserts that what it claims to cover
happened (several requests in a step, drafts accepted, a preemption).
"""
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from gates.workloads import workloads
from helpers.strategies import MAX_TOKENS, PROMPT_POOL, examples

DRAFTERS = ["ngram", "block"]


@pytest.fixture(scope="module")
def plain_reference(make_llm):
    """Plain greedy output of every pool prompt; a shorter max_tokens gives a prefix of it."""
    outs = make_llm(async_runner=False).generate(PROMPT_POOL, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    return {p: o.token_ids for p, o in zip(PROMPT_POOL, outs)}


def run_batch(llm, batch):
    params = [SamplingParams(temperature=0, max_tokens=m) for m in batch.max_tokens]
    return llm.generate(list(batch.prompts), params, arrival_steps=list(batch.arrival_steps))


def assert_matches_plain(outs, batch, reference):
    for i, (out, prompt, m) in enumerate(zip(outs, batch.prompts, batch.max_tokens)):
        assert out.token_ids == reference[prompt][:m], f"request {i} ({prompt[:20]!r}) differs from plain greedy"


@pytest.mark.parametrize("drafter", DRAFTERS)
@given(batch=workloads(), k=st.integers(1, 6))
@examples(8)
def test_greedy_spec_equals_plain(make_llm, plain_reference, drafter, batch, k):
    llm = make_llm(spec=drafter, num_spec_tokens=k, trace=True, max_num_seqs=4)
    outs = run_batch(llm, batch)
    assert_matches_plain(outs, batch, plain_reference)
    if batch.num_reqs > 1 and len(set(batch.arrival_steps)) == 1:
        assert max(step.num_reqs for step in llm.trace) > 1, "no step ran several requests"


@pytest.mark.parametrize("drafter", DRAFTERS)
@given(batch=workloads(min_reqs=3, max_reqs=6, long_prompts=True), k=st.integers(1, 6))
@examples(5)
def test_greedy_spec_equals_plain_under_preemption(make_llm, plain_reference, drafter, batch, k):
    llm = make_llm(spec=drafter, num_spec_tokens=k, max_num_seqs=6, num_kv_blocks=18,
                   max_model_len=256)
    batch = dataclasses.replace(batch, arrival_steps=(0,) * batch.num_reqs, max_tokens=(MAX_TOKENS,) * batch.num_reqs)
    outs = run_batch(llm, batch)
    assert_matches_plain(outs, batch, plain_reference)
    assert sum(o.stats.num_preemptions for o in outs) > 0, "the cache never filled: no preemption"


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_drafts_are_accepted(make_llm, drafter):
    outs = make_llm(spec=drafter, num_spec_tokens=4).generate(
        PROMPT_POOL, SamplingParams(temperature=0, max_tokens=MAX_TOKENS))
    accepted = sum(o.stats.num_accepted_tokens for o in outs)
    drafted = sum(o.stats.num_draft_tokens for o in outs)
    assert drafted > 0 and accepted / drafted > 0.2, (accepted, drafted)


def test_a_graph_bucket_padded_past_the_token_budget_fits_the_staging(make_llm):
    """Six verify rows of k+1 = 5 tokens fit a 30-token budget; their graph bucket of 8 rows is
    40 tokens, more than the budget: staging is sized for the largest bucket, not the budget."""
    llm = make_llm(spec="ngram", num_spec_tokens=4, graph=True, async_runner=True, max_num_seqs=8,
                   max_num_batched_tokens=30, max_model_len=30, trace=True)
    outs = llm.generate(["x" * (3 + i) for i in range(8)], SamplingParams(temperature=0, max_tokens=12,
                                                                          ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12] * 8
    padded = [s for s in llm.trace if s.route.endswith("/graph")
              and (s.num_reqs + s.num_padding_rows) * 5 > 30]
    assert padded, "no graph step was padded past the token budget"
