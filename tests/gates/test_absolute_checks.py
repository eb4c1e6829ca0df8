"""The gates' absolute checks on their own: the reference decoder's finish rule
(gates/reference.py) and the stored-draft-q check and support chi-square (gates/draft_q.py),
each shown to say no on the input it exists to catch."""
import numpy as np
import pytest
import torch

from engine import SamplingParams
from engine.sampling import STREAM_DRAFT, processed_probs, sample_from_probs
from gates.draft_q import draft_q_difference, support_p_value
from gates.reference import ReferenceDecoder

PROMPT = "for i in range(10):\n    print(i)\nfor j in range(10):\n    "


@pytest.fixture(scope="module")
def decoder_and_prompt(make_llm):
    llm = make_llm()
    return ReferenceDecoder(llm.model, llm.eos_token_ids), llm.tokenizer.encode(PROMPT), llm


def test_the_reference_stream_is_plain_greedy_and_each_finish_rule_ends_it(decoder_and_prompt):
    ref, prompt, llm = decoder_and_prompt
    plain = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].token_ids
    assert ref.stream(prompt, (), 20) == plain
    stop = plain[5]
    e = ref.expected(prompt, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop]), 256)
    assert (e.token_ids, e.finish_reason, e.trigger) == (plain[:plain.index(stop) + 1], "stop", "stop_token_ids")
    e = ref.expected(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), len(prompt) + 7)
    assert (e.token_ids, e.finish_reason, e.trigger) == (plain[:7], "context", "max_model_len")
    e = ref.expected(prompt, SamplingParams(temperature=0, max_tokens=4), 256)
    assert (e.token_ids, e.trigger) == (plain[:4], "max_tokens")


def test_the_reference_ends_on_eos_unless_ignore_eos(decoder_and_prompt):
    ref, prompt, _ = decoder_and_prompt
    stream = ref.stream(prompt, (), 12)
    eos_ref = ReferenceDecoder(ref.model, {stream[3]})   # pretend the 4th token is an EOS id
    e = eos_ref.expected(prompt, SamplingParams(temperature=0, max_tokens=12), 256)
    assert (e.token_ids, e.finish_reason, e.trigger) == (stream[:4], "stop", "eos")
    e = eos_ref.expected(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), 256)
    assert (e.token_ids, e.trigger, e.eos_ignored) == (stream, "max_tokens", True)


def test_a_wrong_hint_does_not_change_the_reference(decoder_and_prompt):
    ref, prompt, _ = decoder_and_prompt
    fresh = ReferenceDecoder(ref.model, ref.eos_token_ids)
    want = ref.stream(prompt, (), 15)
    assert fresh.stream(prompt, (), 15, hint=want[:6] + [(want[6] + 1) % 256] * 9) == want


def proposal(seed=0, num_reqs=6, k=3, vocab=40, top_k=5, top_p=0.8, temperature=0.8):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_reqs, k, vocab, generator=gen) * 2
    t, kk, pp = torch.full((num_reqs,), temperature), torch.full((num_reqs,), top_k), torch.full((num_reqs,), top_p)
    q = processed_probs(logits, t[:, None], kk[:, None], pp[:, None])
    keys = torch.arange(num_reqs) * 31 + 7
    committed = torch.randint(5, 50, (num_reqs,), generator=gen)
    drafts = sample_from_probs(q, keys[:, None], committed[:, None] + torch.arange(k), STREAM_DRAFT)
    return dict(drafts=drafts, q=q, logits=logits, num_committed=committed, temperature=t, top_k=kk, top_p=pp,
                keys=keys)


def test_a_faithful_draft_q_passes():
    assert draft_q_difference([proposal(seed) for seed in range(4)]) is None


def test_q_taken_before_top_k_and_top_p_is_caught():
    call = proposal()
    call["q"] = torch.softmax(call["logits"] / 0.8, -1)
    diff = draft_q_difference([call])
    assert diff is not None and "support" in diff.what
    assert len(diff.expected) <= 5 and len(diff.actual) == 40


def test_q_that_cuts_a_tied_k_th_logit_by_rank_is_caught_at_its_row():
    """Row 4, draft 1 has its 5th and 6th largest logits tied: a q that keeps exactly 5 by rank
    (the sort's choice among equals) is named there; the engine's rule keeps both."""
    call = proposal()
    row = call["logits"][4, 1]
    order = row.argsort(descending=True)
    row[order[5]] = row[order[4]]
    call["q"] = processed_probs(call["logits"], call["temperature"][:, None], call["top_k"][:, None],
                                torch.ones(6, 1))
    call["top_p"] = torch.ones(6)
    tied = call["q"][4, 1].clone()
    assert int((tied > 0).sum()) == 6
    tied[order[5]] = 0
    call["q"][4, 1] = tied / tied.sum()
    call["drafts"] = sample_from_probs(call["q"], call["keys"][:, None],
                                       call["num_committed"][:, None] + torch.arange(3), STREAM_DRAFT)
    diff = draft_q_difference([call])
    assert diff is not None and "sampled row 4, draft 1" in diff.what
    assert (len(diff.expected), len(diff.actual)) == (6, 5)


def test_q_at_another_temperature_is_caught():
    call = proposal()
    call["q"] = processed_probs(call["logits"], torch.ones(6, 1), call["top_k"][:, None], call["top_p"][:, None])
    assert draft_q_difference([call]) is not None


def test_drafts_not_drawn_from_the_stored_q_are_caught():
    call = proposal()
    call["drafts"] = sample_from_probs(call["q"], call["keys"][:, None] + 1,
                                       call["num_committed"][:, None] + torch.arange(3), STREAM_DRAFT)
    diff = draft_q_difference([call])
    assert diff is not None and ("redrawn" in diff.what or "q(draft)" in diff.what)


def test_support_chi_square_fails_a_token_outside_the_support_and_passes_a_fair_sample():
    p = np.array([0.5, 0.3, 0.2, 0.0])
    assert support_p_value(np.array([50, 30, 19, 1]), p) == 0.0
    assert support_p_value(np.array([500, 300, 200, 0]), p) > 0.5
    assert support_p_value(np.array([900, 50, 50, 0]), p) < 1e-3
    assert support_p_value(np.array([10, 0, 0, 0]), np.array([1.0, 0, 0, 0])) == 1.0


def test_bigram_repeats_decides_whether_any_ngram_draft_could_be_accepted():
    """lossless waives its bf16 accepted-draft claim only on this proof: an n-gram draft equals the
    greedy token only where that token completes a bigram seen earlier (prompt or output)."""
    from gates.reference import bigram_repeats
    assert not bigram_repeats([1, 2, 3, 4, 5, 6], start=3)
    assert bigram_repeats([1, 2, 3, 1, 2], start=3)        # output 2 completes (1, 2) from the prompt
    assert bigram_repeats([7, 8, 9, 8, 9], start=2)        # inside the output
    assert not bigram_repeats([1, 2, 1, 2, 5, 6], start=4)  # the repeat is inside the prompt only
    assert not bigram_repeats([4, 4], start=2)             # nothing generated
