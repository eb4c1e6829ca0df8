"""The host loop of LLM (construction, step, generate, output) and the scheduler's bookkeeping,
checked exactly and step by step. Runs drive llm.step() themselves with a bound on the number
of steps, so a broken loop fails instead of spinning.
Over 300 lines because it follows one loop from construction to output, and its bounded runs are
marked as a whole for the mutation runs (pytestmark)."""
from pathlib import Path

import pytest
import torch

import engine.llm
from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.policy import SYNC, RunnerPolicy
from engine.request import Request, RequestStats
from engine.sampling import request_key
from engine.scheduler import Scheduler
from gates.workloads import no_immediate_repeat

MAX_STEPS = 80
# Mutation runs take these first: a mutant that stops the loop from finishing fails here, within
# the bound, instead of hanging an unbounded test until mutmut's timeout.
pytestmark = pytest.mark.bounded


def llm_for(target_dir, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    return LLM(target_dir, **kwargs)


def drive(llm: LLM) -> list[list]:
    """Step until done (at most MAX_STEPS); returns what each step() returned."""
    returned = []
    while llm.has_unfinished():
        assert len(returned) < MAX_STEPS, "the engine did not finish"
        returned.append(llm.step())
    return returned


def bound_polls(llm: LLM, monkeypatch) -> list:
    """generate() steps while has_unfinished(): make the poll after MAX_STEPS say False, so a
    loop that never steps ends (and fails its test) instead of spinning. Returns the polls."""
    polls, real = [], llm.has_unfinished
    monkeypatch.setattr(llm, "has_unfinished", lambda: polls.append(1) or len(polls) < MAX_STEPS and real())
    return polls


def greedy(max_tokens, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


# ---- construction --------------------------------------------------------------------------

def test_the_engine_records_the_model_folder_it_loaded(target_dir):
    llm = llm_for(str(target_dir))
    assert llm.config.model == str(target_dir)
    assert llm.model_dir == Path(target_dir)
    assert llm.trace is None  # no trace unless asked for
    assert llm_for(target_dir, trace=True).trace == []


def test_max_model_len_may_equal_max_position_embeddings(target_dir):
    limit = llm_for(target_dir).model_config.max_position_embeddings
    llm = llm_for(target_dir, max_model_len=limit, max_num_batched_tokens=limit)
    assert llm.config.max_model_len == limit


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_is_refused_by_name_on_a_machine_without_it(target_dir, monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(engine.llm.SpecgateError) as info:
        llm_for(target_dir, device=device)
    assert str(info.value) == "device='cuda' was asked for, but no CUDA device is available"
    assert llm_for(target_dir, device="cpu").config.device == "cpu"  # the CPU needs no CUDA


@pytest.mark.parametrize("spec, async_runner, lookahead", [
    (None, False, 0), (None, True, 1), ("ngram", False, 3), ("ngram", True, 3 + 4)])
def test_kv_lookahead_covers_this_steps_drafts_and_each_step_in_flight(target_dir, spec, async_runner, lookahead):
    """The sync runner knows every result before it schedules, so it reserves only this step's k
    drafts; the async runner also reserves a whole verify step (k + 1) for the step in flight."""
    kwargs = dict(spec=spec, num_spec_tokens=3) if spec else {}
    llm = llm_for(target_dir, async_runner=async_runner, **kwargs)
    assert llm.is_async == async_runner
    assert llm.scheduler.lookahead == lookahead


# ---- one step at a time --------------------------------------------------------------------

@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_step_reports_each_finish_once_and_requests_record_their_steps(target_dir, async_runner):
    """Plain decoding emits one token per step: a request admitted at step a emits its first
    token at step a and its last at a + max_tokens - 1. step() returns each finished request
    once: the sync runner at that step, the async runner (which reads results a step late) at
    the next. The long prompt leaves room for the late one, so it is admitted on arrival."""
    llm = llm_for(target_dir, async_runner=async_runner, max_model_len=256, max_num_batched_tokens=256)
    long_req = llm.add_request("x = 1\n" * 33, greedy(6))  # 199 tokens with BOS
    late = llm.add_request("def main(", greedy(3), arrival_step=2)
    llm.step()
    assert long_req.needs_prefill is False and long_req.is_resumed is False
    returned = [[]] + drive(llm)
    lag = 1 if async_runner else 0
    for req, arrival, max_tokens in ((long_req, 0, 6), (late, 2, 3)):
        assert req.first_token_step == arrival
        assert req.finish_step == arrival + max_tokens - 1
        assert [i for i, done in enumerate(returned) if req in done] == [req.finish_step + lag]
        assert req.stats.num_prefills == 1
    assert sum(len(done) for done in returned) == 2


def test_speculative_steps_emit_every_accepted_token(target_dir):
    prompt, params = "for i in range(10):\n" * 4, greedy(20)
    plain = llm_for(target_dir, async_runner=False)
    ref = plain.add_request(prompt, params)
    drive(plain)
    llm = llm_for(target_dir, spec="ngram", num_spec_tokens=2, async_runner=False)
    req = llm.add_request(prompt, params)
    num_steps = len(drive(llm))
    assert req.output_token_ids == ref.output_token_ids
    assert req.stats.num_accepted_tokens > 0 and num_steps < 20


def test_record_verify_grows_per_position_counts_to_the_longest_draft():
    stats = RequestStats()
    req = Request(0, [1], SamplingParams(), 0, stats=stats)
    for num_draft, num_accepted in ((2, 2), (4, 1), (3, 3), (0, 0)):
        req.record_verify(num_draft, num_accepted)
    assert stats.accepted_per_position == [3, 2, 1, 0]
    assert (stats.verify_steps, stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 3, 9, 6)


def test_a_resume_counts_a_prefill_and_the_drafts_it_held_not_a_verify_step():
    """A resumed prefill emits 1 + accepted tokens, so counting it a prefill (one token) and its
    accepted drafts keeps completion = prefills + verify steps + accepted - truncated."""
    stats = RequestStats()
    req = Request(0, [1], SamplingParams(), 0, stats=stats)
    req.record_prefill(0, 0)
    req.record_verify(3, 1)
    req.record_prefill(3, 2)  # a resume that verified three drafts it held, accepting two
    req.record_prefill(0, 0)  # a resume that held none
    assert (stats.num_prefills, stats.verify_steps, stats.num_drafts, stats.num_draft_tokens,
            stats.num_accepted_tokens, stats.accepted_per_position) == (3, 1, 2, 6, 3, [2, 1, 0])


def test_async_runner_reads_blocking_while_a_request_needs_host_history(target_dir):
    """A logits processor needs the request's whole output, so the async runner finishes the
    step in flight before it schedules the next: every read is a blocking one."""
    llm = llm_for(target_dir, trace=True)
    assert llm.is_async
    llm.add_request("def main(", SamplingParams(temperature=0, max_tokens=6, logits_processors=[no_immediate_repeat]))
    drive(llm)
    assert llm.host_reads == {"blocking": len(llm.trace), "deferred": 0}
    assert len(llm.trace) == 6


def test_a_step_that_schedules_nothing_while_one_is_in_flight_is_not_a_stall(target_dir, monkeypatch):
    """The step in flight may finish requests and free room, so an empty step then is a pause,
    not a stall; the tokens are those of an uninterrupted run."""
    prompts, params = ["def main(", "import os\n"], greedy(5)
    reference = llm_for(target_dir)
    ref = [reference.add_request(p, params) for p in prompts]
    drive(reference)
    llm = llm_for(target_dir)
    reqs = [llm.add_request(p, params) for p in prompts]
    llm.step()
    llm.step()
    assert llm._in_flight is not None
    with monkeypatch.context() as m:
        m.setattr(llm.scheduler, "query_len", lambda req: llm.config.max_num_batched_tokens + 1)
        assert llm.step() == []
    drive(llm)
    assert [r.output_token_ids for r in reqs] == [r.output_token_ids for r in ref]


@pytest.mark.parametrize("arrival", [0, 2])
def test_a_stall_is_reported_at_the_first_step_nothing_can_change(target_dir, monkeypatch, arrival):
    """Nothing schedulable, nothing in flight and nobody still to arrive: the next step would
    be the same, so the engine raises at once; before a late arrival it waits."""
    llm = llm_for(target_dir, async_runner=False)
    monkeypatch.setattr(llm.scheduler, "query_len", lambda req: llm.config.max_num_batched_tokens + 1)
    llm.add_request("def main(", greedy(3), arrival_step=arrival)
    for _ in range(arrival):
        assert llm.step() == []
    with pytest.raises(RuntimeError, match=rf"^engine stalled at step {arrival}: 0 running and 1 waiting"):
        llm.step()


# ---- generate and output -------------------------------------------------------------------

def test_generate_takes_one_prompt_as_a_string_or_token_ids(target_dir, monkeypatch):
    llm = llm_for(target_dir)
    bound_polls(llm, monkeypatch)
    params = greedy(4)
    one, = llm.generate("def main(", params)
    ids, = llm.generate(one.prompt_token_ids, params)
    listed = llm.generate(["def main(", one.prompt_token_ids], params)
    assert one.prompt == ids.prompt == "def main(" and len(one.token_ids) == 4
    assert [o.token_ids for o in listed] == [one.token_ids, one.token_ids] == [ids.token_ids] * 2


@pytest.mark.parametrize("prompts, name", [(12, "int"), (None, "NoneType"), (3.5, "float"), ({"a": 1}, "dict")])
def test_generate_names_the_type_it_refuses(target_dir, prompts, name):
    with pytest.raises(engine.llm.RequestError, match=rf"got {name}$"):
        llm_for(target_dir).generate(prompts)


def test_generate_gives_default_params_where_the_list_holds_none(target_dir, monkeypatch):
    llm = llm_for(target_dir)
    bound_polls(llm, monkeypatch)
    outs = llm.generate(["def main(", "x"], [None, greedy(2)])
    default = llm.generation.sampling_params(len(outs[0].prompt_token_ids))  # the folder's: 20 tokens, greedy
    assert len(outs[0].token_ids) == default.max_tokens == 20 or outs[0].finish_reason == "stop"
    assert len(outs[1].token_ids) == 2


class FakeBar:
    def __init__(self, total):
        self.total, self.updates, self.closed = total, [], False

    def update(self, n):
        self.updates.append(n)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("use_tqdm", [None, False, True])
def test_progress_bar_only_when_asked_and_one_tick_per_finished_request(target_dir, monkeypatch, use_tqdm):
    bars = []
    monkeypatch.setattr(engine.llm, "_progress", lambda total: bars.append(FakeBar(total)) or bars[-1])
    llm = llm_for(target_dir, async_runner=False)
    polls, steps, real_step = bound_polls(llm, monkeypatch), [], llm.step
    monkeypatch.setattr(llm, "step", lambda: steps.append(1) or real_step())
    kwargs = {} if use_tqdm is None else dict(use_tqdm=use_tqdm)
    llm.generate(["def main(", "x", "import os\n"], [greedy(2), greedy(4), greedy(4)], **kwargs)
    assert len(steps) == len(polls) - 1 == 4
    if not use_tqdm:
        assert bars == []
        return
    bar, = bars
    assert (bar.total, bar.updates, bar.closed) == (3, [0, 1, 0, 2], True)


def test_output_of_an_unfinished_request(target_dir):
    llm = llm_for(target_dir)
    req = llm.add_request("def main(", greedy(3))
    out = llm.output(req)
    assert (out.request_id, out.prompt, out.token_ids, out.text, out.finish_reason) == (0, "def main(", [], "", "")
    drive(llm)
    out = llm.output(req)
    assert (out.prompt, len(out.token_ids), out.finish_reason) == ("def main(", 3, "length")


# ---- sampling keys -------------------------------------------------------------------------

def test_unseeded_keys_are_a_fixed_stream_of_the_engine_seed():
    """Unseeded requests are reproducible across releases for a given engine seed."""
    gen = torch.Generator().manual_seed(0)
    assert [request_key(None, gen) for _ in range(3)] == [900450186894289455, 3969543146641149120,
                                                           1895649597198586619]


# ---- scheduler bookkeeping -----------------------------------------------------------------

def config(**kwargs) -> EngineConfig:
    return EngineConfig(model="unused", **kwargs)


def request(request_id, prompt_len, **params) -> Request:
    return Request(request_id, list(range(prompt_len)), SamplingParams(**params), rng_key=request_id)


@pytest.mark.parametrize("k, inflight, lookahead", [(0, 0, 0), (0, 1, 1), (3, 0, 3), (3, 1, 7), (5, 1, 11)])
def test_scheduler_lookahead_is_k_plus_a_verify_step_per_step_in_flight(k, inflight, lookahead):
    cfg = config(spec="ngram", num_spec_tokens=k) if k else config()
    assert Scheduler(cfg, RunnerPolicy(is_async=bool(inflight))).lookahead == lookahead


def test_a_prompt_that_fills_the_remaining_budget_exactly_is_admitted():
    sched = Scheduler(config(max_model_len=64, max_num_batched_tokens=64), SYNC)
    for i, n in enumerate((30, 34)):
        sched.add(request(i, n))
    batch = sched.schedule()
    assert [r.request_id for r in batch.requests] == [0, 1]


def test_a_resumed_request_waits_until_its_recompute_fits_the_budget():
    """A preempted request is recomputed from its prompt and output: its query is all of them,
    and the step's tokens stay within max_num_batched_tokens."""
    sched = Scheduler(config(max_model_len=64, max_num_batched_tokens=64), SYNC)
    big = request(0, 62)
    sched.add(big)
    assert sched.schedule().requests == [big]
    big.needs_prefill = False
    small = [request(i, 1) for i in (1, 2, 3)]
    for r in small:
        sched.add(r)
    sched.schedule()
    for r in small:
        r.needs_prefill = False
    sched.running.remove(big)  # as schedule() does with a victim
    sched.preempt(big)
    assert big.needs_prefill is True and big.is_resumed is True
    batch = sched.schedule()
    assert batch.requests == small  # 3 decode tokens + 62 would exceed 64
    assert sum(sched.query_len(r) for r in batch.requests) <= 64


def test_preemptions_are_counted_and_finish_releases_the_slot():
    sched = Scheduler(config(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=2), SYNC)
    req = request(0, 10)
    sched.add(req)
    for _ in range(2):
        assert sched.schedule().requests == [req]
        sched.running.remove(req)  # as schedule() does with a victim
        sched.preempt(req)
    assert req.stats.num_preemptions == 2
    assert sched.schedule().requests == [req] and req.slot is not None
    sched.finish(req, "stop")
    assert req.slot is None and sorted(sched.free_slots) == [0, 1]
    # finished by hand (no step produced past its end): nothing counted as truncated
    assert (req.finish_reason, req.stats.num_truncated) == ("stop", 0)


def test_a_request_that_needs_host_history_gets_no_drafts():
    sched = Scheduler(config(spec="ngram", num_spec_tokens=3), SYNC)
    plain, processed = request(0, 5), request(1, 5, logits_processors=[no_immediate_repeat])
    assert (sched.spec_width(plain), sched.spec_width(processed)) == (3, 0)
    processed.needs_prefill = False
    assert sched.query_len(processed) == 1


def test_the_oldest_request_grows_by_preempting_the_newest():
    sched = Scheduler(config(max_model_len=48, max_num_batched_tokens=48, num_kv_blocks=4), SYNC)
    old, new = request(0, 16), request(1, 32)  # 1 + 2 of the 4 blocks
    sched.add(old)
    sched.add(new)
    assert sched.schedule().requests == [old, new]
    old.needs_prefill = new.needs_prefill = False
    old.output_token_ids += [7] * 17  # 33 tokens: 3 blocks
    batch = sched.schedule()
    assert (batch.requests, batch.preempted, sched.running) == ([old], [new], [old])
    assert list(sched.waiting) == [new] and len(old.block_ids) == 3


@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
def test_each_step_s_result_read_is_declared_by_how_the_host_read_it(make_llm, async_runner):
    """One declared read per step (engine/host_sync.py), named for the no-sync gate: the sync
    runner reads every step blocking; the async one reads each step a step late (deferred) and
    only the last, with nothing left to queue behind it, blocking."""
    llm = make_llm(spec="ngram", num_spec_tokens=2, max_num_seqs=3, async_runner=async_runner, trace=True)
    llm.generate([[5, 6, 7, 8], [9, 10], [11, 12, 13]], SamplingParams(temperature=0, max_tokens=12),
                 arrival_steps=[0, 1, 1])
    steps = len(llm.trace)
    assert steps > 2
    expected = {"deferred result read": steps - 1, "blocking result read": 1} if async_runner else \
        {"blocking result read": steps}
    assert dict(llm.runner.declared_syncs.counts) == expected
