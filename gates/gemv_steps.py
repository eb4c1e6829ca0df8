"""Which kernels a run's steps took, for lossless (gates/lossless.py): on CUDA's compiled forward a
one-token step runs engine/gemv.py's Triton kernels, a longer one cuBLAS.

Routing a step to the other path leaves every token right (both compute the same layers) and only
costs time, so token equality cannot see it. So lossless runs ROUTING_WORKLOAD, whose eager steps
hold every size from one token to eight and longer ones, plain and with verify steps of four
tokens a request, and counts the rows engine/gemv.py's attention_inputs (called once a layer of a
GEMV step) ran at, call by call: every step of up to GEMV_STEP_TOKENS tokens must have called it
once a layer at its own size, and no other step. The limit is the design's, written here rather
than read from the engine, so that a routing changed in the engine is red, not followed.
"""
from collections import Counter
from dataclasses import dataclass, replace

from engine.bench.workload import Workload
from gates.workloads import PROMPTS

# The design: a one-token step (a plain step at one request) runs on the GEMV, every longer one on
# cuBLAS. Kernels for up to eight rows lost to cuBLAS on an H100 at 2, 4 and 8 rows
# (docs/measurements.md, 2026-12-07, seventh session); raised only with a measurement, and then here.
GEMV_STEP_TOKENS = 1
_NUM_REQS = 8
# One request arriving every other step, each decoding 24 tokens past an EOS: the decode steps
# grow from one request to eight and shrink back to one, each size in both directions, and the
# prefills beside them are longer.
ROUTING_WORKLOAD = Workload(prompts=tuple(PROMPTS[i % len(PROMPTS)] for i in range(_NUM_REQS)),
                            max_tokens=(24,) * _NUM_REQS, arrival_steps=tuple(2 * i for i in range(_NUM_REQS)),
                            ignore_eos=(True,) * _NUM_REQS)


@dataclass(frozen=True)
class RoutingLeg:
    engine: dict              # LLM keyword arguments beside the gates' own
    sizes: frozenset[int]     # step sizes (tokens) the leg must hold, beside a longer one


# Both eager and on the sync runner: a graph replay calls no Python, so a graph step's calls would
# not be counted. Plain: steps of one token a request, 1 to 8 requests. ngram at k = 3: verify
# steps of four tokens a request (fewer when a budget cuts the drafts), at 1 and 2 requests.
ROUTING_LEGS = {
    "plain": RoutingLeg(dict(spec=None), frozenset(range(1, _NUM_REQS + 1))),
    "ngram-k3": RoutingLeg(dict(spec="ngram", num_spec_tokens=3), frozenset({4, 8})),
}


def step_tokens(step) -> int:
    """The tokens a traced step's forward ran: its requests' input ids and its padding rows' one each."""
    return sum(len(r.input_ids) for r in step.requests) + step.num_padding_rows


@dataclass(frozen=True)
class StepKernels:
    """A traced run's forward steps, and the rows of its GEMV calls."""
    step_sizes: tuple[int, ...]        # tokens each step ran
    gemv_rows: tuple[int, ...] | None  # rows of each call of attention_inputs; None: no GEMV path
    num_layers: int

    @classmethod
    def of(cls, trace: list, gemv_rows: list[int] | None, num_layers: int) -> "StepKernels":
        if any(not s.route.endswith("/eager") for s in trace):
            raise ValueError("StepKernels counts eager steps only: a graph replay calls no Python")
        return cls(tuple(step_tokens(s) for s in trace), None if gemv_rows is None else tuple(gemv_rows), num_layers)

    def routing_difference(self) -> dict[int, tuple[int, int]]:
        """{step size: (GEMV calls expected, calls made)} wherever they differ: every step of up to
        GEMV_STEP_TOKENS tokens calls the GEMV once a layer at its size, no other step calls it
        (empty without a GEMV path: nothing to route)."""
        if self.gemv_rows is None:
            return {}
        want = Counter({t: n * self.num_layers for t, n in Counter(self.step_sizes).items() if t <= GEMV_STEP_TOKENS})
        got = Counter(self.gemv_rows)
        return {t: (want[t], got[t]) for t in sorted(want | got) if want[t] != got[t]}

    def measures(self) -> dict:
        rows = self.gemv_rows
        return dict(step_sizes=dict(sorted(Counter(self.step_sizes).items())),
                    gemv_calls_by_rows=None if rows is None else dict(sorted(Counter(rows).items())))


def count_gemv_calls(llm) -> list[int] | None:
    """A list that grows at each later call of engine/gemv.py's attention_inputs in llm's forward
    (once a layer of a step routed to the GEMV) by the call's rows; None if the forward has no GEMV
    path."""
    forward = llm.runner.forward
    gemv = getattr(getattr(forward, "kernels", None), "gemv", None)
    if gemv is None:
        return None
    calls: list[int] = []

    def counted(x, *args, **kwargs):
        calls.append(x.shape[0])
        return gemv.attention_inputs(x, *args, **kwargs)
    forward.kernels = replace(forward.kernels, gemv=replace(gemv, attention_inputs=counted))
    return calls
