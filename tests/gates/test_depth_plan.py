"""The depth gate's plans and its two judgements, on figures written by hand: the level of each
depth bucket, and the plain step's growth against the KV read it adds."""
import pytest

from engine.bench.models import shape_named
from engine.bench.oracle import acceptance_for_tau, tokens_per_step_moments
from gates.depth import BAND, PLANS, STEP_GROWTH_FACTOR, TAU, K, level_difference, plan_for, step_growth_difference


@pytest.mark.parametrize("device, profile, name", [("cpu", "ci", "cpu"), ("cpu", "mutation", "cpu"),
                                                   ("cpu", "deep", "cpu-deep"), ("cuda", "ci", "cuda"),
                                                   ("cuda:1", "deep", "cuda")])
def test_the_plan_follows_the_device_and_the_profile(device, profile, name):
    assert plan_for(device, profile).name == name


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_plan_fits_its_folder_and_has_a_request_in_every_bucket_but_the_last(name):
    plan = PLANS[name]
    assert plan.max_model_len <= shape_named(plan.shape).max_position_embeddings
    starts = {p // plan.bucket for p in plan.prompt_lens}
    assert starts | {plan.num_buckets - 1} == set(range(plan.num_buckets))
    assert len(plan.prompt_lens) == len(plan.max_tokens)


def test_the_cuda_plan_runs_past_32768_plus_1024_positions_and_the_deep_cpu_plan_past_8k():
    assert PLANS["cuda"].deepest >= 32768 + 1024 and PLANS["cuda"].deepest // PLANS["cuda"].bucket == 4
    assert PLANS["cpu-deep"].deepest >= 8192 and PLANS["cpu"].deepest == 4072


def test_a_bucket_is_judged_against_the_band_around_tau():
    mean, variance = tokens_per_step_moments(acceptance_for_tau(TAU, K), K)
    n = 25
    half = BAND * (variance / n) ** 0.5
    assert level_difference({0: (n, mean), 1: (n, mean + 0.99 * half)}, 1024) is None
    diff = level_difference({0: (n, mean), 1: (n, mean - 1.01 * half), 2: (n, 1.0)}, 1024)
    assert diff is not None and diff.position == 1024  # the first bucket out of the band, by its depth
    assert level_difference({3: (n, 1.0)}, 2048).position == 3 * 2048  # a collapse to one token a step


def test_the_step_may_grow_by_the_factor_times_its_added_kv_read_and_no_more():
    kv = {16: 0.001, 8208: 0.25, 32720: 1.0}
    allowed = {d: STEP_GROWTH_FACTOR * (v - kv[16]) for d, v in kv.items()}
    at_limit = {d: 3.0 + 0.999 * allowed[d] for d in kv}
    assert step_growth_difference(at_limit, kv) is None
    over = {**at_limit, 32720: 3.0 + allowed[32720] + 0.01}
    diff = step_growth_difference(over, kv)
    assert diff is not None and diff.position == 32720
    assert step_growth_difference({16: 3.0, 8208: 2.9, 32720: 3.0}, kv) is None  # faster deeper is fine
