"""The scheduler and the block manager alone: plain Python, no model, no torch on the path.

A Hypothesis state machine (and, to show the cases occur, seeded random walks) adds, steps
and aborts requests and checks after every operation that no KV block is both free and used,
that each step respects max_num_seqs and the token budget, that admission is first-come
first-served, that preemption takes the newest running request, that a preempted request
resumes before anything queued behind it, and that every request finishes.
`emulate_step` plays the engine's part: each scheduled request commits 1..k+1 tokens.
Over 300 lines because the state machine, the scenarios and the block manager share its emulator
and invariant checks.
"""
import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.policy import SYNC, RunnerPolicy
from engine.request import Request, Status
from engine.sampling import SamplingParams
from engine.scheduler import Scheduler


def make_config(**kwargs) -> EngineConfig:
    return EngineConfig(model="unused", **kwargs)


def make_request(request_id: int, prompt_len: int, max_tokens: int, arrival_step: int = 0) -> Request:
    return Request(request_id, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens),
                   rng_key=request_id, arrival_step=arrival_step)


def query_len(sched: Scheduler, req: Request, prefill: bool) -> int:
    return req.num_tokens if prefill else 1 + sched.spec_width(req)


def emulate_step(sched: Scheduler, batch, num_new=lambda req, width: 1) -> list[Request]:
    """What the engine does with a scheduled batch: prefill rows become decode rows, each row
    commits tokens, and a request finishes at max_tokens or a full context."""
    finished = []
    for req, prefill in zip(batch.requests, batch.is_prefill):
        if prefill:
            req.needs_prefill = req.is_resumed = False
        for _ in range(num_new(req, 0 if prefill else sched.spec_width(req))):
            req.output_token_ids.append(7)
            if len(req.output_token_ids) >= req.params.max_tokens or req.num_tokens >= sched.cfg.max_model_len:
                sched.finish(req, "length")
                finished.append(req)
                break
    return finished


def check_blocks(sched: Scheduler, requests: list[Request]) -> None:
    bm = sched.block_manager
    free = bm.free_block_ids
    used = [b for r in requests for b in r.block_ids]
    assert len(set(free)) == len(free), "a block is free twice"
    assert len(set(used)) == len(used), "a block is owned by two requests"
    assert not set(free) & set(used), "a block is both free and used"
    assert set(free) | set(used) == set(range(bm.num_blocks)), "a block was lost"
    for r in requests:
        if r.status is not Status.RUNNING:
            assert r.block_ids == [], f"request {r.request_id} is {r.status.value} but owns blocks"
        assert len(r.block_ids) <= sched.cfg.blocks_per_seq, "more blocks than a block table holds"


CONFIGS = dict(max_model_len=st.integers(2, 96), block_size=st.sampled_from([1, 4, 16]),
               max_num_seqs=st.integers(1, 6), extra_budget=st.sampled_from([0, 5, 1000]),
               spec=st.sampled_from([None, "ngram"]), extra_blocks=st.integers(0, 12), full=st.booleans())


def config_from(max_model_len, block_size, max_num_seqs, extra_budget, spec, extra_blocks, full) -> EngineConfig:
    """A valid config; the cache is the default or just above one full-length request."""
    k = 4 if spec else 0
    cfg = make_config(max_model_len=max_model_len, block_size=block_size, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max(max_model_len, k + 1) + extra_budget, spec=spec, num_spec_tokens=4)
    if full:
        return cfg
    return dataclasses.replace(cfg, num_kv_blocks=cfg.blocks_per_seq + extra_blocks)


class CheckedScheduler:
    """A scheduler driven the way the engine drives it, checking every property after each
    operation, and counting the cases that occurred."""

    def __init__(self, cfg: EngineConfig, num_inflight_steps: int, rng: random.Random):
        self.cfg = cfg
        self.sched = Scheduler(cfg, RunnerPolicy(is_async=bool(num_inflight_steps)))
        self.rng = rng  # how many drafts each verify step accepts
        self.requests: list[Request] = []
        self.first_admitted: list[int] = []
        self.num_preempted = 0

    def add(self, prompt_frac: float, max_tokens: int, arrival: int) -> None:
        prompt_len = 1 + int(prompt_frac * (self.cfg.max_model_len - 2))
        req = make_request(len(self.requests), prompt_len, max_tokens, self.sched.step + arrival)
        self.requests.append(req)
        self.sched.add(req)
        self.check()

    def abort(self, pick: int) -> None:
        live = [r for r in self.requests if not r.is_finished]
        if live:
            self.sched.finish(live[pick % len(live)], "abort")
        self.check()

    def step(self) -> None:
        sched, cfg = self.sched, self.cfg
        running_before, waiting_before = list(sched.running), list(sched.waiting)
        head_arrived = bool(waiting_before) and waiting_before[0].arrival_step <= sched.step
        batch = sched.schedule()
        lens = [query_len(sched, r, p) for r, p in zip(batch.requests, batch.is_prefill)]

        assert len(batch.requests) <= cfg.max_num_seqs
        assert sum(lens) <= cfg.max_num_batched_tokens, \
            f"step {batch.step} runs {sum(lens)} tokens {lens}, max_num_batched_tokens is {cfg.max_num_batched_tokens}"
        for req in batch.requests:  # the cache holds every position the step may write
            assert len(req.block_ids) * cfg.block_size >= req.num_tokens + sched.lookahead
        # Preemption takes the newest running requests first (the end of the running list).
        victims = batch.preempted
        assert victims == running_before[::-1][:len(victims)]
        for v in victims:
            assert v.status is Status.WAITING and v.block_ids == [] and v.slot is None
        self.num_preempted += len(victims)
        # Admission is a prefix of the queue, preempted requests at its front: FCFS, and a
        # preempted request resumes before anything that was queued behind it.
        admitted = [r for r, p in zip(batch.requests, batch.is_prefill) if p]
        queue = victims[::-1] + waiting_before
        assert admitted == queue[:len(admitted)]
        assert all(r.arrival_step <= batch.step for r in admitted)
        for r in admitted:
            assert lens[batch.requests.index(r)] == r.num_tokens  # a resumed request recomputes all
            if r.stats.num_preemptions == 0:
                self.first_admitted.append(r.request_id)
        # Progress: with anything runnable, the step runs something.
        if running_before or head_arrived:
            assert batch.requests, "nothing scheduled although a request could run"
        emulate_step(sched, batch, lambda req, width: self.rng.randint(1, width + 1))
        self.check()

    def check(self) -> None:
        sched = self.sched
        check_blocks(sched, self.requests)
        assert len(sched.running) <= self.cfg.max_num_seqs
        assert all(r.status is Status.RUNNING for r in sched.running)
        assert all(r.status is Status.WAITING for r in sched.waiting)
        slots = [r.slot for r in sched.running]
        assert sorted(slots + sched.free_slots) == list(range(self.cfg.max_num_seqs))
        assert self.first_admitted == sorted(self.first_admitted), "admitted out of arrival order"

    def drain(self) -> None:
        """Every request finishes, with exactly the tokens it asked for (or a full context)."""
        idle = 0  # steps in a row that committed nothing; arrivals are at most 3 steps ahead
        while self.sched.has_unfinished():
            before = sum(len(r.output_token_ids) for r in self.requests)
            self.step()
            idle = 0 if sum(len(r.output_token_ids) for r in self.requests) > before else idle + 1
            assert idle <= 5, "the scheduler stopped making progress"
        for r in self.requests:
            if r.finish_reason == "length":
                assert len(r.output_token_ids) == r.params.max_tokens or r.num_tokens == self.cfg.max_model_len
        assert self.sched.block_manager.num_free_blocks == self.cfg.total_kv_blocks


class SchedulerMachine(RuleBasedStateMachine):
    checked: CheckedScheduler | None = None

    @initialize(cfg=st.builds(config_from, **CONFIGS), num_inflight_steps=st.integers(0, 1),
                seed=st.integers(0, 2 ** 16))
    def setup(self, cfg, num_inflight_steps, seed):
        self.checked = CheckedScheduler(cfg, num_inflight_steps, random.Random(seed))

    @rule(prompt_frac=st.floats(0, 1), max_tokens=st.integers(1, 40), arrival=st.integers(0, 3))
    def add(self, prompt_frac, max_tokens, arrival):
        self.checked.add(prompt_frac, max_tokens, arrival)

    @rule()
    def step(self):
        self.checked.step()

    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        self.checked.abort(pick)

    def teardown(self):
        if self.checked is not None:
            self.checked.drain()


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(stateful_step_count=30)


def random_config(rng: random.Random) -> EngineConfig:
    return config_from(max_model_len=rng.randint(2, 96), block_size=rng.choice([1, 4, 16]),
                       max_num_seqs=rng.randint(1, 6), extra_budget=rng.choice([0, 5, 1000]),
                       spec=rng.choice([None, "ngram"]), extra_blocks=rng.randint(0, 3),
                       full=rng.random() < 0.2)


def test_random_walks_preempt_and_keep_every_property():
    """The same checks over seeded random walks with small caches, and a check that the
    cases occurred: preemptions, aborts, speculative configs."""
    totals = dict(preempted=0, aborted=0, spec=0)
    for seed in range(40):
        rng = random.Random(seed)
        cfg = random_config(rng)
        checked = CheckedScheduler(cfg, rng.randint(0, 1), rng)
        for _ in range(60):
            op = rng.random()
            if op < 0.35:
                checked.add(rng.random(), rng.randint(1, 40), rng.randint(0, 3))
            elif op < 0.95:
                checked.step()
            else:
                checked.abort(rng.randint(0, 1000))
                totals["aborted"] += 1
        checked.drain()
        totals["preempted"] += checked.num_preempted
        totals["spec"] += cfg.k > 0
    assert all(totals.values()), totals


# ---- scenarios -----------------------------------------------------------------------------

def run_to_completion(sched: Scheduler, max_steps: int = 500):
    """Yield each scheduled batch (before the engine's part runs), until nothing is left."""
    for _ in range(max_steps):
        if not sched.has_unfinished():
            return
        batch = sched.schedule()
        yield batch
        emulate_step(sched, batch)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def test_max_num_seqs_and_arrival_order():
    sched = Scheduler(make_config(max_model_len=64, max_num_seqs=2), SYNC)
    reqs = [make_request(i, 5 + i, max_tokens=3) for i in range(5)]
    for r in reqs:
        sched.add(r)
    order = []
    for batch in run_to_completion(sched):
        assert len(batch.requests) <= 2
        order += [r.request_id for r, p in zip(batch.requests, batch.is_prefill) if p]
    assert order == [0, 1, 2, 3, 4]


def test_token_budget_holds_back_a_prompt_until_it_fits():
    sched = Scheduler(make_config(max_model_len=64, max_num_batched_tokens=64), SYNC)
    a, b = make_request(0, 40, max_tokens=4), make_request(1, 30, max_tokens=4)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert batch.requests == [a]  # 40 + 30 prompt tokens exceed the budget of 64
    assert batch.deferred == [b]  # what the trace reads: the budget, not the pool, kept b out
    emulate_step(sched, batch)
    batch = sched.schedule()
    assert batch.requests == [a, b] and batch.is_prefill == [False, True]  # 1 + 30 fits
    assert batch.deferred == []


def test_a_running_request_the_budget_leaves_out_is_deferred_and_keeps_running():
    """Two verify rows of 1 + 4 tokens and a budget of 8: the older runs, the newer waits the step
    out, still running, holding its slot and blocks."""
    cfg = make_config(max_model_len=8, max_num_batched_tokens=8, max_num_seqs=2, spec="ngram", num_spec_tokens=4)
    sched = Scheduler(cfg, SYNC)
    a, b = make_request(0, 3, max_tokens=3), make_request(1, 3, max_tokens=3)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert batch.requests == [a, b] and batch.deferred == []  # two prefills of 3 tokens
    emulate_step(sched, batch)
    batch = sched.schedule()
    assert batch.requests == [a] and batch.deferred == [b]
    assert sched.running == [a, b] and b.block_ids and b.slot is not None


def test_the_budget_defers_what_it_holds_back_not_what_the_pool_or_an_arrival_does():
    """Prompts of 40 and 20 tokens take the 5 blocks of 16; a third of 4 tokens fits the budget
    (64 tokens in all) but not the pool; a request yet to arrive is not the budget's either."""
    cfg = make_config(max_model_len=64, block_size=16, num_kv_blocks=5, max_num_batched_tokens=64)
    sched = Scheduler(cfg, SYNC)
    a, b, c = make_request(0, 40, max_tokens=4), make_request(1, 20, max_tokens=4), make_request(2, 4, max_tokens=4)
    for r in (a, b, c):
        sched.add(r)
    batch = sched.schedule()
    assert batch.requests == [a, b] and sched.block_manager.num_free_blocks == 0
    assert batch.deferred == []
    # with a sixth block the pool takes c, the budget does not: 40 + 24 fill it exactly
    sched = Scheduler(dataclasses.replace(cfg, num_kv_blocks=6), SYNC)
    a, b, c = make_request(0, 40, max_tokens=4), make_request(1, 24, max_tokens=4), make_request(2, 4, max_tokens=4)
    for r in (a, b, c):
        sched.add(r)
    batch = sched.schedule()
    assert batch.requests == [a, b] and batch.deferred == [c]
    sched = Scheduler(cfg, SYNC)
    sched.add(make_request(3, 4, max_tokens=4, arrival_step=2))
    assert [sched.schedule().deferred for _ in range(2)] == [[], []]


def test_token_budget_counts_verify_rows():
    """With speculative decoding a running request's step costs k + 1 tokens, not 1: two
    verify rows of 5 tokens do not fit a budget of 8."""
    cfg = make_config(max_model_len=8, max_num_batched_tokens=8, max_num_seqs=2, spec="ngram", num_spec_tokens=4)
    checked = CheckedScheduler(cfg, num_inflight_steps=0, rng=random.Random(0))
    checked.add(0.0, max_tokens=3, arrival=0)
    checked.add(0.0, max_tokens=3, arrival=0)
    checked.drain()  # checks sum(query lens) <= max_num_batched_tokens at every step


def test_a_tiny_context_with_speculation_still_finishes():
    """max_model_len 4 with k = 4: the budget is raised to one verify step (5 tokens), so
    the request is not stuck waiting for a budget it can never have."""
    cfg = config_from(max_model_len=4, block_size=1, max_num_seqs=2, extra_budget=0, spec="ngram",
                      extra_blocks=0, full=True)
    checked = CheckedScheduler(cfg, num_inflight_steps=1, rng=random.Random(0))
    checked.add(0.0, max_tokens=3, arrival=0)
    checked.drain()
    assert len(checked.requests[0].output_token_ids) == 3


def test_arrival_step_holds_a_request_back():
    sched = Scheduler(make_config(max_model_len=64), SYNC)
    late = make_request(0, 4, max_tokens=10, arrival_step=3)
    sched.add(late)
    steps = [bool(sched.schedule().requests) for _ in range(4)]
    assert steps == [False, False, False, True]


def test_preemption_takes_the_newest_and_resumes_it_before_later_arrivals():
    # 64-token context, blocks of 16: 5 blocks per request (context plus one token of slack);
    # a cache of 6 blocks holds three 16-token prompts and lets them grow to 32 tokens.
    cfg = make_config(max_model_len=64, block_size=16, num_kv_blocks=6, max_num_seqs=4)
    sched = Scheduler(cfg, SYNC)
    a, b, c = (make_request(i, 16, max_tokens=30) for i in range(3))
    late = make_request(3, 4, max_tokens=2, arrival_step=1)
    for r in (a, b, c, late):
        sched.add(r)
    preempted_at = None
    for _ in range(40):
        batch = sched.schedule()
        if batch.preempted:
            assert batch.preempted == [c]  # the newest running request, not the oldest
            assert list(sched.waiting)[:2] == [c, late]  # back at the front of the queue
            preempted_at = batch.step
            break
        emulate_step(sched, batch)
    assert preempted_at is not None, "the scenario never filled the cache"
    admitted = []
    for batch in run_to_completion(sched):
        admitted += [r for r, p in zip(batch.requests, batch.is_prefill) if p]
    assert admitted[:2] == [c, late]
    assert c.stats.num_preemptions == 1 and c.is_finished and len(c.output_token_ids) == 30
    check_blocks(sched, [a, b, c, late])


def test_a_lone_request_that_cannot_grow_preempts_itself_only_when_nothing_else_runs():
    cfg = make_config(max_model_len=32, block_size=8, num_kv_blocks=5, max_num_seqs=2)
    sched = Scheduler(cfg, SYNC)
    a, b = make_request(0, 16, max_tokens=15), make_request(1, 16, max_tokens=15)
    sched.add(a)
    sched.add(b)
    preempted = []
    for batch in run_to_completion(sched):
        preempted += batch.preempted
        assert a in batch.requests or a.is_finished  # the oldest request always runs
    assert preempted and all(r is b for r in preempted)
    assert len(a.output_token_ids) == len(b.output_token_ids) == 15


# ---- block manager -------------------------------------------------------------------------

@given(sizes=st.lists(st.integers(0, 80), min_size=1, max_size=12), block_size=st.sampled_from([1, 3, 16]),
       num_blocks=st.integers(1, 40))
def test_block_manager_reserve_and_free(sizes, block_size, num_blocks):
    bm = BlockManager(num_blocks, block_size)
    held = []
    for n in sizes:
        blocks, free_before = [], list(bm.free_block_ids)
        if bm.can_reserve(0, n):
            blocks += bm.reserve(0, n)
            assert len(blocks) == -(-n // block_size)
            assert bm.reserve(len(blocks), n) == []  # already covered: takes nothing more
        else:
            with pytest.raises(RuntimeError, match=f"{bm.blocks_needed(0, n)} blocks needed"):
                bm.reserve(0, n)
            assert bm.free_block_ids == free_before  # refusal changes nothing
        held.append(blocks)
        used = [b for blocks in held for b in blocks]
        assert not set(used) & set(bm.free_block_ids)
        assert len(used) + bm.num_free_blocks == num_blocks
    for blocks in held:
        bm.free(blocks)
    assert sorted(bm.free_block_ids) == list(range(num_blocks))
