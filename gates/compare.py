"""Step-by-step comparison of two traced runs of the same workload (usually sync vs async).

A verify step is keyed by (request id, position of its last committed token). Greedy drafts
depend only on the request's own history, so the step a request takes from a given position is
the same in any runner and any batch: its device inputs and its emit count (num_accepted + 1)
must match exactly. Steps past a request's end (the async runner learns of a finish one step
late) are dropped; with preemption, only keys both runs reached are compared.
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
        (step_e, rec_e), (step_a, rec_a) = expected[key], actual[key]
        want, got = ((rec_e.emit_count, rec_a.emit_count) if field == "emit_count"
                     else (device_inputs(rec_e), device_inputs(rec_a)))
        if want != got:
            return Difference(field, step_a, key[0], key[1], want, got)
    return None
