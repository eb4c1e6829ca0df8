"""Gate busy (G4): the fraction of decode wall time the GPU is busy, in the eager and the graph
arm, on the async and the sync runner (CUDA only).

The decode window is a torch.profiler range around the steps after every request's prefill;
busy time is the union of the device's kernel, copy and set intervals inside it (profiler
clock, so host and device times are comparable; the range's own GPU-side annotation, which
spans the whole window, is not activity). Runners are interleaved over several legs, and the
noise floor is the larger spread of the two (gates/measure.py).

The async runner exists to keep the device fed while the host plans the next step. In the
graph arm a step is one replay, so the sync runner leaves the device idle while it plans: there
the async runner must be busier by more than the floor (a host that still blocks on each step's
results, e.g. a blocking result download, shows no gain and is red). In the eager arm the
fixture model is launch-bound, both runners keep the device equally (un)busy, and the async
runner must only not be less busy beyond the floor.
"""
import pytest
import torch

from engine import SamplingParams
from gates.measure import ABResult, busy_fraction
from gates.workloads import PROMPTS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA: torch.cuda.is_available() is False on this machine")

CLAIMS = ("eager arm", "graph arm", "sync runner", "async runner", "device activity measured")
LEGS, NUM_REQS, MAX_TOKENS = 5, 8, 32
DECODE_RANGE = "specgate.decode"


def measure_decode(llm, params) -> float:
    """Prefill every request, then profile the decode steps; the busy fraction of that window."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function
    reqs = [llm.add_request(PROMPTS[i % len(PROMPTS)], params) for i in range(NUM_REQS)]
    while not all(r.output_token_ids for r in reqs):
        llm.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function(DECODE_RANGE):
            while llm.has_unfinished():
                llm.step()
            torch.cuda.synchronize()
    events = prof.profiler.kineto_results.events()  # raw events: no tree to build
    window = next(e for e in events if e.name() == DECODE_RANGE and e.device_type() == DeviceType.CPU)
    # Kernels, copies and sets; not the range's own GPU-side annotation, which spans the window.
    device = [(e.start_ns(), e.end_ns()) for e in events
              if e.device_type() == DeviceType.CUDA and not e.is_user_annotation() and e.name() != DECODE_RANGE]
    assert device, "the profiler saw no device activity during decode"
    return busy_fraction(device, (window.start_ns(), window.end_ns()))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_gpu_busy_during_decode(make_llm, gate_record, graph):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    engines = {runner: make_llm(device="cuda", spec="ngram", num_spec_tokens=4, graph=graph,
                                max_num_seqs=NUM_REQS, async_runner=runner == "async")
               for runner in ("sync", "async")}
    for llm in engines.values():  # warm-up: allocations, kernels, graph capture
        llm.generate([PROMPTS[i % len(PROMPTS)] for i in range(NUM_REQS)], params)
    busy = {"sync": [], "async": []}
    for i in range(LEGS):
        for runner in (("sync", "async") if i % 2 == 0 else ("async", "sync")):
            busy[runner].append(measure_decode(engines[runner], params))
            gate_record.case(arm="graph" if graph else "eager", runner=runner, leg=i, busy=busy[runner][-1])
            gate_record.occurred(f"{runner} runner")
    gate_record.occurred("graph arm" if graph else "eager arm", not graph or bool(engines["async"].runner.graphs))
    gate_record.occurred("device activity measured", all(v > 0 for vs in busy.values() for v in vs))
    result = ABResult("gpu_busy_fraction", NUM_REQS, True, busy["sync"], busy["async"])
    gate_record.measure(arm="graph" if graph else "eager", **result.as_dict())
    if graph:
        assert engines["async"].runner.graphs, "graph=True never replayed a CUDA graph"
    gate_record.evidence(**result.as_dict())
    assert not result.b_is_worse, f"the async runner keeps the GPU less busy than the sync runner: {result.as_dict()}"
    if graph:
        assert not result.under_floor, (f"graph arm: the async runner shows no busy-time gain over the sync "
                                        f"runner beyond the noise floor: {result.as_dict()}")
