"""The situations the peers' suites test (vLLM's rejection sampler and n-gram tests, SGLang's
speculative sampling tests) that specgate's own suite did not, each pinned exactly:

a batch mixing greedy and sampled rows in one verify call; top-k/top-p passed through verify;
speculative decoding that reaches max_model_len, sync and async; the exact correction token and
its key after a rejection; verify under a permutation of the batch; a large padded vocabulary
with a zero-mass tail and a -inf draft log-probability; a draft whose draft probability is 0;
ties at the k-th logit (every tied token kept); and the order top-k, renormalise, then top-p
(vLLM's; SGLang's cuts top-p over the un-renormalised top-k mass).
"""
import math

import pytest
import torch

from engine import SamplingParams
from engine.sampling import STREAM_ACCEPT, SamplingTensors, keyed_uniform, processed_probs, sample_from_probs
from engine.verify import verify


def tensors(temperature, top_k, top_p, keys) -> SamplingTensors:
    n = len(keys)
    return SamplingTensors(temperature=torch.as_tensor(temperature, dtype=torch.float32).expand(n).clone(),
                           top_k=torch.as_tensor(top_k).expand(n).clone(),
                           top_p=torch.as_tensor(top_p, dtype=torch.float32).expand(n).clone(),
                           keys=torch.as_tensor(keys))


def random_case(num_reqs, k, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_reqs, k + 1, vocab, generator=gen) * 2
    q = torch.softmax(torch.randn(num_reqs, k, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(num_reqs, k)
    num_draft = torch.randint(0, k + 1, (num_reqs,), generator=gen)
    keys = torch.randint(0, 1 << 62, (num_reqs,), generator=gen)
    first_position = torch.randint(1, 500, (num_reqs,), generator=gen)
    return logits, drafts, num_draft, q, keys, first_position


def rows_of(sampling: SamplingTensors, index) -> SamplingTensors:
    return SamplingTensors(*(getattr(sampling, f)[index] for f in ("temperature", "top_k", "top_p", "keys")))


def test_a_batch_mixing_greedy_and_sampled_rows_verifies_each_row_as_if_alone():
    num_reqs, k, vocab = 16, 3, 7
    logits, drafts, num_draft, q, keys, first = random_case(num_reqs, k, vocab, 1)
    temperature = torch.tensor([0.0, 1.0] * (num_reqs // 2))
    sampling = SamplingTensors(temperature, torch.full((num_reqs,), -1), torch.ones(num_reqs), keys)
    # A greedy row's q is the one-hot its drafter proposes; the batch is verified with one q tensor.
    q = torch.where((temperature == 0)[:, None, None], torch.nn.functional.one_hot(drafts, vocab).float(), q)
    sampled, accepted = verify(logits, drafts, num_draft, q, sampling, first)
    for r in range(num_reqs):
        alone_s, alone_a = verify(logits[r:r + 1], drafts[r:r + 1], num_draft[r:r + 1], q[r:r + 1],
                                  rows_of(sampling, slice(r, r + 1)), first[r:r + 1])
        assert sampled[r].tolist() == alone_s[0].tolist() and int(accepted[r]) == int(alone_a[0])
    for r in range(0, num_reqs, 2):  # greedy rows: the longest prefix matching the argmax, then the argmax
        target = logits[r].argmax(-1)
        n = 0
        while n < num_draft[r] and drafts[r, n] == target[n]:
            n += 1
        assert int(accepted[r]) == n and int(sampled[r, n]) == int(target[n])


@pytest.mark.parametrize("top_k, top_p", [(2, 1.0), (-1, 0.5), (3, 0.6)])
def test_top_k_and_top_p_pass_through_verify(top_k, top_p):
    """Every token verify emits, accepted draft or correction or bonus, lies in p's support after
    top-k/top-p, even when the drafts come from a q that ignores the cuts."""
    num_reqs, k, vocab = 2000, 3, 8
    logits, drafts, num_draft, q, keys, first = random_case(num_reqs, k, vocab, 2)
    sampling = tensors(1.0, top_k, top_p, keys)
    sampled, accepted = verify(logits, drafts, num_draft, q, sampling, first)
    support = sampling.probs(logits) > 0
    assert support.sum(-1).max() < vocab, "the cut removed nothing"
    emitted = torch.arange(k + 1) <= accepted[:, None]
    in_support = support.gather(-1, sampled.clamp_min(0)[..., None])[..., 0]
    assert bool(in_support[emitted].all())


def test_the_correction_after_a_rejection_is_the_residual_draw_with_its_own_position_key():
    """Draft 0 is certain to be rejected (p(x_0) = 0): the correction must be exactly
    sample_from_probs(max(0, p - q), key, first_position), nothing else."""
    num_reqs, k, vocab = 64, 2, 6
    logits, drafts, num_draft, q, keys, first = random_case(num_reqs, k, vocab, 3)
    num_draft = torch.full((num_reqs,), k)
    rows = torch.arange(num_reqs)
    logits[rows, 0, drafts[:, 0]] = -math.inf
    sampled, accepted = verify(logits, drafts, num_draft, q, tensors(1.0, -1, 1.0, keys), first)
    assert accepted.tolist() == [0] * num_reqs
    p0 = torch.softmax(logits[:, 0], -1)
    expected = sample_from_probs((p0 - q[:, 0]).clamp_min(0), keys, first)
    assert sampled[:, 0].tolist() == expected.tolist()
    assert sampled[:, 1:].tolist() == [[-1] * k] * num_reqs
    # The acceptance uniform and the correction draw use different streams of the same key.
    assert not torch.equal(keyed_uniform(keys, first, STREAM_ACCEPT, 1), keyed_uniform(keys, first, 0, 1))


def test_verify_results_follow_the_rows_under_a_permutation_of_the_batch():
    num_reqs, k, vocab = 32, 4, 9
    logits, drafts, num_draft, q, keys, first = random_case(num_reqs, k, vocab, 4)
    temperature = torch.rand(num_reqs, generator=torch.Generator().manual_seed(4)).round()
    sampling = SamplingTensors(temperature, torch.full((num_reqs,), 3), torch.full((num_reqs,), 0.9), keys)
    sampled, accepted = verify(logits, drafts, num_draft, q, sampling, first)
    perm = torch.randperm(num_reqs, generator=torch.Generator().manual_seed(5))
    sampled_p, accepted_p = verify(logits[perm], drafts[perm], num_draft[perm], q[perm], rows_of(sampling, perm),
                                   first[perm])
    assert torch.equal(sampled_p, sampled[perm]) and torch.equal(accepted_p, accepted[perm])


def test_a_large_padded_vocabulary_with_a_zero_mass_tail_and_minus_inf_draft_log_probs():
    """vocab 32,064 of which only the first 1,000 are real: the tail's logits are -inf in p and its
    mass is 0 in q (log q = -inf); nothing may be NaN, and no tail token may ever be emitted."""
    num_reqs, k, vocab, real = 64, 3, 32_064, 1000
    gen = torch.Generator().manual_seed(6)
    logits = torch.full((num_reqs, k + 1, vocab), -math.inf)
    logits[..., :real] = torch.randn(num_reqs, k + 1, real, generator=gen)
    q_logits = torch.full((num_reqs, k, vocab), -math.inf)
    q_logits[..., :real] = torch.randn(num_reqs, k, real, generator=gen)
    q = torch.softmax(q_logits, -1)
    assert q[..., real:].eq(0).all() and not q.isnan().any()
    keys = torch.arange(num_reqs) * 977 + 5
    drafts = sample_from_probs(q, keys[:, None], torch.arange(1, k + 1).expand(num_reqs, -1), 2)
    sampling = tensors(1.0, 50, 0.95, keys)
    sampled, accepted = verify(logits, drafts, torch.full((num_reqs,), k), q, sampling,
                               torch.ones(num_reqs, dtype=torch.long))
    emitted = sampled[torch.arange(k + 1) <= accepted[:, None]]
    assert emitted.min() >= 0 and emitted.max() < real
    assert not sampling.probs(logits).isnan().any()


def test_a_draft_whose_draft_probability_is_zero():
    """q(x) = 0 cannot come from drawing x from q, but verify must stay defined: the ratio is
    p(x) / max(q(x), 1e-30), so the draft is accepted when p(x) > 0 and rejected when p(x) = 0
    (then the correction comes from the residual, which never holds x)."""
    vocab = 4
    probs = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]] * 2)
    logits = torch.where(probs > 0, probs.log(), torch.tensor(-math.inf))
    q = torch.tensor([[[0.0, 0.0, 0.5, 0.5]], [[0.0, 0.0, 0.5, 0.5]]])
    drafts = torch.tensor([[0], [2]])            # row 0: q(x)=0, p(x)=.5; row 1: q(x)=0, p(x)=0
    sampled, accepted = verify(logits, drafts, torch.tensor([1, 1]), q, tensors(1.0, -1, 1.0, [11, 12]),
                               torch.tensor([3, 3]))
    assert accepted.tolist() == [1, 0]
    assert int(sampled[0, 0]) == 0 and 0 <= int(sampled[0, 1]) < vocab
    assert int(sampled[1, 0]) in (0, 1) and int(sampled[1, 1]) == -1


def test_ties_at_the_k_th_logit_keep_every_tied_token():
    """Three tokens tie at the 2nd-largest logit with top_k = 2: the largest and all three tied are
    kept (vLLM's and transformers' rule: a logit equal to the k-th stays), never a choice among
    equals that a sort or topk would make."""
    logits = torch.tensor([[5.0, 1.0, 3.0, 3.0, 0.0, 3.0]])
    probs = processed_probs(logits, torch.ones(1), torch.tensor([2]), torch.ones(1))
    assert probs[0].tolist() == torch.softmax(torch.tensor([5.0, -math.inf, 3.0, 3.0, -math.inf, 3.0]), -1).tolist()


def test_top_k_renormalises_before_top_p():
    """p = [.4, .3, .2, .1], top_k 2, top_p .5: over the top 2 renormalised (.571, .429) the
    first token alone reaches .5, so one token is kept (vLLM's order). Cutting top-p over the
    un-renormalised mass (.4 < .5) would keep two (SGLang's)."""
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log()
    probs = processed_probs(logits, torch.ones(1), torch.tensor([2]), torch.tensor([0.5]))
    assert probs[0].tolist() == [1.0, 0.0, 0.0, 0.0]
    both = processed_probs(logits, torch.ones(1), torch.tensor([2]), torch.tensor([0.6]))
    assert both[0, :2].tolist() == pytest.approx([4 / 7, 3 / 7]) and both[0, 2:].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("spec", ["ngram", "block"])
def test_spec_decoding_that_reaches_max_model_len(make_llm, spec, async_runner):
    """Prompts that reach the context inside a verify step end exactly at max_model_len, with
    "context" (or "length" where max_tokens is reached on the same token), and their tokens are
    plain greedy's."""
    prompts = ["x = 1\n" * 12, "def main(", "class Foo:\n    def __init__(self):\n        self.x = 1\n"]
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    plain = make_llm(max_model_len=96, async_runner=False).generate(prompts, params)
    outs = make_llm(spec=spec, num_spec_tokens=4, max_model_len=96, async_runner=async_runner).generate(prompts, params)
    reached = 0
    for o, ref in zip(outs, plain):
        assert o.token_ids == ref.token_ids
        total = len(o.prompt_token_ids) + len(o.token_ids)
        assert total <= 96 and o.finish_reason == ("length" if len(o.token_ids) == 60 else "context")
        reached += total == 96
    assert reached >= 2
    assert sum(o.stats.num_accepted_tokens for o in outs) > 0
