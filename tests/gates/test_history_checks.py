"""The logits processor history check (gates/invariants.py history_difference) on hand-written
histories, each kind of wrong history named with its step, request, position and both values; the
processors the gates run (gates/processors.py) on rows small enough to read; and the plumbing that
gives every processor request of a gate run its own recorder (gates/workloads.py run) and hands the
reference decoder the same processors (gates/reference.py), without the recorders."""
import math

import pytest
import torch

from engine import SamplingParams
from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.trace import StepTrace
from gates.compare import Difference
from gates.invariants import history_difference
from gates.processors import (
    WHOLE_HISTORY,
    HistoryRecorder,
    LengthBias,
    NoRepeatNgram,
    RepetitionPenalty,
    ngram_completions,
)
from gates.reference import ReferenceDecoder
from gates.workloads import PROMPTS, WHOLE_HISTORY_WORKLOAD, Workload, no_immediate_repeat, run, whole_history_params
from helpers.traces import record

PROMPT, TOKENS = [7, 8, 9], [10, 11, 12, 13]   # positions 0-2, outputs at 3-6
HISTORY = "output history a logits processor received"


def processed_run() -> tuple[list[RequestOutput], list[StepTrace]]:
    """Request 0 with a logits processor (no draft slots): a prefill emits 10, then one token a step;
    request 1, drafting beside it, finishes at step 1."""
    trace = [StepTrace(0, "sync/eager", requests=[record(0, prefill=True, ids=PROMPT, sampled=[10]),
                                                  record(1, prefill=True, ids=[5, 6], sampled=[20])]),
             StepTrace(1, "sync/eager", requests=[record(0, 3, [10], sampled=[11]),
                                                  record(1, 2, [20, 21], [21], 1, [21, 22])]),
             StepTrace(2, "sync/eager", requests=[record(0, 4, [11], sampled=[12])]),
             StepTrace(3, "sync/eager", requests=[record(0, 5, [12], sampled=[13])])]
    outputs = [RequestOutput(0, None, PROMPT, TOKENS, "", "length", RequestStats(verify_steps=3, num_prefills=1)),
               RequestOutput(1, None, [5, 6], [20, 21, 22], "", "length", RequestStats(
                   num_drafts=1, num_draft_tokens=1, num_accepted_tokens=1, verify_steps=1, num_prefills=1,
                   accepted_per_position=[1]))]
    return outputs, trace


GOOD = [[], [10], [10, 11], [10, 11, 12]]


def test_the_output_so_far_at_every_call_passes_and_requests_without_a_recorder_are_not_judged():
    outputs, trace = processed_run()
    assert history_difference(outputs, {0: GOOD}, trace) is None
    assert history_difference(outputs, {}, trace) is None


@pytest.mark.parametrize("calls, position, step, expected, actual", [
    # the prompt handed over with the output
    ([PROMPT + h for h in GOOD], 3, 0, [], PROMPT),
    # stale by one step from the third call on
    ([[], [10], [10], [10, 11]], 5, 2, [10, 11], [10]),
    # a token of a later step (one too many)
    ([[], [10, 11], [10, 11, 12], [10, 11, 12, 13]], 4, 1, [10], [10, 11]),
    # the call of the prefill's row skipped: every later call is one token ahead of its position
    ([[10], [10, 11], [10, 11, 12]], 3, 0, [], [10]),
    # the last token's call missing
    (GOOD[:3], 6, 3, [10, 11, 12], "no call"),
    # a call past the request's end
    (GOOD + [TOKENS], 7, None, "no call past the request's end", TOKENS),
])
def test_each_wrong_history_is_named_at_the_first_call_that_differs(calls, position, step, expected, actual):
    outputs, trace = processed_run()
    assert history_difference(outputs, {0: calls}, trace) == Difference(HISTORY, step, 0, position, expected,
                                                                        actual)


def test_a_request_with_processors_given_draft_slots_is_a_difference():
    outputs, trace = processed_run()
    assert history_difference(outputs, {1: [[], [20]]}, trace) == Difference(
        "draft slots of a request with logits processors", 1, 1, 2, 0, 1)


def test_a_later_request_is_judged_after_an_earlier_one_passes():
    outputs, trace = processed_run()
    outputs[1] = RequestOutput(1, None, [5, 6], [20, 21, 22], "", "length", RequestStats())
    outputs.append(RequestOutput(2, None, [4], [30, 31], "", "length", RequestStats()))
    trace = trace + [StepTrace(4, "sync/eager", requests=[record(2, prefill=True, ids=[4], sampled=[30])]),
                     StepTrace(5, "sync/eager", requests=[record(2, 1, [30], sampled=[31])])]
    assert history_difference(outputs, {0: GOOD, 2: [[], [30]]}, trace) is None
    assert history_difference(outputs, {0: GOOD, 2: [[], [31]]}, trace) == Difference(HISTORY, 5, 2, 2, [30], [31])


def test_the_recorder_keeps_a_copy_of_each_history_and_changes_nothing():
    recorder, row, history = HistoryRecorder(), torch.arange(4.0), [1, 2]
    assert recorder(history, row) is row and torch.equal(row, torch.arange(4.0))
    history.append(3)
    recorder(history, row)
    assert recorder.calls == [[1, 2], [1, 2, 3]]
    assert HistoryRecorder() != HistoryRecorder(), "each request's recorder is its own"


def test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_every_token_seen():
    row = torch.tensor([3.0, -2.0, 1.0, -1.0, 6.0])
    assert torch.equal(RepetitionPenalty(2.0)([0, 1, 0], row.clone()), torch.tensor([1.5, -4.0, 1.0, -1.0, 6.0]))
    assert torch.equal(RepetitionPenalty(2.0)([], row.clone()), row)
    assert RepetitionPenalty() == RepetitionPenalty(1.5) and hash(RepetitionPenalty()) == hash(RepetitionPenalty(1.5))


@pytest.mark.parametrize("history, n, banned", [
    ([1, 2, 3, 1, 2], 3, {3}),            # 1 2 -> 3 seen: 3 would repeat it
    ([1, 2, 3, 1, 2, 4, 1, 2], 3, {3, 4}),
    ([1, 2, 1, 2], 3, {1}),               # the suffix 1 2 was followed by 1
    ([5, 5, 5], 2, {5}),
    ([1, 2, 3], 3, set()),                # the suffix 2 3 occurs only at the end
    ([1, 2], 3, set()),                   # shorter than an n-gram
    ([], 3, set()),
    ([4, 7, 4], 1, {4, 7}),               # n = 1: every token seen
])
def test_no_repeat_ngram_bans_what_would_complete_an_ngram_the_history_holds(history, n, banned):
    assert ngram_completions(history, n) == banned
    row = NoRepeatNgram(n)(history, torch.zeros(8))
    assert {i for i in range(8) if row[i] == -math.inf} == banned


def test_the_length_bias_moves_with_the_exact_length():
    row = torch.zeros(10)
    assert LengthBias(2.5, 3)([9, 9], row.clone()).tolist() == [0.0] * 6 + [2.5] + [0.0] * 3
    assert LengthBias(2.5, 3)([9, 9, 9, 9], row.clone())[2] == 2.5    # 4 * 3 mod 10
    assert LengthBias(2.5, 3)([], row.clone())[0] == 2.5


def test_whole_history_params_give_the_processor_requests_the_chains_in_turn():
    sampling = whole_history_params(WHOLE_HISTORY_WORKLOAD)
    chains = [tuple(p.logits_processors) for p in sampling]
    assert chains == [(), WHOLE_HISTORY[0], WHOLE_HISTORY[1], (), WHOLE_HISTORY[2]]
    assert [p.stop_token_ids for p in sampling] == [[101, 40], [], [], [101, 58], []]
    assert whole_history_params(WHOLE_HISTORY_WORKLOAD) == sampling, "equal processors: the reference shares streams"


class RecordingLLM:
    """What gates.workloads.run reads of an LLM: generate calls each request's processors on a
    made-up row for each of its tokens, so the recorders see the histories a real engine gives."""
    is_async, trace = False, []

    def __init__(self, **engine):
        self.config = type("Config", (), {"max_model_len": 64})()

    def generate(self, prompts, params, arrival_steps=None):
        outputs = []
        for i, p in enumerate(params):
            tokens = []
            for _ in range(p.max_tokens):
                row = torch.zeros(16)
                for proc in p.logits_processors:
                    row = proc(list(tokens), row)
                tokens.append(int(row.argmax()))
            outputs.append(RequestOutput(i, None, [1], tokens, "", "length", RequestStats()))
        return outputs


def test_a_gate_run_records_each_processor_request_and_keeps_its_sampling_without_the_recorder():
    workload = Workload(("a", "b", "c"), (3, 2, 2), host_history=(True, False, True))
    r = run(lambda **engine: RecordingLLM(**engine), workload)
    assert [p.logits_processors for p in r.sampling_params] == [[no_immediate_repeat], [], [no_immediate_repeat]]
    assert r.histories == {0: [[], [0], [0, 1]], 2: [[], [0]]}
    assert history_difference(r.outputs, r.histories, r.trace) is None
    chains = whole_history_params(WHOLE_HISTORY_WORKLOAD)
    given = run(lambda **engine: RecordingLLM(**engine), WHOLE_HISTORY_WORKLOAD, chains)
    assert given.sampling_params == chains and sorted(given.histories) == [1, 2, 4]


def test_the_reference_applies_a_request_s_processors_to_its_own_output(make_llm):
    llm = make_llm()
    ref = ReferenceDecoder(llm.model, llm.eos_token_ids)
    prompt = llm.tokenizer.encode(PROMPTS[2])
    unprocessed = ref.stream(prompt, (), 16)
    for chain in WHOLE_HISTORY:
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logits_processors=list(chain))
        engine = llm.generate([prompt], params)[0].token_ids
        assert ref.stream(prompt, chain, 16) == engine != unprocessed, f"{chain} changes no token"
        assert ref.expected(prompt, params, 256).token_ids == engine
