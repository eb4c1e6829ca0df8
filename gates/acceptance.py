"""Gate acceptance: the bench reports acceptance per leg (engine/bench/legs.py run_leg) and folds it
(fold); both must equal what the trace says the device did, in both oracle engines' units:

    vLLM:   drafts, draft tokens, accepted, per-position accepted; τ = 1 + accepted / drafts,
            acceptance rate = accepted / draft tokens;
    SGLang: verify steps; accept length = completion tokens / verify steps.

The two agree exactly once prefills and truncation are counted: completion tokens = prefills +
verify steps + accepted - truncated. One warm-leg predicate must pick the legs for both the
throughput and the acceptance axis, and every field the bench folds (its summary and the plot's
figures) must equal its recomputation from the leg records (gates/bench_fold.py).

At one warm-up leg the two axes agree whatever cut-off each applies (the first leg, or every leg
past the first, is the same set), so each case runs the bench at its own leg and warm-up counts,
from a seeded draw (fold_settings): warm-up 0 (every leg warm), 1, 2 and 3 for each drafter, legs
past the warm-up 1 or 2. At every setting both axes must fold over exactly the warm legs, each
axis's population read back from its own figures (gates/bench_fold.py same_legs_difference).
"""
import functools
import os
import random
from dataclasses import dataclass, replace

import pytest

from engine.bench import legs as bench
from gates.bench_fold import report_difference, same_legs_difference
from gates.compare import Difference
from gates.invariants import real_records, width
from gates.processors import HistoryRecorder
from gates.workloads import DRAFTERS

CLAIMS = ("ngram", "block", "sync runner", "async runner", "num_reqs>1", "k>1", "drafts accepted",
          "a width-0 request beside drafting ones",
          "tokens truncated at max_tokens", "warm and cold legs", "sampled legs", "warm-up 0: every leg warm",
          "warm-up 2", "warm-up more than 2", "several warm legs folded")
CONCURRENCIES, LEGS, WARMUP_LEGS = (1, 4), 3, 1   # LEGS, WARMUP_LEGS: traced_legs' defaults, the bench's own
RUNS = ((False, 0.0), (False, 0.8), (True, 0.0), (True, 0.8))   # (async_runner, temperature) of each case
# Each drafter's four cases take these warm-up counts in a seeded order, so 0, 2 and more than 2 occur
# with either drafter alone (a target the block drafter does not fit still draws them); legs past the
# warm-up: 1 or 2. The mean is the 3 legs of one warm-up leg the gate ran before, so it costs the same.
WARMUPS, EXTRA_LEGS, FOLD_SEED = (0, 1, 2, 3), (1, 2), 34
# The request of each leg that gets a logits processor (a HistoryRecorder, which changes nothing):
# its sampling needs the host, so it decodes at spec width 0 beside drafting requests, and its
# decode steps are verify steps too (Request.record_verify).
HOST_ROW = 1
DEEP_SETTINGS, DEEP_MAX_WARMUP, DEEP_MAX_EXTRA = 3, 5, 3   # under --deep: more settings per case, drawn freely


@dataclass(frozen=True)
class FoldSetting:
    legs: int            # legs per concurrency
    warmup_legs: int     # the first warmup_legs legs of each concurrency are cold

    def __post_init__(self):
        if not 0 <= self.warmup_legs < self.legs:
            raise ValueError(f"a fold setting needs 0 <= warmup_legs < legs (a warm leg to fold), got "
                             f"legs={self.legs}, warmup_legs={self.warmup_legs}")


def fold_settings(drafters: tuple[str, ...], deep: bool = False,
                  seed: int = FOLD_SEED) -> dict[tuple[str, bool, float], list[FoldSetting]]:
    """(drafter, async_runner, temperature) -> the bench settings that case runs, from a seeded
    draw: per drafter, WARMUPS shuffled over its RUNS, each with 1 or 2 warm legs; under `deep`
    also DEEP_SETTINGS drawn freely (warm-up 0..DEEP_MAX_WARMUP, 1..DEEP_MAX_EXTRA warm legs)."""
    rng = random.Random(seed)
    out = {}
    for drafter in drafters:
        for run, warmup in zip(RUNS, rng.sample(WARMUPS, len(WARMUPS))):
            out[(drafter, *run)] = [FoldSetting(warmup + rng.choice(EXTRA_LEGS), warmup)]
    for key in out if deep else ():
        for _ in range(DEEP_SETTINGS):
            warmup = rng.randint(0, DEEP_MAX_WARMUP)
            out[key].append(FoldSetting(warmup + rng.randint(1, DEEP_MAX_EXTRA), warmup))
    return out


FOLD_SETTINGS = fold_settings(DRAFTERS, deep=os.environ.get("HYPOTHESIS_PROFILE") == "deep")


def expected_acceptance(outputs, trace) -> dict:
    """A leg's acceptance recomputed from its trace records, with the units' own formulas."""
    records = [r for recs in real_records(trace, outputs).values() for _, r in recs]  # a resume's drafts too
    # Every decode step is a verify step, with drafts or without (spec width 0: a request whose
    # sampling needs the host), as Request.record_verify counts it.
    verify = [r for r in records if not r.is_prefill]
    prefills = sum(r.is_prefill for r in records)
    emitted = sum(len(r.sampled) for r in records)
    completion = sum(len(o.token_ids) for o in outputs)
    drafts = sum(1 for r in records if r.num_draft)
    draft_tokens = sum(r.num_draft for r in records)
    accepted = sum(r.num_accepted for r in records)
    per_position = [sum(1 for r in records if r.num_accepted > j)
                    for j in range(max((r.num_draft for r in records), default=0))]
    return {"num_requests": len(outputs), "completion_tokens": completion, "verify_steps": len(verify),
            "num_drafts": drafts, "num_draft_tokens": draft_tokens, "num_accepted_tokens": accepted,
            "accepted_per_position": per_position,
            "mean_acceptance_length": round(1 + accepted / drafts, 4) if drafts else 1.0,
            "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else 0.0,
            "accept_length": round(completion / len(verify), 4) if verify else 0.0,
            "_prefills": prefills, "_truncated": emitted - completion}


def width0_beside_drafts(outputs, trace, request_id: int) -> bool:
    """Whether some step decoded `request_id` at spec width 0 while another request verified drafts."""
    steps: dict[int, list[tuple[int, int]]] = {}
    for rid, recs in real_records(trace, outputs).items():
        for s, r in recs:
            if not r.is_prefill:
                steps.setdefault(s, []).append((rid, width(r)))
    return any(any(rid == request_id and w == 0 for rid, w in rows)
               and any(rid != request_id and w > 0 for rid, w in rows) for rows in steps.values())


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


def fold_difference(legs: list, workload, drafter: str, warmup_legs: int = WARMUP_LEGS) -> Difference | None:
    """One warm-leg predicate, the first `warmup_legs` legs of each concurrency cold; both axes
    folded over exactly the warm legs; then every field of the bench's folds (summary and figures)
    against their recomputation from the leg records (gates/bench_fold.py)."""
    for leg in legs:
        if leg.warm != (leg.index >= warmup_legs):
            return Difference("warm-leg predicate", None, None, leg.concurrency, leg.index >= warmup_legs,
                              leg.warm)
    report = bench.report(legs, workload, {"spec": drafter})
    return same_legs_difference(report) or report_difference(report)


@functools.cache
def heldout_workload(corpus, temperature: float) -> bench.Workload:
    return bench.heldout_workload(corpus, num_prompts=4, max_tokens=24, temperature=temperature)


def traced_legs(make_llm, workload, legs: int = LEGS, warmup_legs: int = WARMUP_LEGS, host_row: int | None = None,
                **engine) -> tuple[list, dict, dict]:
    """Run the bench's legs (bench.run_bench, as `specgate bench` does, `legs` per concurrency,
    the first `warmup_legs` cold) on traced engines; per leg, the acceptance the trace implies.
    `host_row`: that request of each leg gets a logits processor that changes nothing (its sampling
    then needs the host: spec width 0); expected["_width0_beside_drafts"] says whether it decoded
    beside drafting requests."""
    runs = []  # (outputs, trace) of each generate call, in the order run_bench makes them

    def make(c):
        llm = make_llm(trace=True, max_num_seqs=c, **engine)
        generate = llm.generate

        def capture(prompts, params, **kwargs):
            start = len(llm.trace)
            if host_row is not None:
                params = [replace(p, logits_processors=[*p.logits_processors, HistoryRecorder()]) if i == host_row
                          else p for i, p in enumerate(params)]
            outputs = generate(prompts, params, **kwargs)
            runs.append((outputs, llm.trace[start:]))
            return outputs
        llm.generate = capture
        return llm

    reported = []  # what `specgate bench` prints a line for, leg by leg, off a terminal
    ran = bench.run_bench(make, workload, list(CONCURRENCIES), legs, warmup_legs, progress=False,
                          on_leg=reported.append)
    assert len(runs) == len(ran), f"{len(ran)} legs made {len(runs)} engine runs"
    assert reported == ran, "on_leg did not see every leg once, in order, as it finished"
    expected, traces = {}, {}
    for leg, (outputs, trace) in zip(ran, runs):
        traces[(leg.concurrency, leg.index)] = trace
        expected[(leg.concurrency, leg.index)] = expected_acceptance(outputs, trace) | {
            "_width0_beside_drafts": host_row is not None
            and width0_beside_drafts(outputs, trace, outputs[host_row].request_id)}
    return ran, expected, traces


@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])
@pytest.mark.parametrize("async_runner", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("drafter", ["ngram", "block"])
def test_bench_acceptance_equals_the_trace(make_llm, gate_record, corpus, drafter, async_runner, temperature):
    workload = heldout_workload(corpus, temperature)
    k = 4
    for setting in FOLD_SETTINGS[drafter, async_runner, temperature]:
        legs, expected, traces = traced_legs(make_llm, workload, setting.legs, setting.warmup_legs, HOST_ROW,
                                             spec=drafter, num_spec_tokens=k, async_runner=async_runner)
        for leg in legs:
            gate_record.case(drafter=drafter, async_runner=async_runner, temperature=temperature,
                             legs=setting.legs, warmup_legs=setting.warmup_legs, concurrency=leg.concurrency,
                             leg=leg.index, warm=leg.warm)
            gate_record.check(acceptance_difference(leg.index, leg.acceptance,
                                                    expected[(leg.concurrency, leg.index)]),
                              f"concurrency {leg.concurrency} leg {leg.index}")
            gate_record.occurred("num_reqs>1",
                                 max((s.num_reqs for s in traces[(leg.concurrency, leg.index)]), default=0) > 1)
            gate_record.occurred("tokens truncated at max_tokens",
                                 expected[(leg.concurrency, leg.index)]["_truncated"] > 0)
            gate_record.occurred("drafts accepted", leg.acceptance["num_accepted_tokens"] > 0)
            gate_record.occurred("a width-0 request beside drafting ones",
                                 expected[(leg.concurrency, leg.index)]["_width0_beside_drafts"])
        gate_record.case(drafter=drafter, async_runner=async_runner, temperature=temperature, legs=setting.legs,
                         warmup_legs=setting.warmup_legs, fold=True)
        gate_record.check(fold_difference(legs, workload, drafter, setting.warmup_legs),
                          f"fold of {setting.legs} legs, {setting.warmup_legs} of them warm-up")
        gate_record.occurred("warm and cold legs", {leg.warm for leg in legs} == {True, False})
        gate_record.occurred("warm-up 0: every leg warm", setting.warmup_legs == 0 and all(leg.warm for leg in legs))
        gate_record.occurred("warm-up 2", setting.warmup_legs == 2)
        gate_record.occurred("warm-up more than 2", setting.warmup_legs > 2)
        gate_record.occurred("several warm legs folded",
                             all(len(s["legs"]) > 1 for s in bench.fold(legs).values()))
    gate_record.occurred(drafter)
    gate_record.occurred("async runner" if async_runner else "sync runner")
    gate_record.occurred("k>1", k > 1)
    gate_record.occurred("sampled legs", temperature > 0)
