"""Gate acceptance: the bench reports acceptance per leg (engine/bench/legs.py run_leg) and folds it
(fold); both must equal what the trace says the device did, in both oracle engines' units:

    vLLM:   drafts, draft tokens, accepted, per-position accepted; τ = 1 + accepted / drafts,
            acceptance rate = accepted / draft tokens;
    SGLang: verify steps; accept length = completion tokens / verify steps.

The two agree exactly once prefills and truncation are counted: completion tokens = prefills +
verify steps + accepted - truncated. One warm-leg predicate must pick the legs for both the
throughput and the acceptance axis, and every field the bench folds (its summary and the plot's
figures) must equal its recomputation from the leg records (gates/bench_fold.py).
"""
import functools

import pytest

from engine.bench import legs as bench
from gates.bench_fold import report_difference
from gates.compare import Difference
from gates.invariants import real_records, width

CLAIMS = ("ngram", "block", "sync runner", "async runner", "num_reqs>1", "k>1", "drafts accepted",
          "tokens truncated at max_tokens", "warm and cold legs", "sampled legs")
CONCURRENCIES, LEGS, WARMUP_LEGS = (1, 4), 3, 1


def expected_acceptance(outputs, trace) -> dict:
    """A leg's acceptance recomputed from its trace records, with the units' own formulas."""
    real = real_records(trace, outputs)
    drafting = [r for recs in real.values() for _, r in recs if width(r) > 0]  # a resume's drafts count too
    verify = [r for r in drafting if not r.is_prefill]
    prefills = sum(r.is_prefill for recs in real.values() for _, r in recs)
    emitted = sum(len(r.sampled) for recs in real.values() for _, r in recs)
    completion = sum(len(o.token_ids) for o in outputs)
    drafts = sum(1 for r in drafting if r.num_draft)
    draft_tokens = sum(r.num_draft for r in drafting)
    accepted = sum(r.num_accepted for r in drafting)
    per_position = [sum(1 for r in drafting if r.num_accepted > j)
                    for j in range(max((r.num_draft for r in drafting), default=0))]
    return {"num_requests": len(outputs), "completion_tokens": completion, "verify_steps": len(verify),
            "num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
            "accepted_per_position": per_position,
            "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else 1.0,
            "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else 0.0,
            "accept_length": round(completion / len(verify), 4) if verify else 0.0,
            "_prefills": prefills, "_truncated": emitted - completion}


def acceptance_difference(leg_index: int, reported: dict, expected: dict) -> Difference | None:
    for name, want in expected.items():
        if name.startswith("_"):
            continue
        got = reported.get(name)
        if name == "accepted_per_position":
            got = list(got or [])
            while len(got) > len(want) and got[-1] == 0:
                got.pop()
        if got != want:
            return Difference(f"leg acceptance {name}", leg_index, None, None, want, got)
    identity = (expected["_prefills"] + expected["verify_steps"] + expected["num_accepted_tokens"]
                - expected["_truncated"])
    if identity != expected["completion_tokens"]:
        return Difference("completion = prefills + verify steps + accepted - truncated", leg_index, None, None,
                          expected["completion_tokens"], identity)
    return None


def fold_difference(legs: list, workload, drafter: str) -> Difference | None:
    """One warm-leg predicate, the first WARMUP_LEGS legs of each concurrency cold; then every
    field of the bench's folds (summary and figures) against their recomputation from the leg
    records (gates/bench_fold.py)."""
    for leg in legs:
        if leg.warm != (leg.index >= WARMUP_LEGS):
            return Difference("warm-leg predicate", None, None, leg.concurrency, leg.index >= WARMUP_LEGS,
                              leg.warm)
    return report_difference(bench.report(legs, workload, {"spec": drafter}))


@functools.cache
def heldout_workload(corpus, temperature: float) -> bench.Workload:
    return bench.heldout_workload(corpus, num_prompts=4, max_tokens=24, temperature=temperature)


def traced_legs(make_llm, workload, **engine) -> tuple[list, dict, dict]:
    """Run the bench's legs (bench.run_bench, as `specgate bench` does) on traced engines; per
    leg, the acceptance the trace implies."""
    runs = []  # (outputs, trace) of each generate call, in the order run_bench makes them

    def make(c):
        llm = make_llm(trace=True, max_num_seqs=c, **engine)
        generate = llm.generate

        def capture(*args, **kwargs):
            start = len(llm.trace)
            outputs = generate(*args, **kwargs)
            runs.append((outputs, llm.trace[start:]))
            return outputs
        llm.generate = capture
        return llm

    reported = []  # what `specgate bench` prints a line for, leg by leg, off a terminal
    legs = bench.run_bench(make, workload, list(CONCURRENCIES), LEGS, WARMUP_LEGS, progress=False,
                           on_leg=reported.append)
    assert len(runs) == len(legs), f"{len(legs)} legs made {len(runs)} engine runs"
    assert reported == legs, "on_leg did not see every leg once, in order, as it finished"
    expected, traces = {}, {}
    for leg, (outputs, trace) in zip(legs, runs):
        traces[(leg.concurrency, leg.index)] = trace
        expected[(leg.concurrency, leg.index)] = expected_acceptance(outputs, trace)
    return legs, expected, traces


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
def test_bench_acceptance_equals_the_trace(make_llm, gate_record, corpus, drafter, async_runner, temperature):
    workload = heldout_workload(corpus, temperature)
    k = 4
    legs, expected, traces = traced_legs(make_llm, workload, spec=drafter, num_spec_tokens=k,
                                         async_runner=async_runner)
    for leg in legs:
        gate_record.case(drafter=drafter, async_runner=async_runner, temperature=temperature,
                         concurrency=leg.concurrency, leg=leg.index, warm=leg.warm)
        gate_record.check(acceptance_difference(leg.index, leg.acceptance, expected[(leg.concurrency, leg.index)]),
                          f"concurrency {leg.concurrency} leg {leg.index}")
        gate_record.occurred("num_reqs>1",
                             max((s.num_reqs for s in traces[(leg.concurrency, leg.index)]), default=0) > 1)
        gate_record.occurred("tokens truncated at max_tokens", expected[(leg.concurrency, leg.index)]["_truncated"] > 0)
        gate_record.occurred("drafts accepted", leg.acceptance["num_accepted_tokens"] > 0)
    gate_record.check(fold_difference(legs, workload, drafter), "fold")
    gate_record.occurred(drafter)
    gate_record.occurred("async runner" if async_runner else "sync runner")
    gate_record.occurred("k>1", k > 1)
    gate_record.occurred("sampled legs", temperature > 0)
    gate_record.occurred("warm and cold legs", {leg.warm for leg in legs} == {True, False})
