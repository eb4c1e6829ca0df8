"""Seeded sampled runs, for lossless: what a seeded request's tokens may not depend on.

A seeded request's random numbers are a hash of its key, the token position and the purpose
(engine/sampling.py), and a preempted request resumes by verifying the drafts it held when it
was preempted (engine/scheduler.py `resume_drafts`), so no step boundary moves: its tokens, and
its acceptance counters, are the same alone and batched, on either runner, in either arm, with
and without preemption. The reference is the same requests run one at a time (max_num_seqs=1:
every step holds one request) on the sync runner in the eager arm; every other arm is compared
with it exactly.
"""
import dataclasses

from gates.compare import Difference
from gates.workloads import PROMPTS, Workload

K = 3
# Mixed prompt lengths, budgets and arrivals; six requests this long overflow 18 KV blocks of 16.
WORKLOAD = Workload(prompts=tuple(PROMPTS[i] for i in (7, 6, 2, 3, 5, 1)), max_tokens=(32, 24, 32, 16, 28, 20),
                    arrival_steps=(0, 0, 1, 0, 2, 3), temperature=1.0, seeds=tuple(range(6)),
                    ignore_eos=(True,) * 6)
ALONE = "alone"
ARMS = {ALONE: dict(max_num_seqs=1, async_runner=False),
        "batched": dict(max_num_seqs=6, async_runner=True, graph=True),
        "preempted": dict(max_num_seqs=6, num_kv_blocks=18, async_runner=False),
        "preempted, graph arm": dict(max_num_seqs=6, num_kv_blocks=18, async_runner=True, graph=True)}


def engine_options(drafter: str) -> dict:
    """'plain', or a drafter of gates.workloads.DRAFTERS at k = K."""
    return {} if drafter == "plain" else dict(spec=drafter, num_spec_tokens=K)


def counters_difference(expected, actual) -> Difference | None:
    """Each request's acceptance counters (engine/request.py RequestStats) against the reference
    run's, apart from what preemption itself counts: its preemptions, and the prefills they cost,
    each a resume that verified the drafts the reference verified in a verify step."""
    want = {o.request_id: o.stats for o in expected.outputs}
    for out in sorted(actual.outputs, key=lambda o: o.request_id):
        resumes = sum(1 for s in actual.trace for r in s.requests
                      if r.request_id == out.request_id and r.is_prefill and r.draft_slots)
        a = dataclasses.replace(out.stats, num_preemptions=0, num_prefills=0,
                                verify_steps=out.stats.verify_steps + resumes)
        e = dataclasses.replace(want[out.request_id], num_preemptions=0, num_prefills=0)
        if a != e:
            return Difference("acceptance counters", None, out.request_id, None, e, a)
    return None


def resumes_with_drafts(run) -> int:
    """Resumed prefills that verified at least one draft they held."""
    return sum(1 for s in run.trace for r in s.requests if r.is_prefill and r.num_draft)
