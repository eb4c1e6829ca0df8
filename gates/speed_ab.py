"""Gate speed-ab (G3): TPOT and output throughput of the sync runner (VT_ASYNC_RUNNER=0) against
the async runner on the same build, in the eager and the graph arm, at concurrency 1 and 8,
runners interleaved (ABBA per leg), a warm-up leg then several measured legs each (32 tokens a
request on the CPU, 128 on a GPU). Each runner's spread sets a noise floor; a delta under it is
reported as under the floor and never as a ratio.

On the CPU this is a smoke check of the procedure with a small workload: the figures go to the
JSON report and speed decides nothing (host and "device" share one thread, so the async runner
has nothing to overlap; the graph arm is the padded graph plan run eagerly). With --device cuda
the gate is red when async is slower than sync by more than the floor on either metric, at
either concurrency: in the graph arm by any amount beyond the floor, in the eager arm by more
than EAGER_ARM_ALLOWANCE as well. The veto's verdict (gates/verdict.py) reads the graph arm on
CUDA: there a step is one graph replay, the only place the async runner can hide the host (the
eager step is host-bound, about 1,300 launches a step, and its deltas sit under the floor).
"""
import pytest

from engine import SamplingParams
from gates.measure import UNDER_THE_FLOOR, ABResult, timed_leg
from gates.workloads import DRAFTERS, PROMPTS, observe_plans

CLAIMS = ("ngram", "block", "concurrency 1", "concurrency 8", "arms interleaved", "sync arm", "async arm",
          "eager arm", "graph arm")
CONCURRENCIES, MEASURED_LEGS, WARMUP_LEGS = (1, 8), 3, 1
GRAPH_ARMS = ("eager", "graph")
MAX_TOKENS = {"cpu": 32, "cuda": 128}  # a smoke check on the CPU; closer to steady state on a GPU
ARMS = {"sync": "0", "async": "1"}
# The eager arm is host-bound: the async runner has no device time to hide its per-step
# bookkeeping (the results' copy into the pinned ring, an event) behind, so there it may cost up to
# this fraction of sync's speed before the gate calls it a regression. On the H200 (fixtures,
# 06d5d2c) async ran 0 to 9% behind sync in the eager arm, once beyond a tight 3-leg floor (2.2%
# at c=1), while it ran 10 to 42% ahead in the graph arm. The graph arm, which decides the veto,
# gets no allowance.
EAGER_ARM_ALLOWANCE = 0.10


def workload(concurrency: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] for i in range(2 if concurrency == 1 else 8)]


@pytest.mark.parametrize("graph_arm", GRAPH_ARMS)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_sync_against_async(make_llm, gate_record, gate_device, monkeypatch, forward, drafter, graph_arm):
    graph = graph_arm == "graph"
    max_tokens = MAX_TOKENS["cuda" if gate_device.startswith("cuda") else "cpu"]
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    legs, order, plans = [], 0, []
    for c in CONCURRENCIES:
        engines = {}
        for arm, env in ARMS.items():  # the veto's own switch, as an operator would set it
            monkeypatch.setenv("VT_ASYNC_RUNNER", env)
            engines[arm] = make_llm(spec=drafter, num_spec_tokens=4, max_num_seqs=c, graph=graph)
            assert engines[arm].is_async == (arm == "async"), f"VT_ASYNC_RUNNER={env} did not pick the {arm} runner"
            observe_plans(engines[arm], plans)
        for i in range(WARMUP_LEGS + MEASURED_LEGS):
            for arm in (("sync", "async") if i % 2 == 0 else ("async", "sync")):
                leg = timed_leg(engines[arm], workload(c), params, arm, c, i, warm=i >= WARMUP_LEGS)
                leg.order, order = order, order + 1
                legs.append(leg)
                gate_record.case(drafter=drafter, graph_arm=graph_arm, arm=arm, concurrency=c, leg=i, warm=leg.warm)
                gate_record.occurred(f"{arm} arm")
        gate_record.occurred(f"concurrency {c}")
    gate_record.occurred(drafter)
    gate_record.occurred("arms interleaved", interleaved(legs))
    on_cuda = gate_device.startswith("cuda")
    replayed = all(e.runner.num_graph_replays > 0 for e in engines.values()) if on_cuda else True
    ran_graph_plans = any(a == "graph" for _, a, _, _ in plans)
    gate_record.occurred(f"{graph_arm} arm", ran_graph_plans and replayed if graph else not ran_graph_plans)
    if graph and on_cuda:
        assert replayed, "graph arm: no CUDA graph was replayed"

    results = []
    for c in CONCURRENCIES:
        warm = {arm: [leg for leg in legs if leg.concurrency == c and leg.arm == arm and leg.warm] for arm in ARMS}
        assert all(len(v) == MEASURED_LEGS for v in warm.values()), "an arm is missing measured legs"
        results.append(ABResult("tpot_ms", c, False, [leg.tpot_ms for leg in warm["sync"]],
                                [leg.tpot_ms for leg in warm["async"]]))
        results.append(ABResult("output_tokens_per_s", c, True, [leg.throughput for leg in warm["sync"]],
                                [leg.throughput for leg in warm["async"]]))
    figures = [r.as_dict() for r in results]
    gate_record.measure(drafter=drafter, device=gate_device, forward=forward, graph_arm=graph_arm,
                        max_tokens=max_tokens, ab=figures,
                        legs=[dict(arm=leg.arm, concurrency=leg.concurrency, index=leg.index, warm=leg.warm,
                                   order=leg.order, seconds=round(leg.seconds, 4), tokens=leg.output_tokens,
                                   tpot_ms=round(leg.tpot_ms, 4)) for leg in legs])
    for f in figures:
        assert (f["result"] == UNDER_THE_FLOOR) == ("ratio" not in f), f"a ratio was reported under the floor: {f}"
    if gate_device.startswith("cuda"):
        worse = [f for r, f in zip(results, figures) if is_regression(r, graph)]
        gate_record.evidence(slower=worse)
        assert not worse, (f"{graph_arm} arm, {forward} forward: async is slower than sync beyond the noise "
                           f"floor: {worse}")


def is_regression(result: ABResult, graph: bool) -> bool:
    """Async slower than sync beyond the floor (and, in the eager arm, beyond its allowance)."""
    loss = -result.delta if result.higher_is_better else result.delta
    return result.b_is_worse and (graph or loss > EAGER_ARM_ALLOWANCE)


def interleaved(legs) -> bool:
    """Every leg index ran both arms before either arm ran the next index."""
    for c in CONCURRENCIES:
        mine = sorted((leg for leg in legs if leg.concurrency == c), key=lambda leg: leg.order)
        indices = [leg.index for leg in mine]
        if indices != sorted(indices) or any({leg.arm for leg in mine if leg.index == i} != set(ARMS)
                                             for i in set(indices)):
            return False
    return True
