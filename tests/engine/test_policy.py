"""The runner policy (engine/policy.py): the one place the sync and async runners differ, and
the step result row (engine/step_result.py), packed and read in one place."""
import pytest
import torch

from engine.config import EngineConfig
from engine.policy import ASYNC, REFUSE_HOST_HISTORY, REFUSE_PREFILL, REFUSE_RESUMED, SYNC, RunnerPolicy, kv_lookahead
from engine.request import Request
from engine.sampling import SamplingParams
from engine.step_result import StepResult
from engine.veto import ENV_VAR, runner_policy


def keep(ids, logits):
    return logits


def request(resumed=False, **params) -> Request:
    return Request(0, [1, 2, 3], SamplingParams(**params), rng_key=0, is_resumed=resumed)


def test_each_policy_answers_every_question_the_runners_differ_on():
    plain, host, resumed = request(), request(logits_processors=[keep]), request(resumed=True)
    assert (SYNC.num_inflight_steps, SYNC.route, SYNC.completes_late) == (0, "sync", False)
    assert (ASYNC.num_inflight_steps, ASYNC.route, ASYNC.completes_late) == (1, "async", True)
    # The sync runner feeds every row from the host and gives no reason.
    assert [SYNC.feed(r, p) for r, p in [(plain, True), (resumed, True), (plain, False), (host, False)]] \
        == [(False, None)] * 4
    assert [ASYNC.feed(r, p) for r, p in [(plain, True), (resumed, True), (plain, False), (host, False)]] \
        == [(False, REFUSE_PREFILL), (False, REFUSE_RESUMED), (True, None), (False, REFUSE_HOST_HISTORY)]
    assert ASYNC.drains_before_schedule([plain, host]) and not ASYNC.drains_before_schedule([plain])
    assert not SYNC.drains_before_schedule([plain, host])


@pytest.mark.parametrize("k", [0, 1, 4])
def test_the_kv_cache_holds_what_the_async_scheduler_reserves(k):
    """One rule for the step in flight: the positions a request may write (config) are exactly
    its context plus the async scheduler's lookahead."""
    cfg = EngineConfig(model="unused", spec="ngram" if k else None, num_spec_tokens=max(k, 1), max_model_len=40)
    assert cfg.max_positions == cfg.max_model_len + ASYNC.kv_lookahead(cfg.k) == cfg.max_model_len + 2 * cfg.k + 1
    assert SYNC.kv_lookahead(cfg.k) == kv_lookahead(cfg.k, 0) == cfg.k


@pytest.mark.parametrize("env, spec, requested, is_async", [
    (None, None, None, True), (None, "ngram", None, False), (None, "ngram", True, True), ("0", None, True, False)])
def test_the_veto_hands_out_the_policy_of_the_runner_it_picks(monkeypatch, env, spec, requested, is_async):
    monkeypatch.delenv(ENV_VAR, raising=False)
    if env is not None:
        monkeypatch.setenv(ENV_VAR, env)
    assert runner_policy(spec, requested, "cpu") == RunnerPolicy(is_async=is_async)


def test_a_step_result_row_round_trips_through_its_packed_tensor():
    sampled = torch.tensor([[5, 6, 7], [8, -1, -1]])
    packed = StepResult.pack(sampled, torch.tensor([2, 0]), torch.tensor([2, 1]))
    assert packed.shape == (2, 5)
    first, second = StepResult.unpack(packed.tolist())
    assert first == StepResult(sampled=[5, 6, 7], num_accepted=2, num_draft=2) and first.emitted == [5, 6, 7]
    assert second == StepResult(sampled=[8, -1, -1], num_accepted=0, num_draft=1) and second.emitted == [8]
