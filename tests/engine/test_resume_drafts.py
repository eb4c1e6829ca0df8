"""A preempted request keeps the drafts it held, and its resume verifies them after recomputing
its history (engine/scheduler.py `resume_drafts`, `ModelRunner.keep_drafts`): preemption moves
no step boundary, so a seeded sampled request draws the tokens it draws unpreempted, with the
same acceptance counters, on both drafters and both runners."""
import dataclasses

import pytest
import torch

from engine import SamplingParams
from engine.device_state import DeviceState
from engine.request import Status
from gates.workloads import LONG_PROMPTS

K = 3
PROMPTS = [LONG_PROMPTS[i % len(LONG_PROMPTS)] for i in range(6)]
PARAMS = [SamplingParams(temperature=1.0, seed=100 + i, max_tokens=40, ignore_eos=True) for i in range(6)]
TIGHT = 18  # KV blocks: too few for six such requests, so some are preempted


def run(make_llm, drafter, num_kv_blocks, async_runner):
    llm = make_llm(spec=drafter, num_spec_tokens=K, max_num_seqs=6, num_kv_blocks=num_kv_blocks,
                   async_runner=async_runner, trace=True)
    return llm, llm.generate(PROMPTS, PARAMS)


def counters(stats):
    """What a request's acceptance looks like, whatever preemption did to it: each resume (a
    prefill) verified the drafts the unpreempted run verified in a verify step."""
    return dataclasses.replace(stats, num_preemptions=0, num_prefills=0,
                               verify_steps=stats.verify_steps + stats.num_preemptions)


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
def test_a_preempted_seeded_request_draws_the_tokens_it_draws_unpreempted(make_llm, drafter, async_runner):
    free_llm, free = run(make_llm, drafter, None, async_runner)
    tight_llm, tight = run(make_llm, drafter, TIGHT, async_runner)
    assert sum(o.stats.num_preemptions for o in free) == 0
    assert sum(o.stats.num_preemptions for o in tight) > 0, "the cache never filled: no preemption"
    for f, t in zip(free, tight):
        assert t.token_ids == f.token_ids, f"request {t.request_id}: preemption changed its tokens"
        assert counters(t.stats) == counters(f.stats), f"request {t.request_id}: preemption changed its acceptance"
        assert t.stats.num_prefills == 1 + t.stats.num_preemptions
        s = t.stats
        assert len(t.token_ids) == s.num_prefills + s.verify_steps + s.num_accepted_tokens - s.num_truncated
    # Each resume verified, after its history, the drafts the unpreempted run verified from the
    # same position, and drew the same tokens from them.
    unpreempted = {(r.request_id, r.window_position): r for s in free_llm.trace for r in s.requests
                   if not r.is_prefill}
    resumes = [r for s in tight_llm.trace for r in s.requests if r.is_prefill and r.draft_slots]
    assert len(resumes) == sum(o.stats.num_preemptions for o in tight)
    for r in resumes:
        u = unpreempted[r.request_id, r.window_position]
        assert r.draft_slots == K and r.window_position == len(r.input_ids) - 1 - K
        assert r.logits_indices == list(range(r.query_start + len(r.input_ids) - 1 - K,
                                              r.query_start + len(r.input_ids)))
        assert (r.draft_token_ids, r.num_draft, r.num_accepted, r.sampled) == \
            (u.draft_token_ids, u.num_draft, u.num_accepted, u.sampled)
        assert r.input_ids[-K:][:r.num_draft] == u.input_ids[1:1 + u.num_draft]  # the drafts fed
    assert any(r.num_draft for r in resumes), "no resume carried a draft"
    assert tight_llm.runner.state.preempted_drafts == {}, "drafts kept past their resume"


def test_drafts_leave_a_slot_and_come_back_in_another_unchanged():
    state = DeviceState(num_slots=4, max_len=8, k=2, vocab_size=5, with_q=True, device="cpu")
    state.draft_token_ids[1] = torch.tensor([7, 9])
    state.num_draft[1] = 1
    state.draft_probs[1] = torch.arange(10, dtype=torch.float32).view(2, 5)
    held = state.drafts_of(1)
    state.draft_token_ids[1], state.num_draft[1], state.draft_probs[1] = 0, 2, 0.5  # another request's
    state.give_drafts(3, held)
    assert state.draft_token_ids.tolist() == [[258] * 2, [0, 0], [258] * 2, [7, 9]]
    assert state.num_draft.tolist() == [0, 2, 0, 1]
    assert torch.equal(state.draft_probs[3], torch.arange(10, dtype=torch.float32).view(2, 5))
    assert torch.equal(state.draft_probs[1], torch.full((2, 5), 0.5))
    one_hot = DeviceState(num_slots=2, max_len=8, k=2, vocab_size=5, with_q=False, device="cpu")
    one_hot.num_draft[0] = 2
    assert one_hot.drafts_of(0).probs is None
    one_hot.give_drafts(1, one_hot.drafts_of(0))
    assert one_hot.num_draft.tolist() == [2, 2]


@pytest.mark.parametrize("end", ["abort", "finish"])
def test_a_request_ended_while_preempted_leaves_no_drafts_behind(make_llm, end):
    """Aborted, or finished by its step in flight read after it was preempted (async runner),
    while it waits to resume: what it held goes."""
    llm = make_llm(spec="ngram", num_spec_tokens=K, max_num_seqs=6, num_kv_blocks=TIGHT)
    reqs = [llm.add_request(p, sp) for p, sp in zip(PROMPTS, PARAMS)]
    while not any(r.status is Status.WAITING and r.stats.num_preemptions for r in reqs):
        llm.step()
    waiting = [r for r in reqs if r.status is Status.WAITING and r.stats.num_preemptions]
    assert set(llm.runner.state.preempted_drafts) >= {r.request_id for r in waiting}
    if end == "abort":
        llm.abort([r.request_id for r in waiting])
    else:
        for r in waiting:
            llm._finish(r, "length", llm.scheduler.step)
    assert not set(llm.runner.state.preempted_drafts) & {r.request_id for r in waiting}
    while llm.has_unfinished():
        llm.step()
    assert llm.runner.state.preempted_drafts == {}
