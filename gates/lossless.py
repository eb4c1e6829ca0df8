"""Gate lossless (G1): speculative decoding changes nothing but speed.

Greedy: spec output equals plain greedy output token for token, for both drafters, both runners,
the eager and the graph arm (on the CPU the padded graph plan run eagerly, on CUDA real graph
replay), k up to 6, several requests with mixed arrivals, some with a logits processor, with and
without preemption; and every greedy run also equals the naive reference decoder
(gates/reference.py), tokens and finish reasons, which shares no code path with the engine. Every
request with logits processors also records, call by call, the output history its processors
received, which must be its committed output so far (gates/invariants.py history_difference); and
processors that read the whole history (a repetition penalty, a no-repeat n-gram ban, a bias keyed
by the history's length; gates/processors.py) run beside drafting requests that stop mid-verify,
under preemption: spec equals plain equals the reference.
Sampling: verify alone emits the target distribution at every position (chi-square per position),
and whole sampled engine runs emit it too (randomized PIT of the tokens, and for the one-hot ngram
drafter of its accept decisions, see gates/distribution.py), while the
same tests fail on a lossy verify (the ratio taken with the wrong q): the negative control.
A seeded sampled run is also the same on both runners and in the graph arm, token for token, so
the distribution test covers the graph arm's output too. Sampled requests without a seed take
their keys from the engine's seed: reproducible under the same engine seed (and runner), different
under another. In bfloat16, spec and plain greedy runs equal each other and the naive reference in
bfloat16 up to near-ties of bfloat16's precision (gates/reference.py near_tie_difference).
Over 300 lines because it is one gate: its greedy, distribution, bfloat16 and engine-seed checks
report one set of claims and share its fixtures and workloads.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from engine.verify import verify
from gates import distribution
from gates.compare import Difference, token_difference
from gates.distribution import P_VALUE_THRESHOLD
from gates.draft_q import DraftRecorder, binding_steps, draft_q_difference, engine_q_p_values, telling_verify_row
from gates.invariants import history_difference
from gates.plugin import SESSION_PLUGIN
from gates.processors import WHOLE_HISTORY
from gates.reference import (
    bigram_repeats,
    dtype_difference,
    near_tie_difference,
    reference_difference,
    teacher_forced_logits,
)
from gates.workloads import (
    DRAFTERS,
    MAX_TOKENS,
    PROMPTS,
    WHOLE_HISTORY_ENGINE,
    WHOLE_HISTORY_WORKLOAD,
    Workload,
    gate_settings,
    no_immediate_repeat,
    run,
    whole_history_params,
    workloads,
)

CLAIMS = ("ngram", "block", "sync runner", "async runner", "num_reqs>1", "k>1", "drafts accepted",
          "preemption", "sampled drafts accepted and rejected", "negative control failed", "graph arm",
          "sampled graph arm", "logits processor", "top-k bound", "top-p bound",
          "block drafter q checked on a sampled row",
          "block drafter q negative control failed", "bfloat16 engine", "bfloat16 drafts accepted",
          "unseeded sampled requests keyed by the engine seed", "logits processor histories checked call by call",
          "whole-history logits processors", "a request with logits processors preempted",
          "a finish truncated a verify step beside whole-history processors")

SAMPLED_REQUESTS, SAMPLED_TOKENS = 64, 48
SAMPLING = {"t1": dict(temperature=1.0), "t0.8-topk20-topp0.9": dict(temperature=0.8, top_k=20, top_p=0.9)}
BINDING = SAMPLING["t0.8-topk20-topp0.9"]
ENGINE_Q_ROUNDS = 20_000
# Small on purpose: bfloat16 is judged per token against a dense forward, and the engine seed
# needs only a few sampled tokens to tell two seeds apart.
BF16_WORKLOAD = Workload(prompts=tuple(PROMPTS[i] for i in (0, 3, 6, 7)), max_tokens=(16, 24, 12, 20),
                         arrival_steps=(0, 0, 1, 2), ignore_eos=(True,) * 4)
UNSEEDED = Workload.uniform(PROMPTS[:4], 12, 1.0)


@pytest.fixture(scope="module")
def plain_greedy(make_llm, forward):
    """Plain greedy output of every prompt, without and with the logits processor, keyed
    (prompt, has processor); a shorter max_tokens gives a prefix of it. Once per forward: spec
    runs are compared with plain runs of their own forward."""
    llm = make_llm(async_runner=False)
    out = {}
    for processed in (False, True):
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                logits_processors=[no_immediate_repeat] if processed else [])
        out |= {(p, processed): o.token_ids for p, o in zip(PROMPTS, llm.generate(list(PROMPTS), params))}
    return out


def check_greedy(make_llm, gate_record, plain_greedy, reference, workload, **engine):
    processed = workload.host_history or (False,) * workload.num_reqs
    for async_runner in (False, True):
        r = run(make_llm, workload, async_runner=async_runner, **engine)
        gate_record.case(**{k: v for k, v in engine.items() if v is not None}, async_runner=async_runner,
                         num_reqs=workload.num_reqs)
        expected = {o.request_id: plain_greedy[p, h][:m] for o, p, m, h in
                    zip(r.outputs, workload.prompts, workload.max_tokens, processed)}
        gate_record.check(token_difference(expected, r), f"{r.label()}: spec vs plain greedy")
        gate_record.check(reference_difference(reference, r, r.max_model_len)[0],
                          f"{r.label()}: spec vs the naive reference decoder")
        check_histories(gate_record, r)
        gate_record.occurred("logits processor", any(processed))
        gate_record.occurred(engine["spec"])
        gate_record.occurred("async runner" if r.is_async else "sync runner")
        gate_record.occurred("num_reqs>1", max(s.num_reqs for s in r.trace) > 1)
        gate_record.occurred("k>1", engine["num_spec_tokens"] > 1)
        gate_record.occurred("drafts accepted", sum(o.stats.num_accepted_tokens for o in r.outputs) > 0)
        gate_record.occurred("preemption", r.num_preemptions > 0)
        gate_record.occurred("graph arm", any(route.endswith("/graph") for route in r.routes))


def check_histories(gate_record, r) -> None:
    """Each request with logits processors: the history every call received, against its output."""
    gate_record.check(history_difference(r.outputs, r.histories, r.trace),
                      f"{r.label()}: the history each logits processor call received")
    gate_record.occurred("logits processor histories checked call by call",
                         any(len(calls) > 1 for calls in r.histories.values()))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(host_history=None), k=st.integers(1, 6))
@gate_settings(2)
def test_greedy_spec_equals_plain(make_llm, gate_record, plain_greedy, reference, drafter, graph, workload, k):
    check_greedy(make_llm, gate_record, plain_greedy, reference, workload,
                 spec=drafter, num_spec_tokens=k, max_num_seqs=4,
                 graph=graph)


@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(min_reqs=3, max_reqs=6, long_prompts=True, max_arrival=None), k=st.integers(1, 6))
@gate_settings(3)
def test_greedy_spec_equals_plain_under_preemption(make_llm, gate_record, plain_greedy, reference, drafter, workload,
                                                   k):
    workload = Workload(workload.prompts, (MAX_TOKENS,) * workload.num_reqs, workload.arrival_steps)
    check_greedy(make_llm, gate_record, plain_greedy, reference, workload,
                 spec=drafter, num_spec_tokens=k, max_num_seqs=6,
                 num_kv_blocks=18)


@pytest.fixture(scope="module")
def whole_history_plain(make_llm, reference):
    """The plain (no drafter) sync run of WHOLE_HISTORY_WORKLOAD, itself judged like a spec run."""
    r = run(make_llm, WHOLE_HISTORY_WORKLOAD, whole_history_params(WHOLE_HISTORY_WORKLOAD), async_runner=False,
            **WHOLE_HISTORY_ENGINE)
    return r, reference_difference(reference, r, r.max_model_len)[0], history_difference(r.outputs, r.histories,
                                                                                          r.trace)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_whole_history_processors_spec_equals_plain_and_the_reference(make_llm, gate_record, reference,
                                                                      whole_history_plain, drafter):
    """Processors whose output reads the whole history, each request's own (a history with the
    prompt in it, or a token too many or too few, changes its tokens), beside drafting requests
    that stop mid-verify, under preemption: both runners equal plain and the reference decoder,
    and every processor call received the request's output so far."""
    plain, plain_vs_reference, plain_history = whole_history_plain
    gate_record.case(drafter=drafter, workload="whole-history processors", run="plain", **WHOLE_HISTORY_ENGINE)
    gate_record.check(plain_vs_reference, "plain vs the naive reference decoder")
    gate_record.check(plain_history, "plain: the history each logits processor call received")
    sampling = whole_history_params(WHOLE_HISTORY_WORKLOAD)
    processed = {o.request_id for o, p in zip(plain.outputs, sampling) if p.logits_processors}
    for async_runner in (False, True):
        r = run(make_llm, WHOLE_HISTORY_WORKLOAD, sampling, spec=drafter, num_spec_tokens=4, async_runner=async_runner,
                **WHOLE_HISTORY_ENGINE)
        gate_record.case(drafter=drafter, workload="whole-history processors", async_runner=async_runner, k=4,
                         **WHOLE_HISTORY_ENGINE)
        gate_record.check(token_difference({o.request_id: o.token_ids for o in plain.outputs}, r),
                          f"{r.label()}: spec vs plain greedy")
        gate_record.check(reference_difference(reference, r, r.max_model_len)[0],
                          f"{r.label()}: spec vs the naive reference decoder")
        check_histories(gate_record, r)
        gate_record.occurred("whole-history logits processors",
                             [list(p.logits_processors) for p in sampling if p.logits_processors]
                             == [list(chain) for chain in WHOLE_HISTORY]
                             and all(len(r.histories[rid]) > 1 for rid in processed))
        gate_record.occurred("a request with logits processors preempted",
                             any(o.stats.num_preemptions for o in r.outputs if o.request_id in processed))
        gate_record.occurred("a finish truncated a verify step beside whole-history processors",
                             any(o.stats.num_truncated for o in r.outputs))
        gate_record.occurred(drafter)
        gate_record.occurred("async runner" if async_runner else "sync runner")


@pytest.mark.parametrize("lossy", [False, True], ids=["verify", "negative-control"])
@pytest.mark.parametrize("drafter", ["sampled", "one-hot"])
def test_verify_emits_the_target_distribution_at_every_position(gate_record, drafter, lossy):
    gate_record.case(level="verify", drafter=drafter, lossy=lossy, rounds=60_000)
    results = distribution.position_p_values(*distribution.verify_round(60_000, 6, 3, drafter, lossy))
    gate_record.measure(drafter=drafter, lossy=lossy, positions=[{"rounds": n, "p_value": pv} for n, pv in results])
    assert all(n >= 1000 for n, _ in results), f"a position was rarely reached: {results}"
    judge_positions(gate_record, results, lossy, "negative control failed", "verify's output")


def judge_positions(gate_record, results: list[tuple[int, float]], lossy: bool, control_claim: str,
                    what: str) -> None:
    """Per-position (rounds, p-value) of a verify-level chi-square: the worst must fail for the
    negative control (which then claims `control_claim`) and pass for the real verify."""
    worst = min(pv for _, pv in results)
    if lossy:
        assert worst < P_VALUE_THRESHOLD, f"the negative control passed the test: {results}"
        gate_record.occurred(control_claim)
    else:
        gate_record.evidence(positions=results)
        assert worst > P_VALUE_THRESHOLD, f"{what} is not distributed as the target: {results}"


def engine_p_values(llm, outs, params, drafter: str) -> dict[str, tuple[int, float]]:
    """Test -> (values tested, p-value) of a traced sampled run: the tokens' PIT, and for the ngram
    drafter (one-hot q, so a draft is accepted with probability p(x)) the accept decisions' PIT."""
    u = distribution.pit_values(llm.model, outs, params)
    out = {"tokens": (len(u), distribution.uniformity_p_value(u))}
    if drafter == "ngram":
        u = distribution.acceptance_pit_values(llm.model, outs, params, llm.trace)
        out["accept decisions"] = (len(u), distribution.uniformity_p_value(u))
    return out


def sampled_workload(sampling: dict) -> tuple[list[str], list[SamplingParams]]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(SAMPLED_REQUESTS)]
    params = [SamplingParams(max_tokens=SAMPLED_TOKENS, seed=i, ignore_eos=True, **sampling)
              for i in range(SAMPLED_REQUESTS)]
    return prompts, params


# The bfloat16 and engine-seed checks run before the sampled-run distribution tests, the gate's
# costliest: a defect's tree in prove stops the gate at its first failed check (--stop-at-red).
def test_bfloat16_greedy_spec_equals_plain_and_the_bfloat16_reference(make_llm, gate_record, target_dir, gate_device,
                                                                       request):
    from engine.loader import load_model
    reference = load_model(target_dir, gate_device, torch.bfloat16)   # on its own: not the engine's dtype path
    params = BF16_WORKLOAD.params()
    runs = {}
    engines = {"plain": {}, "ngram": dict(spec="ngram", num_spec_tokens=3, async_runner=False),
               "block": dict(spec="block", num_spec_tokens=3, async_runner=True)}
    # a drafter unfit for this target
    skipped = request.config.pluginmanager.get_plugin(SESSION_PLUGIN).skipped_drafters()
    for name, engine in {n: e for n, e in engines.items() if e.get("spec") not in skipped}.items():
        llm = make_llm(dtype="bfloat16", max_num_seqs=4, **engine)
        outs = llm.generate(BF16_WORKLOAD.prompt_list(), params, arrival_steps=BF16_WORKLOAD.arrivals())
        gate_record.case(dtype="bfloat16", run=name, num_reqs=BF16_WORKLOAD.num_reqs, **engine)
        gate_record.check(dtype_difference(llm, torch.bfloat16), f"{name}: asked for bfloat16")
        gate_record.occurred("bfloat16 engine")
        ties = 0
        for o, m in zip(outs, BF16_WORKLOAD.max_tokens):
            assert len(o.token_ids) == m and o.finish_reason == "length", f"{name}: request {o.request_id} ended early"
            logits = teacher_forced_logits(reference, o.prompt_token_ids, o.token_ids)
            diff, n = near_tie_difference(logits, o.token_ids, o.request_id, len(o.prompt_token_ids))
            gate_record.check(diff, f"{name} in bfloat16: vs the bfloat16 reference decoder")
            ties += n
        gate_record.measure(dtype="bfloat16", run=name, near_ties=ties,
                            accepted=sum(o.stats.num_accepted_tokens for o in outs))
        if engine:
            gate_record.occurred("bfloat16 drafts accepted", sum(o.stats.num_accepted_tokens for o in outs) > 0)
        runs[name] = outs
    if "block" not in runs and not any(bigram_repeats(list(o.prompt_token_ids) + list(o.token_ids),
                                                      len(o.prompt_token_ids)) for o in runs["ngram"]):
        gate_record.unexercisable("bfloat16 drafts accepted",
                                  "no output token of the ngram run's bfloat16 streams completes a bigram seen "
                                  "before it, so no n-gram draft could equal a greedy token on this target (and "
                                  "the block drafter does not fit it)")
    # equal to plain up to the first token, a near-tie the reference allows
    for name in (n for n in ("ngram", "block") if n in runs):
        for s, p in zip(runs[name], runs["plain"]):
            d = next((i for i, (a, b) in enumerate(zip(s.token_ids, p.token_ids)) if a != b), None)
            if d is not None:
                logits = teacher_forced_logits(reference, p.prompt_token_ids, p.token_ids[:d + 1])
                gate_record.check(near_tie_difference(logits[d:], [s.token_ids[d]], s.request_id,
                                                      len(s.prompt_token_ids) + d)[0],
                                  f"{name} vs plain in bfloat16: first difference beyond a near-tie")


def test_unseeded_sampled_requests_take_their_keys_from_the_engine_seed(make_llm, gate_record):
    """Sampled requests without a seed: the same engine seed gives the same tokens (on either
    runner), another engine seed other tokens."""
    params = UNSEEDED.params(ignore_eos=True)
    assert all(p.seed is None and not p.is_greedy for p in params)
    tokens = {}
    for seed, async_runner in ((0, False), (0, True), (1, False)):
        for again in (False, True) if not async_runner and seed == 0 else (False,):
            llm = make_llm(spec="ngram", num_spec_tokens=3, max_num_seqs=4, seed=seed, async_runner=async_runner)
            gate_record.case(engine_seed=seed, async_runner=async_runner, again=again, unseeded=UNSEEDED.num_reqs)
            outs = llm.generate(UNSEEDED.prompt_list(), params)
            tokens[seed, async_runner, again] = [o.token_ids for o in outs]
    base = tokens[0, False, False]
    for key in ((0, False, True), (0, True, False)):
        gate_record.check(None if tokens[key] == base else Difference(
            "unseeded sampled tokens under the same engine seed", None, None, None, base, tokens[key]),
            f"engine seed 0, async_runner={key[1]}, again={key[2]}")
    differs = tokens[1, False, False] != base
    gate_record.check(None if differs else Difference(
        "unseeded sampled tokens under engine seeds 0 and 1 (the engine seed did not key them)", None, None, None,
        "different tokens", "the same tokens"), "engine seed 1 vs 0")
    gate_record.occurred("unseeded sampled requests keyed by the engine seed", differs)


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sampled_runs_emit_the_target_distribution(make_llm, gate_record, drafter, sampling):
    prompts, params = sampled_workload(SAMPLING[sampling])
    outs = {}
    # The graph arm once per drafter (t1): seeded tokens equal, so the PIT test covers it too.
    arms = ((False, False), (True, False), (True, True)) if sampling == "t1" else ((False, False), (True, False))
    sync_llm = None  # the first arm's: the sync runner's engine
    for async_runner, graph in arms:
        llm = make_llm(spec=drafter, num_spec_tokens=4, max_num_seqs=32, max_num_batched_tokens=4096,
                       async_runner=async_runner, graph=graph, trace=graph or not async_runner)
        recorder = DraftRecorder(llm)
        outs[async_runner, graph] = llm.generate(prompts, params)
        sync_llm = llm if not async_runner else sync_llm
        if drafter == "block":  # the q verify was given is the q each draft was drawn from
            gate_record.check(draft_q_difference(recorder.calls),
                              f"{drafter} async_runner={async_runner} graph={graph}: stored draft q")
            gate_record.occurred("block drafter q checked on a sampled row",
                                 any(bool((c["temperature"] > 0).any()) for c in recorder.calls))
        gate_record.case(level="engine", drafter=drafter, sampling=sampling, async_runner=async_runner,
                         graph=graph, requests=len(prompts), tokens=SAMPLED_TOKENS)
        gate_record.occurred("async runner" if async_runner else "sync runner")
        gate_record.occurred("sampled graph arm", graph and any(s.route.endswith("/graph") for s in llm.trace))
    for (async_runner, graph), run_outs in outs.items():
        for i, (s, a) in enumerate(zip(outs[False, False], run_outs)):
            assert a.token_ids == s.token_ids, (f"request {i}: seeded sampled tokens differ between the sync "
                                                f"runner and async_runner={async_runner} graph={graph}")
    outs[False] = outs[False, False]
    drafted = sum(o.stats.num_draft_tokens for o in outs[False])
    accepted = sum(o.stats.num_accepted_tokens for o in outs[False])
    gate_record.occurred("sampled drafts accepted and rejected", 0 < accepted < drafted)
    if "top_k" in SAMPLING[sampling]:
        bound = binding_steps(sync_llm.model, outs[False], params)
        gate_record.measure(drafter=drafter, sampling=sampling, binding_steps=bound)
        gate_record.occurred("top-k bound", bound["top_k"] > 0)
        gate_record.occurred("top-p bound", bound["top_p"] > 0)
    tests = engine_p_values(sync_llm, outs[False], params, drafter)
    gate_record.measure(drafter=drafter, sampling=sampling, draft_tokens=drafted, accepted=accepted,
                        tests={name: {"values": n, "p_value": pv} for name, (n, pv) in tests.items()})
    gate_record.evidence(tests=tests, threshold=P_VALUE_THRESHOLD)
    for name, (_, p_value) in tests.items():
        assert p_value > P_VALUE_THRESHOLD, f"sampled {name} are not distributed as the target (PIT p={p_value:.2e})"


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_negative_control_lossy_engine_fails_the_distribution_test(make_llm, gate_record, monkeypatch, drafter):
    """The same engine test on a run whose verify takes the ratio with the wrong q must fail."""
    import engine.runner
    monkeypatch.setattr(engine.runner, "verify", distribution.wrong_q_verify)
    prompts, params = sampled_workload(SAMPLING["t1"])
    llm = make_llm(spec=drafter, num_spec_tokens=4, max_num_seqs=32, max_num_batched_tokens=4096,
                   async_runner=False, trace=True)
    gate_record.case(level="engine", drafter=drafter, sampling="t1", lossy=True)
    outs = llm.generate(prompts, params)
    tests = engine_p_values(llm, outs, params, drafter)
    gate_record.measure(drafter=drafter, negative_control=True,
                        tests={name: {"values": n, "p_value": pv} for name, (n, pv) in tests.items()})
    assert min(pv for _, pv in tests.values()) < P_VALUE_THRESHOLD, \
        f"the lossy verify passed every distribution test: {tests}"
    gate_record.occurred("negative control failed")


@pytest.mark.parametrize("lossy", [False, True], ids=["verify", "negative-control"])
@pytest.mark.parametrize("drafter", ["block"])  # so a target the block drafter was not trained for skips it
def test_verify_with_the_block_drafters_own_q_emits_the_target_distribution(make_llm, gate_record, lossy, drafter):
    """One verify row of a real run at binding temperature/top-k/top-p (the target's logits there,
    the block drafter's q with its zero-mass tail), verified ENGINE_Q_ROUNDS times."""
    llm = make_llm(spec="block", num_spec_tokens=3, async_runner=False)
    recorder = DraftRecorder(llm)
    llm.generate(list(PROMPTS[:4]), SamplingParams(max_tokens=12, seed=1, ignore_eos=True, **BINDING))
    target_logits, q, params = telling_verify_row(llm.model, recorder.calls)
    assert params == pytest.approx(BINDING), f"the recorded row's sampling parameters {params} are not {BINDING}"
    support = int((q[0] > 0).sum())
    gate_record.case(level="verify", drafter="block q", lossy=lossy, rounds=ENGINE_Q_ROUNDS, q_support=support,
                     **BINDING)
    results = engine_q_p_values(target_logits, q, params["temperature"], params["top_k"], params["top_p"],
                                ENGINE_Q_ROUNDS, distribution.wrong_q_verify if lossy else verify)
    assert all(n >= 500 for n, _ in results), f"a position was rarely reached: {results}"
    gate_record.measure(lossy=lossy, q_support=support, positions=[{"rounds": n, "p_value": pv} for n, pv in results])
    assert support < q.shape[-1], "top-k/top-p did not cut the drafter's q"
    judge_positions(gate_record, results, lossy, "block drafter q negative control failed",
                    "verify with the drafter's q")
