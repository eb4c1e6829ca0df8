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
On CUDA's compiled forward a one-token step runs engine/gemv.py's kernels and a longer one
cuBLAS, a choice no token shows: the plain runs arrive staggered, so the last request decodes
alone on the GEMV (spec runs, whose verify steps hold k + 1 tokens, are compared with them), and a
routing workload whose steps hold every size from one token to eight and longer ones, plain and
verifying, must call the GEMV at exactly its one-token steps, call for call (gates/gemv_steps.py).
Sampling: verify alone emits the target distribution at every position (chi-square per position),
and whole sampled engine runs emit it too (randomized PIT of the tokens, and for the one-hot ngram
drafter of its accept decisions, see gates/distribution.py), while the
same tests fail on a lossy verify (the ratio taken with the wrong q): the negative control.
A seeded sampled run is also the same on both runners and in the graph arm, token for token, so
the distribution test covers the graph arm's output too; and a seeded request's tokens are
the same alone and batched, with and without preemption, on every drafter and plain
(gates/seeded.py). Sampled requests without a seed take
their keys from the engine's seed: reproducible under the same engine seed (and runner), different
under another. In bfloat16, spec and plain greedy runs equal each other and the naive reference in
bfloat16 up to near-ties of bfloat16's precision (gates/reference.py near_tie_difference). A
sampled bfloat16 run at binding top-k/top-p, where the k-th logit is often tied, passes the PIT
test and a verify chi-square at a tied cut (with its negative control), and on its tied rows
verify's p equals the block drafter's q of the same row and parameters (gates/pq_rule.py).
Over 300 lines because it is one gate: its greedy, distribution, bfloat16 and engine-seed checks
report one set of claims and share its fixtures and workloads.
"""
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from engine.verify import verify
from gates import distribution, seeded
from gates.compare import Difference, token_difference
from gates.distribution import P_VALUE_THRESHOLD
from gates.draft_q import (
    DraftRecorder,
    binding_steps,
    cut_counts,
    draft_q_difference,
    engine_q_p_values,
    telling_verify_row,
    tied_verify_row,
)
from gates.gemv_steps import (
    GEMV_STEP_TOKENS,
    ROUTING_LEGS,
    ROUTING_WORKLOAD,
    StepKernels,
    count_gemv_calls,
    step_tokens,
)
from gates.invariants import history_difference
from gates.plugin import COMPILED, SESSION_PLUGIN
from gates.pq_rule import (
    StepRecorder,
    one_rule_difference,
    proposer_q,
    tie_rows,
    verify_accepts,
)
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
          "a finish truncated a verify step beside whole-history processors",
          "block drafter bfloat16 sampled top-k bound",
          "block drafter bfloat16 sampled top-p bound", "block drafter bfloat16 top-k cut inside a tie group",
          "block drafter bfloat16 tied row negative control failed", "block drafter p and q by one rule at a top-k tie",
          "block drafter p and q by one rule at a top-p tie", "seeded sampled preemption (sync runner)",
          "seeded sampled preemption (async runner)", "seeded resume verified drafts it held", "seeded sampled batch")

SAMPLED_REQUESTS, SAMPLED_TOKENS = 64, 48
SAMPLING = {"t1": dict(temperature=1.0), "t0.8-topk20-topp0.9": dict(temperature=0.8, top_k=20, top_p=0.9)}
BINDING = SAMPLING["t0.8-topk20-topp0.9"]
ENGINE_Q_ROUNDS = 20_000
# bfloat16 sampled: bfloat16 rounds the logits, so the k-th largest is often tied with the next
# (1 row in 30 at top_k 5); at these parameters top-k cuts about 70% of rows and top-p 60%.
BF16_BINDING = dict(temperature=1.0, top_k=5, top_p=0.95)
BF16_REQUESTS, BF16_TOKENS, BF16_ROUNDS = 16, 24, 4_000
# Small on purpose: bfloat16 is judged per token against a dense forward, and the engine seed
# needs only a few sampled tokens to tell two seeds apart.
BF16_WORKLOAD = Workload(prompts=tuple(PROMPTS[i] for i in (0, 3, 6, 7)), max_tokens=(16, 24, 12, 20),
                         arrival_steps=(0, 0, 1, 2), ignore_eos=(True,) * 4)
UNSEEDED = Workload.uniform(PROMPTS[:4], 12, 1.0)


@dataclass(frozen=True)
class PlainGreedy:
    tokens: dict[tuple[str, bool], list[int]]  # keyed (prompt, has processor)
    one_token_steps: int     # steps whose forward ran a single token: the last request decoding alone


# Staggered, so the last request decodes alone at the end: a one-token step, which the compiled
# forward on CUDA runs through engine/gemv.py's kernels (and several-token steps through cuBLAS;
# test_every_step_within_the_gemv_limit_takes_the_gemv checks that routing, size by size).
PLAIN_ARRIVALS = [2 * i for i in range(len(PROMPTS))]


@pytest.fixture(scope="module")
def plain_greedy(make_llm, forward) -> PlainGreedy:
    """Plain greedy output of every prompt, without and with the logits processor; a shorter
    max_tokens gives a prefix of it. Once per forward: spec runs are compared with plain runs of
    their own forward, whose steps of one token and of several take different kernels."""
    llm = make_llm(async_runner=False, trace=True)
    out = {}
    for processed in (False, True):
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                logits_processors=[no_immediate_repeat] if processed else [])
        outputs = llm.generate(list(PROMPTS), params, arrival_steps=PLAIN_ARRIVALS)
        out |= {(p, processed): o.token_ids for p, o in zip(PROMPTS, outputs)}
    one_token = sum(step_tokens(s) == 1 for s in llm.trace)
    return PlainGreedy(out, one_token)


def check_greedy(make_llm, gate_record, plain_greedy, reference, workload, **engine):
    processed = workload.host_history or (False,) * workload.num_reqs
    for async_runner in (False, True):
        r = run(make_llm, workload, async_runner=async_runner, **engine)
        gate_record.case(**{k: v for k, v in engine.items() if v is not None}, async_runner=async_runner,
                         num_reqs=workload.num_reqs)
        expected = {o.request_id: plain_greedy.tokens[p, h][:m] for o, p, m, h in
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


def test_plain_runs_hold_one_token_steps(gate_record, plain_greedy):
    """The plain runs every spec run is compared with hold one-token steps (the last request
    decoding alone), which CUDA's compiled forward runs on engine/gemv.py's kernels at one row:
    spec against plain then compares them with the verify steps' kernels."""
    gate_record.case(plain_runs="every prompt, staggered, without and with the logits processor")
    gate_record.measure(one_token_steps=plain_greedy.one_token_steps)
    assert plain_greedy.one_token_steps > 0, "the plain runs had no one-token step"


@pytest.mark.parametrize("leg", ROUTING_LEGS)
def test_every_step_within_the_gemv_limit_takes_the_gemv(make_llm, gate_record, reference, forward, gate_device,
                                                         leg):
    """ROUTING_WORKLOAD's steps (gates/gemv_steps.py) hold every size from one token to eight and
    longer ones, plain and with verify steps of four tokens a request; on CUDA's compiled forward
    each step of up to GEMV_STEP_TOKENS tokens (one) calls engine/gemv.py's kernels once a layer at
    its own rows and no longer step does, call for call: a routing that sends one-token steps to
    cuBLAS, or longer ones to the GEMV, is red, though it leaves every token right, and so is a
    compiled forward on CUDA without the path. Its tokens and finishes equal the naive reference
    decoder's."""
    counted = []
    r = run(make_llm, ROUTING_WORKLOAD, observe=lambda llm: counted.append((count_gemv_calls(llm), llm)),
            async_runner=False, graph=False, **ROUTING_LEGS[leg].engine)
    rows, llm = counted[0]
    if forward == COMPILED and gate_device.startswith("cuda"):
        assert rows is not None, "CUDA's compiled forward has no GEMV path: nothing routes one-token steps to it"
    steps = StepKernels.of(r.trace, rows, len(llm.model.model.layers))
    gate_record.case(leg=leg, num_reqs=ROUTING_WORKLOAD.num_reqs, gemv_path=rows is not None)
    gate_record.measure(leg=leg, **steps.measures())
    gate_record.check(reference_difference(reference, r, r.max_model_len)[0],
                      f"{r.label()}: the routing workload vs the naive reference decoder")
    missing = sorted(ROUTING_LEGS[leg].sizes - set(steps.step_sizes))
    assert not missing and max(steps.step_sizes) > GEMV_STEP_TOKENS, \
        f"the routing workload held no step of {missing or f'over {GEMV_STEP_TOKENS}'} tokens " \
        f"({steps.measures()['step_sizes']})"
    assert not steps.routing_difference(), (f"steps of up to {GEMV_STEP_TOKENS} tokens off engine/gemv.py's kernels, "
                                            "or longer ones on them: {size: (calls expected, made)} "
                                            f"{steps.routing_difference()}")


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
        if not any(o.stats.num_accepted_tokens for o in r.outputs):  # a target the drafter never matches
            gate_record.unexercisable("a finish truncated a verify step beside whole-history processors",
                                      f"{r.label()}: no draft was accepted, so no verify step could be truncated")
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


def sampled_workload(sampling: dict, requests: int = SAMPLED_REQUESTS,
                     tokens: int = SAMPLED_TOKENS) -> tuple[list[str], list[SamplingParams]]:
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    params = [SamplingParams(max_tokens=tokens, seed=i, ignore_eos=True, **sampling) for i in range(requests)]
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


@pytest.mark.parametrize("drafter", ("plain", *DRAFTERS))
def test_a_seeded_request_draws_its_tokens_alone_batched_and_preempted_alike(make_llm, gate_record, drafter):
    """Token for token, every arm of gates/seeded.py against the requests run one at a time; the
    preempted arms must preempt, and a resume verify the drafts it held."""
    alone = None
    for arm, engine in seeded.ARMS.items():
        r = run(make_llm, seeded.WORKLOAD, **seeded.engine_options(drafter), **engine)
        gate_record.case(seeded=arm, drafter=drafter, num_reqs=seeded.WORKLOAD.num_reqs, **engine)
        if arm == seeded.ALONE:
            assert max(s.num_reqs for s in r.trace) == 1 and r.num_preemptions == 0, "the reference ran a batch"
            alone = r
            continue
        gate_record.check(token_difference({o.request_id: o.token_ids for o in alone.outputs}, r),
                          f"{drafter} {arm}: seeded sampled tokens vs each request alone")
        assert (r.num_preemptions > 0) == ("preempted" in arm), f"{arm}: {r.num_preemptions} preemptions"
        gate_record.occurred(f"seeded sampled preemption ({'async' if r.is_async else 'sync'} runner)",
                             r.num_preemptions > 0)
        gate_record.occurred("seeded resume verified drafts it held", seeded.resumes_with_drafts(r) > 0)
        if r.num_preemptions and not any(o.stats.num_draft_tokens for o in r.outputs):
            gate_record.unexercisable("seeded resume verified drafts it held",
                                      f"{drafter} {arm}: the drafter proposed no draft in the run, so none was held")
        gate_record.occurred("seeded sampled batch", max(s.num_reqs for s in r.trace) > 1)
        gate_record.occurred("sampled graph arm", any(route.endswith("/graph") for route in r.routes))


@pytest.fixture(scope="module")
def bf16_sampled(make_llm, request):
    """One sampled bfloat16 run of the block drafter at BF16_BINDING (sync runner), every verify and
    propose call recorded (StepRecorder, then DraftRecorder around it)."""
    reason = request.config.pluginmanager.get_plugin(SESSION_PLUGIN).skipped_drafters().get("block")
    if reason:
        pytest.skip(reason)
    llm = make_llm(spec="block", num_spec_tokens=4, dtype="bfloat16", max_num_seqs=BF16_REQUESTS,
                   async_runner=False)
    steps = StepRecorder(llm)  # first: its verify and propose are the runner's own, for the probes
    drafts = DraftRecorder(llm)
    prompts, params = sampled_workload(BF16_BINDING, BF16_REQUESTS, BF16_TOKENS)
    outs = llm.generate(prompts, params)
    return dict(llm=llm, outs=outs, params=params, steps=steps, drafts=drafts, rows=steps.sampled_rows())


@pytest.mark.parametrize("drafter", ["block"])
def test_bfloat16_sampled_run_at_binding_top_k_top_p(gate_record, bf16_sampled, drafter):
    """bfloat16 logits at binding top-k and top-p: the cuts bind, top-k's cut falls inside tie groups
    top-p keeps, the drafter's q is its logits processed like p, and the tokens pass the PIT test."""
    run = bf16_sampled
    gate_record.case(level="engine", dtype="bfloat16", drafter=drafter, requests=BF16_REQUESTS, tokens=BF16_TOKENS,
                     **BF16_BINDING)
    gate_record.check(draft_q_difference(run["drafts"].calls), "bfloat16: stored draft q")
    counts = cut_counts(run["rows"])
    gate_record.occurred("block drafter bfloat16 sampled top-k bound", counts["top_k"] > 0)
    gate_record.occurred("block drafter bfloat16 sampled top-p bound", counts["top_p"] > 0)
    gate_record.occurred("block drafter bfloat16 top-k cut inside a tie group", counts["tied_and_kept"] > 0)
    tests = engine_p_values(run["llm"], run["outs"], run["params"], drafter)
    gate_record.measure(dtype="bfloat16", cut_rows=counts, tests={n: {"values": v, "p_value": pv}
                                                                   for n, (v, pv) in tests.items()})
    gate_record.evidence(tests=tests, threshold=P_VALUE_THRESHOLD, cut_rows=counts)
    for name, (_, p_value) in tests.items():
        assert p_value > P_VALUE_THRESHOLD, \
            f"bfloat16 sampled {name} are not distributed as the target (PIT p={p_value:.2e})"


@pytest.mark.parametrize("lossy", [False, True], ids=["verify", "negative-control"])
@pytest.mark.parametrize("drafter", ["block"])
def test_bfloat16_verify_at_a_tied_top_k_cut_emits_the_target_distribution(gate_record, bf16_sampled, drafter, lossy):
    """A recorded bfloat16 draft position whose top-k cut is inside a tie group that top-p keeps,
    with the drafter's own q there, verified BF16_ROUNDS times: the tokens follow p over its whole
    support (every tied token included); a lossy verify fails."""
    target_logits, q, params = tied_verify_row(bf16_sampled["rows"])
    gate_record.case(level="verify", dtype="bfloat16", drafter="block q at a tie", lossy=lossy, rounds=BF16_ROUNDS,
                     **params)
    results = engine_q_p_values(target_logits, q, params["temperature"], params["top_k"], params["top_p"],
                                BF16_ROUNDS, distribution.wrong_q_verify if lossy else verify)
    gate_record.measure(dtype="bfloat16", lossy=lossy, positions=[{"rounds": n, "p_value": pv} for n, pv in results])
    judge_positions(gate_record, results, lossy, "block drafter bfloat16 tied row negative control failed",
                    "verify at a tied top-k cut")


@pytest.mark.parametrize("drafter", ["block"])
def test_verify_p_and_the_proposers_q_are_processed_by_one_rule(gate_record, bf16_sampled, gate_device, drafter):
    """Recorded bfloat16 logits rows, each with parameters that put a top-k or top-p cut inside a tie
    group: the q the runner's propose returns for the row and the p verify judges it with (read from
    its accept decisions, gates/pq_rule.py) have the same support and the same values."""
    steps = bf16_sampled["steps"]
    assert steps.runner.proposer.has_q, "the block proposer hands verify its q"
    rows = tie_rows([logits for row in bf16_sampled["rows"] for logits in row.logits], limit=12)
    gate_record.case(level="verify and propose", dtype="bfloat16", rows=len(rows.kinds), kinds=list(rows.kinds),
                     top_k=rows.top_k.tolist(), top_p=rows.top_p.tolist())
    q = proposer_q(steps, rows)
    probes, accepted = verify_accepts(steps.verify, rows, q, gate_device)
    gate_record.measure(probes=len(accepted), support=int((q > 0).sum()))
    gate_record.check(one_rule_difference(rows, q, probes, accepted), "p and q of one row")
    gate_record.occurred("block drafter p and q by one rule at a top-k tie", "top-k" in rows.kinds)
    gate_record.occurred("block drafter p and q by one rule at a top-p tie",
                         "top-p" in rows.kinds or "both" in rows.kinds)


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
