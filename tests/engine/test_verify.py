"""Verify alone: the greedy rule exactly, and rejection sampling by a chi-square test.

Rejection sampling is lossless when the token emitted at every draft position, and the bonus
token, is distributed as the target p. We draw N independent verify rounds as one batch of N
rows (each row its own key), and test each position's emitted tokens against p in float64.
Test: Pearson chi-square, reject at p-value < 1e-3 per position (about 0.4% family-wise false
failure over the 4 positions; deterministic here because the keys are fixed). Negative control:
the acceptance ratio computed against the wrong q (uniform, not the q the drafts came from), a
lossy acceptance rule, must fail the same test.
"""
import pytest
import torch

from engine.sampling import SamplingTensors
from engine.verify import verify
from gates.distribution import P_VALUE_THRESHOLD, position_p_values, verify_round

NUM_ROUNDS = 60_000
VOCAB, K = 6, 3


def _greedy_inputs(target_rows, drafts, num_draft):
    num_reqs, width = len(target_rows), len(target_rows[0])
    logits = torch.full((num_reqs, width, 10), -5.0)
    for r, row in enumerate(target_rows):
        for j, tok in enumerate(row):
            logits[r, j, tok] = 5.0
    zeros = torch.zeros(num_reqs)
    return dict(logits=logits, draft_token_ids=torch.tensor(drafts), num_draft=torch.tensor(num_draft),
                draft_probs=None, sampling=SamplingTensors(temperature=zeros, top_k=torch.full((num_reqs,), -1),
                                                           top_p=torch.ones(num_reqs), keys=torch.arange(num_reqs)),
                first_position=torch.zeros(num_reqs, dtype=torch.long))


def test_greedy_accepts_longest_matching_prefix_then_the_target_token():
    sampled, num_accepted = verify(**_greedy_inputs(
        target_rows=[[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [7, 7, 7, 7]],
        drafts=[[1, 2, 3], [1, 9, 3], [5, 2, 3], [7, 7, 7]],
        num_draft=[3, 3, 3, 1]))
    assert num_accepted.tolist() == [3, 1, 0, 1]
    assert sampled.tolist() == [[1, 2, 3, 4], [1, 2, -1, -1], [1, -1, -1, -1], [7, 7, -1, -1]]


def test_padded_drafts_are_never_accepted_even_when_they_match():
    sampled, num_accepted = verify(**_greedy_inputs([[1, 2, 3, 4]], [[1, 2, 3]], [0]))
    assert num_accepted.tolist() == [0]
    assert sampled.tolist() == [[1, -1, -1, -1]]


@pytest.mark.parametrize("drafter", ["sampled", "one-hot"])
def test_rejection_sampling_emits_the_target_distribution_at_every_position(drafter):
    results = position_p_values(*verify_round(NUM_ROUNDS, VOCAB, K, drafter, lossy=False))
    assert all(n >= 1000 for n, _ in results), results  # every position, the bonus too, was reached often
    assert all(pv > P_VALUE_THRESHOLD for _, pv in results), results


def test_negative_control_lossy_acceptance_fails_the_same_test():
    results = position_p_values(*verify_round(NUM_ROUNDS, VOCAB, K, "sampled", lossy=True))
    assert min(pv for _, pv in results) < P_VALUE_THRESHOLD, results


@pytest.mark.parametrize("k", [0, 1, 4])
def test_rows_without_drafts_draw_one_token(k):
    logits = torch.randn(3, k + 1, 10)
    sampled, num_accepted = verify(logits, torch.zeros(3, k, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                                   None, SamplingTensors(temperature=torch.zeros(3), top_k=torch.full((3,), -1),
                                                         top_p=torch.ones(3), keys=torch.arange(3)),
                                   torch.zeros(3, dtype=torch.long))
    assert num_accepted.tolist() == [0, 0, 0]
    assert sampled[:, 0].tolist() == logits[:, 0].argmax(-1).tolist()
    assert (sampled[:, 1:] == -1).all()
