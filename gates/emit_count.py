"""Gate emit-count: per step and request, the async runner emits as many tokens (num_accepted + 1)
as the sync runner; every run's trace agrees with its tokens and metrics; greedy acceptance is
what the drafts imply; ngram drafts are the lookup of the committed history.

Every greedy request of every run is also checked against the naive reference decoder
(gates/reference.py): its tokens, and how and when it finished. The workloads set stop_token_ids
and ignore_eos and reach max_model_len, and the gate is red unless each of those finishes happened:
a defect in the finish rule that sync and async share is invisible to their comparison. Every
request with a logits processor records the output history each call received, which must be its
committed output so far, call by call (gates/invariants.py history_difference).

Verify is lossless, so a stale draft or a logit gathered from the wrong row can leave every
token right and move only acceptance: these checks see acceptance, per step, exactly.

The compiled forward against the reference one (when the session judges both: on CUDA, or on the
CPU under --deep or --forwards reference,compiled): compile=True as a user sets it, inductor's
kernels for the fused layers, the attention metadata, the logits gather, verify and the n-gram
proposer, must emit per step and request exactly what the reference forward emits, and equal the
naive reference decoder. The block drafter reads the target's hidden states, so a fused forward
that hands it the wrong ones moves only acceptance, which the compiled arm's own async-vs-sync
comparison cannot see (both runners share the fault): emit counts against the reference forward do.

Through the request lifecycle too: with requests aborted (waiting, running, with their step in
flight, their slot then taken by a new admission), the requests not aborted pass every check above
and emit, per (request, position), exactly what a sync run without the aborted ones emits; with a
binding token budget, a running request that sat out steps verifies, when it comes back, the drafts
of its own history (not none, not another's).

Every run's scheduler limits, step by step (gates/invariants.py, limits_difference): tokens
scheduled within max_num_batched_tokens, KV blocks held within the pool and each held once, the
blocks reserved covering every position written (and, behind a step in flight, every position it
could have written). A run with a binding budget and a full pool (LIMITS: a prefill waits for verify
rows to go, requests are preempted), sync and async, both drafters, eager and graph steps, makes
them bind.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine import SamplingParams
from gates.compare import runs_difference
from gates.invariants import (
    acceptance_difference,
    history_difference,
    limits_difference,
    ngram_draft_difference,
    prefill_deferred_by_budget,
    trace_consistency,
)
from gates.lifecycle import (
    ABORT_REUSE,
    ABORT_REUSE_ENGINE,
    GAPS,
    GAPS_ENGINE,
    lifecycles,
    note_lifecycle,
    run_against_kept,
    scheduling_gaps,
)
from gates.plugin import COMPILED, REFERENCE
from gates.reference import reference_difference
from gates.workloads import (
    CONTEXT_LIMIT,
    DRAFTERS,
    GRAPH_PADDING,
    GRAPH_PADDING_ENGINE,
    LIMITS,
    MIXED_REFUSALS,
    MIXED_REFUSALS_ENGINE,
    PROMPTS,
    Workload,
    context_limit_engine,
    gate_settings,
    limits_engine,
    run,
    run_pair,
    workloads,
)

CLAIMS = ("ngram", "block", "num_reqs>1", "k>1", "drafts accepted", "drafts rejected",
          "async emitted more than one token in a step", "preemption", "graph arm",
          "graph step with padding rows", "host-history request", "finished on stop_token_ids", "finished on eos",
          "ignore_eos passed an eos", "finished at max_tokens", "finished at max_model_len",
          "abort with a step in flight", "abort of a waiting request", "aborted slot reused by a new admission",
          "scheduling gap: a running request sat out a step and came back device-fed",
          "logits processor histories checked call by call",
          "token budget bound: a prefill waited while verify rows ran (sync and async)",
          "preemption under a binding token budget (sync and async)")

# The reference decoder's finish triggers (gates/reference.py) and the claims they satisfy.
FINISH_CLAIMS = {"stop_token_ids": "finished on stop_token_ids", "eos": "finished on eos",
                 "ignore_eos": "ignore_eos passed an eos", "max_tokens": "finished at max_tokens",
                 "max_model_len": "finished at max_model_len"}


def check_pair(gate_record, reference, sync, async_):
    check_runs(gate_record, reference, sync, async_)
    note_coverage(gate_record, sync, async_)


def check_runs(gate_record, reference, sync, async_):
    for r in (sync, async_):
        diff, triggers = reference_difference(reference, r, r.max_model_len)
        gate_record.check(diff, f"{r.label()}: the engine vs the naive reference decoder")
        for trigger in triggers:
            gate_record.occurred(FINISH_CLAIMS[trigger])
        greedy = {o.request_id for o, p in zip(r.outputs, r.sampling_params)
                  if p.is_greedy and not p.logits_processors}
        gate_record.check(trace_consistency(r.outputs, r.trace), f"{r.label()}: trace vs outputs and metrics")
        gate_record.check(history_difference(r.outputs, r.histories, r.trace),
                          f"{r.label()}: the history each logits processor call received")
        gate_record.check(limits_difference(r.trace), f"{r.label()}: scheduler limits")
        gate_record.check(acceptance_difference(r.outputs, r.trace, greedy), f"{r.label()}: greedy acceptance")
        if r.engine["spec"] == "ngram":
            gate_record.check(ngram_draft_difference(r.outputs, r.trace), f"{r.label()}: ngram drafts")
    gate_record.check(runs_difference(sync, async_, fields=("emit_count",)), "async vs sync")


def note_coverage(gate_record, sync, async_):
    recs = [r for s in async_.trace for r in s.requests if not r.is_prefill and r.num_draft]
    gate_record.occurred(sync.engine["spec"])
    gate_record.occurred("num_reqs>1", max(s.num_reqs for s in async_.trace) > 1)
    gate_record.occurred("k>1", sync.engine["num_spec_tokens"] > 1)
    gate_record.occurred("drafts accepted", any(r.num_accepted for r in recs))
    gate_record.occurred("drafts rejected", any(r.num_accepted < r.num_draft for r in recs))
    gate_record.occurred("async emitted more than one token in a step", any(r.emit_count > 1 for r in recs))
    gate_record.occurred("preemption", sync.num_preemptions > 0 and async_.num_preemptions > 0)
    gate_record.occurred("graph arm", any(route.endswith("/graph") for route in async_.routes))
    gate_record.occurred("graph step with padding rows", any(s.num_padding_rows for s in async_.trace))
    gate_record.occurred("host-history request", any(async_.workload.host_history))
    gate_record.occurred("logits processor histories checked call by call",
                         any(len(calls) > 1 for calls in async_.histories.values()))


# First in the module: a compiled-forward defect's tree (specgate prove) stops the gate at its first red.
@pytest.mark.forwards(REFERENCE, COMPILED)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_the_compiled_forward_emits_what_the_reference_forward_emits(make_llm, gate_record, reference, drafter):
    """The async runner's graph arm, mixed refusals and preemption, once per forward: the compiled
    run's tokens equal the naive reference decoder's, and its emit counts the reference forward's
    per (request, position)."""
    engine = dict(spec=drafter, num_spec_tokens=3, graph=True, async_runner=True, **MIXED_REFUSALS_ENGINE)
    gate_record.case(drafter=drafter, workload="mixed refusals", k=3, forwards=f"{COMPILED} vs {REFERENCE}")
    expected = run(make_llm, MIXED_REFUSALS, compile=False, **engine)
    compiled = run(make_llm, MIXED_REFUSALS, compile=True, **engine)
    gate_record.check(reference_difference(reference, compiled, compiled.max_model_len)[0],
                      f"{compiled.label()}, compiled: the engine vs the naive reference decoder")
    gate_record.check(runs_difference(expected, compiled, fields=("emit_count",)),
                      "the compiled forward vs the reference forward")
    note_coverage(gate_record, expected, compiled)
    assert any(r.num_draft for s in compiled.trace for r in s.requests if not r.is_prefill), "no draft was verified"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(workload=workloads(min_reqs=2, min_tokens=8, host_history=None, stop_rules=True), k=st.integers(1, 6),
       preempt=st.booleans())
@gate_settings(4)
def test_async_emit_counts_equal_sync(make_llm, gate_record, reference, drafter, graph, workload, k, preempt):
    engine = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=4,
                  num_kv_blocks=18 if preempt else None)
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=workload.num_reqs, preempt=preempt)
    check_pair(gate_record, reference, *run_pair(make_llm, workload, **engine))


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_with_every_refusal_kind_and_preemption(make_llm, gate_record, reference, drafter):
    engine = dict(spec=drafter, num_spec_tokens=3, **MIXED_REFUSALS_ENGINE)
    gate_record.case(drafter=drafter, workload="mixed refusals", k=3)
    sync, async_ = run_pair(make_llm, MIXED_REFUSALS, **engine)
    assert sync.num_preemptions and async_.num_preemptions, "the cache never filled: no preemption"
    check_pair(gate_record, reference, sync, async_)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_in_padded_graph_steps_with_every_slot_taken(make_llm, gate_record, reference, drafter):
    """Padding rows run alongside real ones and must touch no request's state slot."""
    gate_record.case(drafter=drafter, workload="graph padding", k=3)
    sync, async_ = run_pair(make_llm, GRAPH_PADDING, spec=drafter, num_spec_tokens=3, **GRAPH_PADDING_ENGINE)
    assert any(s.num_padding_rows for s in async_.trace), "no graph step was padded"
    check_pair(gate_record, reference, sync, async_)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_when_spec_decoding_reaches_max_model_len(make_llm, gate_record, reference, drafter):
    """Verify steps near the end of the context: the last step may carry drafts past it (on KV
    blocks of 8 tokens, the one gate engine off the default 16)."""
    engine = context_limit_engine(make_llm().tokenizer)
    gate_record.case(drafter=drafter, workload="context limit", k=4, **engine)
    sync, async_ = run_pair(make_llm, CONTEXT_LIMIT, spec=drafter, num_spec_tokens=4, **engine)
    check_pair(gate_record, reference, sync, async_)
    assert any(o.finish_reason == "context" and len(o.prompt_token_ids) + len(o.token_ids) == sync.max_model_len
               for o in sync.outputs), "no request reached max_model_len"


def stops_on_own_tokens(outputs, at: int = 4) -> tuple[tuple[int, ...], ...]:
    """Per request, a stop token its own greedy output first emits at position `at` or later (the
    earliest such), so each request stops mid-stream on any model; none where the output repeats
    one token throughout."""
    stops = []
    for out in outputs:
        ids = out.token_ids
        first = next((t for j, t in enumerate(ids) if j >= at and t not in ids[:j]), None)
        stops.append(() if first is None else (first,))
    return tuple(stops)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_when_requests_stop_on_tokens_they_emit(make_llm, gate_record, reference, drafter):
    """Stop rules on whatever target (the fixture or any folder): each request's stop token is one
    its own greedy output emits mid-stream (read from a plain run first), so it finishes on
    stop_token_ids with drafts in flight past the stop, arrivals staggered."""
    prompts, budget = PROMPTS[:4], 24
    plain = make_llm(max_num_seqs=4).generate(list(prompts), SamplingParams(temperature=0, max_tokens=budget,
                                                                            ignore_eos=True))
    workload = Workload(prompts, (budget,) * 4, arrival_steps=(0, 0, 1, 3),
                        stop_token_ids=stops_on_own_tokens(plain), ignore_eos=(True,) * 4)
    gate_record.case(drafter=drafter, workload="stops on own tokens", k=3)
    sync, async_ = run_pair(make_llm, workload, spec=drafter, num_spec_tokens=3, max_num_seqs=4)
    check_pair(gate_record, reference, sync, async_)
    assert any(o.finish_reason == "stop" for o in sync.outputs), "no request finished on its stop token"


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
@given(lifecycle=lifecycles(min_tokens=8, host_history=None, stop_rules=True), k=st.integers(1, 5))
@gate_settings(2)
def test_emit_counts_of_requests_not_aborted_equal_a_run_without_the_aborted(make_llm, gate_record, reference,
                                                                             drafter, graph, lifecycle, k):
    engine = dict(spec=drafter, num_spec_tokens=k, graph=graph, max_num_seqs=3)
    gate_record.case(drafter=drafter, graph=graph, k=k, num_reqs=lifecycle.workload.num_reqs,
                     aborts=[(a.request, a.step) for a in lifecycle.aborts])
    baseline, kept, life = run_against_kept(make_llm, lifecycle, **engine)
    check_runs(gate_record, reference, baseline, kept)
    note_lifecycle(gate_record, life)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_after_an_abort_whose_slot_is_taken_next(make_llm, gate_record, reference, drafter, graph):
    gate_record.case(drafter=drafter, graph=graph, workload="abort, slot reused", k=3)
    baseline, kept, life = run_against_kept(make_llm, ABORT_REUSE, spec=drafter, num_spec_tokens=3, graph=graph,
                                            **ABORT_REUSE_ENGINE)
    check_runs(gate_record, reference, baseline, kept)
    note_lifecycle(gate_record, life)


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_after_scheduling_gaps(make_llm, gate_record, reference, drafter):
    """A binding token budget leaves running requests out of steps; back, each verifies its own drafts."""
    gate_record.case(drafter=drafter, workload="scheduling gaps", **GAPS_ENGINE)
    sync, async_ = run_pair(make_llm, GAPS, spec=drafter, **GAPS_ENGINE)
    check_runs(gate_record, reference, sync, async_)
    gate_record.occurred("scheduling gap: a running request sat out a step and came back device-fed",
                         any(r.device_fed for r in scheduling_gaps(async_.trace)))


@pytest.mark.parametrize("drafter", DRAFTERS)
def test_emit_counts_under_a_binding_token_budget_and_kv_pool(make_llm, gate_record, reference, drafter):
    """The budget and the pool both bind (graph=True: uniform verify steps in the graph arm, steps
    with a prefill eager); every step of both runs is checked against its limits."""
    engine = limits_engine(make_llm().tokenizer)
    gate_record.case(drafter=drafter, workload="binding limits", **engine)
    sync, async_ = run_pair(make_llm, LIMITS, spec=drafter, **engine)
    check_pair(gate_record, reference, sync, async_)
    assert {"eager", "graph"} <= {route.split("/")[1] for route in async_.routes}, async_.routes
    gate_record.occurred("token budget bound: a prefill waited while verify rows ran (sync and async)",
                         prefill_deferred_by_budget(sync.trace) and prefill_deferred_by_budget(async_.trace))
    gate_record.occurred("preemption under a binding token budget (sync and async)",
                         sync.num_preemptions > 0 and async_.num_preemptions > 0)
