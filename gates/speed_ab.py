"""Gate speed-ab (G3): TPOT and output throughput of the sync runner (VT_ASYNC_RUNNER=0) against
the async runner on the same build, in the eager and the graph arm, at concurrency 1 and 8,
runners interleaved (ABBA per leg), a warm-up leg then MEASURED_LEGS measured legs each (16 tokens
a request on the CPU, 128 on a GPU). The legs are paired (leg i of sync and of async ran back to
back) and the floor is the 95% percentile-bootstrap interval of the median per-leg relative
difference, async / sync - 1 (gates/measure.py, PairedMedianAB): it must clear SPEED_MIN_EFFECT
(2%) for async to count as ahead or behind; a difference under the floor is reported as such and
never as a ratio. The pairing replaced a range floor over 3 legs, under which one slow sync leg
hid an 8% gain (the H200, 2026-12-02).

On the CPU this is a smoke check of the procedure with a small workload: the figures go to the
JSON report and speed decides nothing (host and "device" share one thread, so the async runner
has nothing to overlap; the graph arm is the padded graph plan run eagerly). With --device cuda
the gate is red when, in the graph arm, async is behind sync beyond the floor on either metric,
at either concurrency, by any amount; the veto's verdict (gates/verdict.py) also wants it ahead
beyond the floor there. The graph arm is what the veto lifts (engine/veto.py) and CUDA's default:
a step is one graph replay, the only place the async runner can hide the host. The eager arm's
A/Bs are measured and reported, and decide nothing: that step is bound by the host launching
its kernels (13 to 21 ms a 1B step compiled), async never gained there on the H200 (under the
floor, or a few percent behind at c=1, with per-leg spreads up to 30%), so the veto keeps the
sync runner in the eager arm.
"""
import pytest

from engine import SamplingParams
from gates.measure import SPEED_MIN_EFFECT, UNDER_THE_FLOOR, PairedMedianAB, timed_leg
from gates.workloads import DRAFTERS, PROMPTS, observe_plans

CLAIMS = ("ngram", "block", "concurrency 1", "concurrency 8", "arms interleaved", "sync arm", "async arm",
          "eager arm", "graph arm")
CONCURRENCIES, MEASURED_LEGS, WARMUP_LEGS = (1, 8), 5, 1  # 5: the paired median's fewest (MIN_LEGS)
GRAPH_ARMS = ("eager", "graph")
MAX_TOKENS = {"cpu": 16, "cuda": 128}  # a smoke check on the CPU (5 paired legs of it); closer to steady state on a GPU
ARMS = {"sync": "0", "async": "1"}


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

    results, figures = [], []
    for c in CONCURRENCIES:
        # paired by leg index: leg i of each runner ran back to back
        warm = {arm: sorted((leg for leg in legs if leg.concurrency == c and leg.arm == arm and leg.warm),
                            key=lambda leg: leg.index) for arm in ARMS}
        assert all(len(v) == MEASURED_LEGS for v in warm.values()), "an arm is missing measured legs"
        for metric, higher_is_better, value in (("tpot_ms", False, lambda leg: leg.tpot_ms),
                                                ("output_tokens_per_s", True, lambda leg: leg.throughput)):
            result = PairedMedianAB(metric, [value(leg) for leg in warm["sync"]], [value(leg) for leg in warm["async"]],
                                    higher_is_better=higher_is_better, min_effect=SPEED_MIN_EFFECT, relative=True)
            results.append(result)
            figures.append({"concurrency": c, **result.as_dict()})
    gate_record.measure(drafter=drafter, device=gate_device, forward=forward, graph_arm=graph_arm,
                        max_tokens=max_tokens, ab=figures,
                        legs=[dict(arm=leg.arm, concurrency=leg.concurrency, index=leg.index, warm=leg.warm,
                                   order=leg.order, seconds=round(leg.seconds, 4), tokens=leg.output_tokens,
                                   tpot_ms=round(leg.tpot_ms, 4), host_ms_per_step=leg.host_ms_per_step)
                              for leg in legs])
    for f in figures:
        assert (f["result"] == UNDER_THE_FLOOR) == ("ratio" not in f), f"a ratio was reported under the floor: {f}"
    if gate_device.startswith("cuda") and graph:
        worse = [f for r, f in zip(results, figures) if r.b_is_worse]
        gate_record.evidence(slower=worse)
        assert not worse, (f"graph arm, {forward} forward, {drafter} drafter: async is behind sync beyond the floor: "
                           + "; ".join(behind_line(f) for f in worse))


def behind_line(figure: dict) -> str:
    """One A/B where async is behind, as a reviewer reads it."""
    low, high = figure["interval"]
    return (f"c={figure['concurrency']} {figure['metric']} async/sync {figure['ratio']:.3f} (median per-leg "
            f"change {low:+.1%} to {high:+.1%})")


def interleaved(legs) -> bool:
    """Every leg index ran both arms before either arm ran the next index."""
    for c in CONCURRENCIES:
        mine = sorted((leg for leg in legs if leg.concurrency == c), key=lambda leg: leg.order)
        indices = [leg.index for leg in mine]
        if indices != sorted(indices) or any({leg.arm for leg in mine if leg.index == i} != set(ARMS)
                                             for i in set(indices)):
            return False
    return True
