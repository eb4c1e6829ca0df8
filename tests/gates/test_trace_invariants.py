"""The single-run checks (gates/invariants.py) on a trace written by hand, small enough to read:
each check passes the consistent run and, for each kind of defect, goes red naming the check,
step, request, position and both values. A hand trace reaches the corners a real run seldom
shows: drafts that run past the request's end, a step of one draft, an n-gram table lookup."""
import pytest

from engine.outputs import RequestOutput
from engine.request import RequestStats
from engine.trace import StepTrace
from gates.compare import Difference
from gates.invariants import (
    acceptance_difference,
    logits_window_difference,
    mixed_refusals,
    ngram_draft_difference,
    ngram_drafts,
    trace_consistency,
)
from helpers.traces import record

PROMPT, TOKENS = [7, 8, 9], [10, 11, 12, 13, 14]   # positions 0-2 and 3-7
GREEDY = "num_accepted (greedy: matching draft prefix)"


def run() -> tuple[list[RequestOutput], list[StepTrace]]:
    """Request 0, greedy, k=2, max_tokens 5: a prefill; drafts [11, 20], one accepted as the final
    tokens say; a step without drafts; drafts [14, 15] from position 6, where only 14 is known, one
    accepted and the correction 16 truncated; and the step the async runner launched past the
    end, which emits nothing."""
    trace = [StepTrace(0, "async/eager", requests=[record(prefill=True, ids=PROMPT, sampled=[10])]),
             StepTrace(1, "async/eager", requests=[record(ids=[10, 11, 20], start=3, drafts=[11, 20], accepted=1,
                                                          sampled=[11, 12])]),
             StepTrace(2, "async/eager", requests=[record(ids=[12, 0, 0], start=5, sampled=[13])]),
             StepTrace(3, "async/eager", requests=[record(ids=[13, 14, 15], start=6, drafts=[14, 15], accepted=1,
                                                          sampled=[14, 16])]),
             StepTrace(4, "async/eager", requests=[record(ids=[16, 1, 2], start=8, drafts=[1, 2], sampled=[1])])]
    stats = RequestStats(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=2, verify_steps=3, num_prefills=1,
                         num_truncated=1, accepted_per_position=[2, 0])
    return [RequestOutput(0, None, PROMPT, TOKENS, "", "length", stats)], trace


def test_the_hand_written_run_passes_every_check():
    outputs, trace = run()
    assert trace_consistency(outputs, trace) is None  # accepted_per_position's trailing 0 is trimmed
    assert acceptance_difference(outputs, trace, {0}) is None
    assert logits_window_difference(trace) is None


@pytest.mark.parametrize("field, value, expected", [
    ("num_prefills", 2, 1), ("verify_steps", 4, 3), ("num_drafts", 3, 2), ("num_draft_tokens", 5, 4),
    ("num_accepted_tokens", 1, 2), ("accepted_per_position", [2, 1], [2]),
])
def test_each_counter_that_disagrees_with_the_trace_is_named_at_the_request_s_last_real_step(field, value, expected):
    outputs, trace = run()
    setattr(outputs[0].stats, field, value)
    assert trace_consistency(outputs, trace) == Difference(field, 3, 0, None, expected, value)


def test_a_traced_token_that_differs_from_the_output_is_named_with_both_sequences():
    outputs, trace = run()
    trace[1].requests[0].sampled[0] = 99
    assert trace_consistency(outputs, trace) == Difference("emitted tokens", 3, 0, None, [10, 99, 12, 13, 14], TOKENS)


def test_a_step_that_starts_one_position_late_is_named_at_its_start():
    outputs, trace = run()
    late = trace[1].requests[0]
    late.positions = [p + 1 for p in late.positions]
    assert trace_consistency(outputs, trace) == Difference("verify start position", 1, 0, 4, 3, 4)


def greedy_run(start: int, drafts: list[int], accepted: int, rid: int = 0):
    """The request's final sequence and one verify step from `start` with `drafts`."""
    out = RequestOutput(rid, None, PROMPT, TOKENS, "", "length", RequestStats())
    step = StepTrace(1, "sync/eager", requests=[record(rid, ids=[0, *drafts], start=start, drafts=drafts,
                                                       accepted=accepted, sampled=[0] * (accepted + 1))])
    return [out], [step]


@pytest.mark.parametrize("start, drafts, accepted, expected", [
    (3, [11], 0, 1),                 # one draft, matching: accepted
    (3, [11, 20], 2, 1),             # the second draft differs from the output
    (5, [13, 99, 98], 2, 1),         # past the end too, but the mismatch is inside the known part
    (5, [13, 14, 99], 1, ">= 2"),    # every known draft matches; beyond the end is unknown
])
def test_greedy_acceptance_must_be_the_matching_prefix_as_far_as_the_output_knows(start, drafts, accepted, expected):
    outputs, trace = greedy_run(start, drafts, accepted)
    assert acceptance_difference(outputs, trace, {0}) == Difference(GREEDY, 1, 0, start, expected, accepted)


def test_greedy_acceptance_reads_every_verify_step_after_the_prefill():
    outputs, trace = run()
    trace[1].requests[0].num_accepted = 2
    assert acceptance_difference(outputs, trace, {0}) == Difference(GREEDY, 1, 0, 3, 1, 2)
    outputs, trace = run()
    trace[2].requests[0].num_accepted = 1     # a step without drafts accepts none
    assert acceptance_difference(outputs, trace, {0}) == Difference(GREEDY, 2, 0, 5, 0, 1)


def test_past_the_end_a_greedy_step_may_accept_every_draft_the_output_confirms_or_more():
    for accepted in (2, 3):
        assert acceptance_difference(*greedy_run(5, [13, 14, 99], accepted), {0}) is None


def test_greedy_acceptance_judges_only_the_greedy_requests_and_skips_those_without_records():
    sampled, trace = greedy_run(3, [11, 20], 2, rid=0)       # would be red, but request 0 is sampled
    greedy, greedy_trace = greedy_run(3, [11, 20], 2, rid=1)
    silent = RequestOutput(2, None, PROMPT, TOKENS, "", "length", RequestStats())  # no trace records
    outputs, trace = [*sampled, *greedy, silent], [*trace, *greedy_trace]
    assert acceptance_difference(outputs, trace, {1, 2}) == Difference(GREEDY, 1, 1, 3, 1, 2)
    assert acceptance_difference(outputs, trace, {2}) is None


def resumed_run() -> tuple[list[RequestOutput], list[StepTrace]]:
    """run()'s first two steps, then a preemption: the resume recomputes positions 0-5 and
    verifies the two drafts the request held, [13, 15] from position 5; 13 is accepted and the
    correction 14 ends it. One prefill more, one verify step fewer than without the preemption."""
    outputs, trace = run()
    resume = record(prefill=True, ids=[*PROMPT, 10, 11, 12, 13, 15], drafts=[13, 15], accepted=1, sampled=[13, 14],
                    draft_slots=2)
    trace = trace[:2] + [StepTrace(2, "sync/eager", requests=[resume])]
    outputs[0].stats = RequestStats(num_drafts=2, num_draft_tokens=4, num_accepted_tokens=2, verify_steps=1,
                                    num_prefills=2, num_preemptions=1, accepted_per_position=[2])
    return outputs, trace


def test_a_resume_that_verifies_the_drafts_it_held_passes_every_check_at_its_window():
    outputs, trace = resumed_run()
    resume = trace[2].requests[0]
    assert resume.window_position == 5 and resume.logits_indices == [5, 6, 7]
    assert trace_consistency(outputs, trace) is None
    assert acceptance_difference(outputs, trace, {0}) is None
    assert logits_window_difference(trace) is None
    resume.num_accepted = 2   # greedy: 15 is not the output's token at position 7
    assert acceptance_difference(outputs, trace, {0}) == Difference(GREEDY, 2, 0, 5, 1, 2)
    # prompt lookup from position 5 finds no earlier 12: a resume's drafts are judged at its window
    assert ngram_draft_difference(outputs, [trace[0], trace[2]]) == Difference("ngram drafts", 2, 0, 5, [], [13, 15])


def test_a_resume_that_held_one_draft_is_judged_too():
    """Only a prefill without drafts (width 0) is skipped: a resume of width 1 verifying [13] from
    position 5, which the output confirms, must accept it."""
    outputs, trace = run()
    resume = record(prefill=True, ids=[*PROMPT, 10, 11, 12, 13], drafts=[13], accepted=1, sampled=[13, 14],
                    draft_slots=1)
    trace = trace[:2] + [StepTrace(2, "sync/eager", requests=[resume])]
    assert acceptance_difference(outputs, trace, {0}) is None
    resume.num_accepted = 0
    assert acceptance_difference(outputs, trace, {0}) == Difference(GREEDY, 2, 0, 5, 1, 0)


def test_a_resume_counted_a_verify_step_or_cut_short_or_gathered_at_its_end_is_red():
    outputs, trace = resumed_run()
    outputs[0].stats.verify_steps = 2
    assert trace_consistency(outputs, trace) == Difference("verify_steps", 2, 0, None, 1, 2)
    outputs, trace = resumed_run()
    resume = trace[2].requests[0]
    resume.input_ids, resume.positions = resume.input_ids[1:], resume.positions[1:]  # one history token short
    assert trace_consistency(outputs, trace) == Difference("resumed prefill length", 2, 0, 0, 6, 5)
    outputs, trace = resumed_run()
    trace[2].requests[0].logits_indices = [7]  # the window of a prefill that carried no drafts
    assert logits_window_difference(trace) == Difference("logits window", 2, 0, 5, [5, 6, 7], [7])


def test_a_window_that_covers_the_row_but_not_its_drafts_is_red():
    """num_draft + 1 rows at least: a row that claims more drafts than its query fed."""
    outputs, trace = run()
    rec = trace[1].requests[0]
    rec.num_draft = 3
    assert logits_window_difference(trace) == Difference("logits window", 1, 0, 3, [0, 1, 2], [0, 1, 2])


@pytest.mark.parametrize("history, k, drafts", [
    ([5], 3, []),                                  # nothing before the last token
    ([4, 4], 3, [4]),                              # a 1-gram one token long: the shortest history that matches
    ([1, 1, 1, 1], 3, [1]),                        # a 3-gram at the first position
    ([1, 2, 3, 1], 3, [2, 3, 1]),                  # only a 1-gram matches (min_n = 1)
    ([1, 2, 1], 5, [2, 1]),                        # never past the history
    ([9, 1, 2, 3, 7, 5, 1, 2, 3, 8, 5, 1, 2, 3], 3, [7, 5, 1]),  # the 3-gram's earliest match, not the 4-gram's
    ([2, 3, 6, 1, 2, 3, 7, 1, 2, 3], 3, [7, 1, 2]),  # the longest n first: the 3-gram, not the earlier 2-gram
])
def test_prompt_lookup_drafts(history, k, drafts):
    assert ngram_drafts(history, k) == drafts


def ngram_run(drafts: list[int]):
    """A request whose history through position 9 is [2, 3, 6, 1, 2, 3, 7, 1, 2, 3], one verify step
    from there with `drafts`; and a request without records."""
    out = RequestOutput(0, None, [2, 3, 6, 1, 2, 3, 7, 1, 2], [3, 7, 1, 2], "", "length", RequestStats())
    silent = RequestOutput(1, None, [5, 5], [5], "", "length", RequestStats())
    step = StepTrace(1, "sync/eager", requests=[record(ids=[3, *drafts], start=9, drafts=drafts, accepted=0,
                                                       sampled=[0])])
    return [out, silent], [step]


def test_ngram_drafts_are_checked_against_the_lookup_of_the_engine_s_n_range():
    assert ngram_draft_difference(*ngram_run([7, 1, 2])) is None
    assert ngram_draft_difference(*ngram_run([6, 1, 2])) == Difference("ngram drafts", 1, 0, 9, [7, 1, 2], [6, 1, 2])
    assert ngram_draft_difference(*ngram_run([6, 1, 2]), max_n=2) is None      # the 2-gram's continuation
    assert ngram_draft_difference(*ngram_run([5])) == Difference("ngram drafts", 1, 0, 9, [7], [5])  # k = 1


def test_mixed_steps_are_counted_once_per_step_and_refusal_kind():
    def step(i, *rows):
        return StepTrace(i, "async/eager", requests=[record(r, device_fed=fed, refusal=why) for r, fed, why in rows])
    trace = [step(0, (0, True, None), (1, False, "prefill"), (2, False, "prefill")),
             step(1, (0, True, None), (1, False, "host_history"), (3, False, None)),  # host-fed without a reason
             step(2, (1, False, "prefill"), (2, False, "resumed")),                   # nothing device-fed
             step(3, (0, True, None), (1, False, "prefill"))]
    assert mixed_refusals(trace) == {"prefill": 2, "host_history": 1}
