"""Step-by-step comparison of two traced runs of the same workload (usually sync vs async).

A verify step is keyed by (request id, position of its last committed token). Greedy drafts
depend only on the request's own history, so the step a request takes from a given position is
the same in any runner and any batch: its device inputs and its emit count (num_accepted + 1)
must match exactly. Steps past a request's end (the async runner learns of a finish one step
late) are dropped; with preemption, only keys both runs reached are compared.

`runs_difference` is the whole comparison a gate makes: output tokens first, then the verify
steps taken, then per (request, position) the emit counts and/or device inputs. Every check
returns the first Difference (what, step, request, position, expected, actual) or None.
"""
from dataclasses import dataclass

from engine.trace import RequestTrace, StepTrace

StepKey = tuple[int, int]


@dataclass
class Difference:
    what: str
    step: int
    request_id: int
    position: int
    expected: object
    actual: object

    def as_dict(self) -> dict:
        return dict(what=self.what, step=self.step, request_id=self.request_id, position=self.position,
                    expected=self.expected, actual=self.actual)

    def __str__(self) -> str:
        return (f"{self.what} differs at step {self.step}, request {self.request_id}, position "
                f"{self.position}: expected {self.expected}, got {self.actual}")


def verify_steps(trace: list[StepTrace], final_len: dict[int, int]) -> dict[StepKey, tuple[int, RequestTrace]]:
    """(request, start position) -> (step, record), for every real decode/verify step."""
    out = {}
    for step in trace:
        for rec in step.requests:
            if rec.is_prefill:
                continue
            start = rec.positions[0]
            if start <= final_len[rec.request_id] - 2:
                out[(rec.request_id, start)] = (step.step, rec)
    return out


def device_inputs(rec: RequestTrace) -> dict:
    """What the device fed this request in a step, independent of its row in the batch."""
    return dict(input_ids=rec.input_ids, positions=rec.positions, seq_len=rec.seq_len,
                logits_window=[i - rec.query_start for i in rec.logits_indices])


def first_difference(expected: dict, actual: dict, field: str) -> Difference | None:
    """Compare `field` ('emit_count' or 'device_inputs') over the keys both runs reached."""
    for key in sorted(expected.keys() & actual.keys()):
        (_, rec_e), (step_a, rec_a) = expected[key], actual[key]
        want, got = ((rec_e.emit_count, rec_a.emit_count) if field == "emit_count"
                     else (device_inputs(rec_e), device_inputs(rec_a)))
        if want != got:
            return Difference(field, step_a, key[0], key[1], want, got)
    return None


def key_difference(expected: dict, actual: dict) -> Difference | None:
    """Both runs took a verify step from the same (request, position) keys: a step one run took
    and the other did not means a request moved differently (only without preemption)."""
    only_one = sorted(expected.keys() ^ actual.keys())
    if not only_one:
        return None
    key = only_one[0]
    step, _ = expected.get(key) or actual.get(key)
    return Difference("verify step taken", step, key[0], key[1], key in expected, key in actual)


def runs_difference(sync, async_, fields=("emit_count", "device_inputs")) -> Difference | None:
    """Async against sync (gates.workloads.Run): tokens, then per (request, position) `fields`.
    Without preemption both runs must have taken the same verify steps."""
    diff = token_difference({o.request_id: o.token_ids for o in sync.outputs}, async_)
    if diff is not None:
        return diff
    final_len = sync.final_len
    steps_s, steps_a = verify_steps(sync.trace, final_len), verify_steps(async_.trace, final_len)
    if not sync.num_preemptions and not async_.num_preemptions:
        diff = key_difference(steps_s, steps_a)
    for field in fields:
        diff = diff or first_difference(steps_s, steps_a, field)
    return diff


def token_difference(expected: dict[int, list[int]], actual) -> Difference | None:
    """The first output token (by request, then position) where `actual` (a Run) differs from
    the expected tokens; the step is the one of `actual` that emitted the position."""
    for out in sorted(actual.outputs, key=lambda o: o.request_id):
        want, got = list(expected[out.request_id]), list(out.token_ids)
        if want == got:
            continue
        i = next((j for j in range(min(len(want), len(got))) if want[j] != got[j]), min(len(want), len(got)))
        position = len(out.prompt_token_ids) + i
        return Difference("output token", step_of(actual.trace, out.request_id, position), out.request_id,
                          position, want[i] if i < len(want) else "end", got[i] if i < len(got) else "end")
    return None


def step_of(trace: list[StepTrace], request_id: int, position: int) -> int | None:
    """The step whose emitted tokens included `position` of the request (None if none did)."""
    for step in trace:
        for rec in step.requests:
            if rec.request_id != request_id:
                continue
            first = rec.window_position + 1
            if first <= position < first + rec.emit_count:
                return step.step
    return None
