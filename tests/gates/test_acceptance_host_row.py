"""The acceptance gate's host row (gates/acceptance.py's traced_legs with host_row): that request
of each leg gets a logits processor, so it samples on the host at spec width 0, and each leg's
expected acceptance says whether it decoded beside a request verifying drafts, as the gate's
`a width-0 request beside drafting ones` occurrence reads it. On scripted engines, no model."""
import pytest

from engine.bench.workload import Workload
from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.trace import StepTrace
from gates.acceptance import traced_legs, width0_beside_drafts
from helpers.traces import record


class HostRowLLM:
    """What bench.run_leg reads of an LLM. Each generate call traces two steps: request 0 verifies
    a draft (accepted) while request 1 decodes without one (spec width 0); it keeps the logits
    processors each request was given."""

    def __init__(self, **kwargs):
        self.kwargs, self.trace, self.processors = kwargs, [], []
        self.runner = type("Runner", (), {"is_cuda": False})()
        self.config = type("Config", (), {"spec": kwargs.get("spec")})()

    def generate(self, prompts, params, arrival_steps=None) -> list[RequestOutput]:
        self.processors.append([len(p.logits_processors) for p in params])
        self.trace += [StepTrace(0, "sync/eager", requests=[record(0, 0, [7, 8, 9], sampled=[10], prefill=True),
                                                            record(1, 0, [5], sampled=[6], prefill=True)]),
                       StepTrace(1, "sync/eager", requests=[record(0, 3, [10, 11], [11], 1, [11, 12]),
                                                            record(1, 1, [6], sampled=[7])])]
        return [RequestOutput(0, None, [7, 8, 9], [10, 11, 12], "", "length", RequestStats(
                    num_drafts=1, num_draft_tokens=1, num_accepted_tokens=1, verify_steps=1, num_prefills=1,
                    accepted_per_position=[1])),
                RequestOutput(1, None, [5], [6, 7], "", "length", RequestStats(verify_steps=1, num_prefills=1))]


@pytest.mark.parametrize("host_row, beside_drafts", [(1, True), (0, False)])
def test_the_host_row_gets_a_logits_processor_and_each_leg_says_whether_it_decoded_beside_drafts(host_row,
                                                                                                 beside_drafts):
    engines = []

    def make_llm(**kwargs) -> HostRowLLM:
        engines.append(HostRowLLM(**kwargs))
        return engines[-1]
    _, expected, _ = traced_legs(make_llm, Workload(("a", "b"), (3, 2)), 2, 1, host_row, spec="ngram")
    assert [e.processors for e in engines] == [[[int(i == host_row) for i in range(2)]] * 2] * 2
    assert {leg: e["_width0_beside_drafts"] for leg, e in expected.items()} == {
        (c, i): beside_drafts for c in (1, 4) for i in range(2)}


def test_a_width0_step_counts_only_beside_a_request_verifying_drafts_in_that_same_step():
    """Request 0 (the host row) decodes at spec width 0 in step 1, beside request 1 decoding without
    a draft too, and has ended when request 1 verifies a draft, alone, in step 2: it never decoded
    beside drafts. Had request 1 verified its draft in step 1 instead, it would have."""
    prefills = [record(0, 0, [7, 8, 9], sampled=[10], prefill=True), record(1, 0, [5], sampled=[6], prefill=True)]
    host_row = record(0, 3, [10], sampled=[11])
    outputs = [RequestOutput(0, None, [7, 8, 9], [10, 11], "", "length", RequestStats(verify_steps=1, num_prefills=1)),
               RequestOutput(1, None, [5], [6, 7, 8], "", "length", RequestStats(
                   num_drafts=1, num_draft_tokens=1, verify_steps=2, num_prefills=1))]
    drafts_later = [StepTrace(0, "sync/eager", requests=prefills),
                    StepTrace(1, "sync/eager", requests=[host_row, record(1, 1, [6], sampled=[7])]),
                    StepTrace(2, "sync/eager", requests=[record(1, 2, [7, 4], [4], 0, [8])])]
    drafts_beside = [StepTrace(0, "sync/eager", requests=prefills),
                     StepTrace(1, "sync/eager", requests=[host_row, record(1, 1, [6, 4], [4], 0, [7])]),
                     StepTrace(2, "sync/eager", requests=[record(1, 2, [7], sampled=[8])])]
    assert not width0_beside_drafts(outputs, drafts_later, 0)
    assert width0_beside_drafts(outputs, drafts_beside, 0)
