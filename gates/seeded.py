"""Seeded sampled runs, for lossless: what a seeded request's tokens may not depend on.

A seeded request's random numbers are a hash of its key, the token position and the purpose
(engine/sampling.py), and a preempted request resumes by verifying the drafts it held when it
was preempted (engine/scheduler.py `resume_drafts`), so no step boundary moves: its tokens are
the same alone and batched, on either runner, in either arm, with and without preemption. The
reference is the same requests run one at a time (max_num_seqs=1: every step holds one request)
on the sync runner in the eager arm; every other arm is compared with it token for token. Only
tokens: lossless judges what a request emits, and a defect that leaves every token right must
leave it green (its acceptance counters are equal too: tests/engine/test_resume_drafts.py).
"""
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


def resumes_with_drafts(run) -> int:
    """Resumed prefills that verified at least one draft they held."""
    return sum(1 for s in run.trace for r in s.requests if r.is_prefill and r.num_draft)
