"""Hand-built trace rows for the checks that read an engine trace (tests/gates/test_trace_invariants.py,
tests/gates/test_acceptance_check.py)."""
from engine.trace import RequestTrace


def record(rid: int = 0, start: int = 0, ids=(), drafts=(), accepted: int = 0, sampled=(), prefill: bool = False,
           query_start: int = 0, device_fed: bool = False, refusal: str | None = None,
           draft_slots: int = 0) -> RequestTrace:
    """One row: a prefill over `ids` (a resume's ends with `draft_slots` drafts it held), or a
    verify step from position `start` over ids = the last committed token and the drafts; its
    logits window is its query's rows (a prefill's last 1 + draft_slots)."""
    ids = list(ids)
    slots = draft_slots if prefill else len(ids) - 1
    window = [query_start + i for i in range(len(ids) - 1 - slots, len(ids))]
    return RequestTrace(rid, prefill, device_fed, refusal, ids, [start + i for i in range(len(ids))],
                        start + len(ids), window, query_start, list(drafts), len(drafts), accepted, list(sampled),
                        draft_slots=slots)
