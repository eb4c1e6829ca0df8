"""The lossless gate's statistical machinery (gates/distribution.py) on known answers: the target
distribution p it recomputes for every emitted token (a bigram stand-in model, so p is known), the
uniformity test's p-value for a histogram worked out by hand, the negative control's acceptance
rule, and the verify-level rounds (what each drafter proposes, and a fixed draw)."""
import math

import numpy as np
import pytest
import torch
from scipy.stats import chi2

from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.sampling import SamplingParams, SamplingTensors
from engine.verify import verify
from gates.distribution import sequence_probs, uniformity_p_value, verify_round, wrong_q_verify


class BigramModel(torch.nn.Module):
    """forward_dense as the engine's models have it; the logits after token t are table[t]."""

    def __init__(self, probs: list[list[float]]):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(probs, dtype=torch.float64).log(), requires_grad=False)

    def forward_dense(self, ids):
        return self.table[ids], None


NEXT = [[0.5, 0.25, 0.125, 0.125], [0.25] * 4, [0.125, 0.125, 0.25, 0.5], [0.25] * 4]  # after tokens 0..3
W = 2 ** -1.25   # (1/2) ** (1 / 0.8): temperature 0.8 raises p to the power 1.25


@pytest.mark.parametrize("sp, after_0, after_2", [
    (SamplingParams(), NEXT[0], NEXT[2]),
    (SamplingParams(temperature=0.5, top_k=2), [0.8, 0.2, 0, 0], [0, 0, 0.2, 0.8]),   # p ** 2, its top two
    (SamplingParams(temperature=0.8, top_p=0.7), [1 / (1 + W), W / (1 + W), 0, 0], [0, 0, W / (1 + W), 1 / (1 + W)]),
    (SamplingParams(temperature=0.0), [1, 0, 0, 0], [0, 0, 0, 1]),
], ids=["plain", "temperature-top-k", "temperature-top-p", "greedy"])
def test_row_t_is_the_processed_distribution_of_token_t_plus_1(sp, after_0, after_2):
    out = RequestOutput(0, None, [0], [2, 0], "", "length", RequestStats())
    probs = sequence_probs(BigramModel(NEXT), out, sp)
    assert probs.dtype == np.float64 and probs.shape == (2, 4)
    np.testing.assert_allclose(probs, [after_0, after_2], rtol=0, atol=1e-14)


def test_top_p_is_applied_in_float64():
    """p(0) = 0.1 + 9e-12, ten tokens share the rest: with top_p 0.1 the mass before the second
    token is not under 0.1, so only token 0 is kept. In float32, 0.1 is 0.10000000149 and a
    second token would get in."""
    row = [math.exp(1e-10) * 10 / 9] + [1.0] * 10
    out = RequestOutput(0, None, [0], [0], "", "length", RequestStats())
    probs = sequence_probs(BigramModel([[v / sum(row) for v in row]] * 11), out, SamplingParams(top_p=0.1))
    assert probs.tolist() == [[1.0] + [0.0] * 10]


def test_the_uniformity_p_value_is_pearson_s_over_twenty_bins_of_the_unit_interval():
    """100 values, all under 0.5: ten bins of 10 and ten empty ones, 5 expected in each, so the
    statistic is 20 * 25 / 5 = 100 on 19 degrees of freedom."""
    u = (np.arange(100) + 0.5) / 200
    assert uniformity_p_value(u) == chi2.sf(100, 19)
    assert uniformity_p_value(u, bins=10) == chi2.sf(100, 9)


def test_the_negative_control_accepts_every_draft_the_target_rates_at_least_one_in_vocab():
    """wrong_q_verify takes the ratio against a uniform q: a draft with p(x) = 0.3 >= 1/4 is always
    accepted, where the drafter's own q (all its mass on the draft) accepts it 30% of the time."""
    n = 400
    logits = torch.tensor([[0.4, 0.3, 0.2, 0.1]] * 2).log().expand(n, -1, -1).clone()
    drafts, q = torch.ones(n, 1, dtype=torch.long), torch.tensor([0.0, 1.0, 0.0, 0.0]).expand(n, 1, 4)
    sampling = SamplingTensors(temperature=torch.ones(n), top_k=torch.full((n,), -1), top_p=torch.ones(n),
                               keys=torch.arange(n))
    args = (logits, drafts, torch.ones(n, dtype=torch.long), q, sampling, torch.ones(n, dtype=torch.long))
    assert wrong_q_verify(*args)[1].tolist() == [1] * n
    assert 0.2 < verify(*args)[1].float().mean() < 0.4


def test_the_negative_control_runs_on_the_logits_device():
    """The lossy engine's negative control verifies on the GPU; its uniform q must be made where
    the logits are, or verify fails on the device mismatch. Meta stands in for the GPU: verify's
    real code runs on it and refuses a CPU q as CUDA does."""
    n, meta = 2, torch.device("meta")
    sampling = SamplingTensors(temperature=torch.ones(n, device=meta), top_k=torch.full((n,), -1, device=meta),
                               top_p=torch.ones(n, device=meta), keys=torch.arange(n, device=meta))
    ones = torch.ones(n, dtype=torch.long, device=meta)
    sampled, num_accepted = wrong_q_verify(torch.zeros(n, 2, 4, device=meta), ones[:, None], ones, None, sampling, ones)
    assert (sampled.device, sampled.shape, num_accepted.device) == (meta, (n, 2), meta)


def test_the_one_hot_drafter_proposes_p_s_most_likely_tokens_and_the_sampled_one_draws_from_q():
    p, sampled, num_accepted = verify_round(300, 6, 3, "one-hot", lossy=False)
    accepted = [(r, j) for r in range(300) for j in range(int(num_accepted[r]))]
    assert accepted and all(sampled[r, j] == p[j].argmax() for r, j in accepted)
    p, sampled, num_accepted = verify_round(300, 6, 3, "sampled", lossy=False)
    assert len({int(sampled[r, 0]) for r in range(300) if num_accepted[r] > 0}) > 1


PINNED_P = [[0.7692, 0.0491, 0.0029, 0.1788], [0.0347, 0.0217, 0.3232, 0.6204], [0.1303, 0.2093, 0.1566, 0.5037]]
PINNED_SAMPLED = [[0, -1, -1]] * 2 + [[3, 2, -1]] + [[0, -1, -1]] * 7 + [[3, 3, -1], [0, -1, -1]]
PINNED_ACCEPTED = [0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0]


def test_the_verify_rounds_are_a_fixed_draw():
    """The gate records the p-values of this draw as evidence; they can be reproduced only if the
    same call draws the same rounds. Pinned (a small draw) so that a change of the draw, its
    seed, its logits' scale or its rounds' keys, is made on purpose."""
    first, again = verify_round(12, 4, 2, "sampled", lossy=False), verify_round(12, 4, 2, "sampled", lossy=False)
    assert all((a == b).all() for a, b in zip(first, again))
    p, sampled, num_accepted = first
    assert np.round(p, 4).tolist() == PINNED_P
    assert sampled.tolist() == PINNED_SAMPLED and num_accepted.tolist() == PINNED_ACCEPTED
