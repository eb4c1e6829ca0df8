"""Checks of one traced run against itself and against references the host can compute.

The trace is what the device did; the outputs and stats are what the host made of it. They
must agree: every emitted token traced, every counter the sum of its trace records, every
step starting where the last one ended. And two references need no second run:

- the logits window: a verify row gathers its num_draft + 1 logits from its query start
  (a window that falls back to the query's end is reason A); a prefill its last token and the
  draft slots after it (a resumed request verifies the drafts it held when preempted);
- greedy acceptance: with temperature 0, the target's choice at each position is the token the
  run finally emitted there (verify is lossless), so a step from position s accepts exactly the
  longest prefix of its drafts that matches the output from s + 1. A stale draft or a logit
  gathered from the wrong row moves acceptance even when every token stays right;
- ngram drafts: prompt lookup is a pure function of the committed history, recomputed here in
  plain Python, so a stale or misrouted draft is caught in either runner;
- logits processor histories: a request with logits processors verifies no drafts, and the j-th
  call of its processors receives exactly its first j output tokens (the engine's contract), so
  the histories a recording processor kept are the request's own output, call by call.
- the scheduler's limits: each step's tokens within max_num_batched_tokens, the KV blocks held
  within the pool and each held once, and the blocks reserved covering every position the step
  writes (and could write, behind a step still in flight): checked against the limits the trace
  records with each step, whatever the tokens, since a scheduler that overruns its own budget can
  leave every token right.

A record is *real* when its results reached the request; the async runner also traces the step
it launched past a request's end, which emits nothing.

Over 300 lines because it is the one place every check of a trace against itself lives: they
share its record helpers, and mutation runs name this module as the gates' checking code.
"""
from engine.trace import RequestTrace, StepTrace
from gates.compare import Difference, step_of


def records_by_request(trace: list[StepTrace]) -> dict[int, list[tuple[int, RequestTrace]]]:
    out: dict[int, list[tuple[int, RequestTrace]]] = {}
    for step in trace:
        for rec in step.requests:
            out.setdefault(rec.request_id, []).append((step.step, rec))
    return out


def real_records(trace, outputs) -> dict[int, list[tuple[int, RequestTrace]]]:
    """Per request, the records whose results reached it: prefills, and verify steps from a
    position at most final length - 2 (one that starts later began past the end)."""
    final_len = {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in outputs}
    return {rid: [(s, r) for s, r in recs if r.is_prefill or r.positions[0] <= final_len[rid] - 2]
            for rid, recs in records_by_request(trace).items()}


def width(rec: RequestTrace) -> int:
    """Drafts this record's row could verify: a verify row's spec width (its query after the last
    committed token); a prefill's draft slots (0, or the drafts a resumed request held)."""
    return rec.draft_slots if rec.is_prefill else len(rec.input_ids) - 1


def trace_consistency(outputs, trace) -> Difference | None:
    """Each request's outputs and stats against its own trace records."""
    real = real_records(trace, outputs)
    for out in sorted(outputs, key=lambda o: o.request_id):
        rid, stats, recs = out.request_id, out.stats, real.get(out.request_id, [])
        diff = _record_shape(rid, recs) or _continuity(rid, recs)
        if diff:
            return diff
        drafting = [(s, r) for s, r in recs if width(r) > 0]  # verify steps, and resumes verifying held drafts
        # Every decode step is a verify step, drafts or none (width 0: a request sampled on the
        # host), so completion = prefills + verify steps + accepted - truncated holds per request.
        verify = [(s, r) for s, r in recs if not r.is_prefill]
        prefills = [r for _, r in recs if r.is_prefill]
        emitted = [t for _, r in recs for t in r.sampled]
        last_step = recs[-1][0] if recs else None
        n = len(out.token_ids)
        checks = [
            ("num_prefills", len(prefills), stats.num_prefills),
            ("completion tokens = sum of emit counts - truncated",
             sum(r.emit_count for _, r in recs) - stats.num_truncated, n),
            ("emitted tokens", emitted[:n], list(out.token_ids)),
            ("verify_steps", len(verify), stats.verify_steps),
            ("num_drafts", sum(1 for _, r in drafting if r.num_draft > 0), stats.num_drafts),
            ("num_draft_tokens", sum(r.num_draft for _, r in drafting), stats.num_draft_tokens),
            ("num_accepted_tokens", sum(r.num_accepted for _, r in drafting), stats.num_accepted_tokens),
            ("accepted_per_position", _per_position(drafting), _trimmed(stats.accepted_per_position)),
        ]
        for what, expected, actual in checks:
            if expected != actual:
                return Difference(what, last_step, rid, None, expected, actual)
    return None


def _per_position(verify) -> list[int]:
    counts = [0] * max((r.num_accepted for _, r in verify), default=0)
    for _, r in verify:
        for j in range(r.num_accepted):
            counts[j] += 1
    return counts


def _trimmed(counts: list[int]) -> list[int]:
    counts = list(counts)
    while counts and counts[-1] == 0:
        counts.pop()
    return counts


def _record_shape(rid: int, recs) -> Difference | None:
    """num_accepted <= num_draft <= width; the drafts traced are num_draft long; emit = sampled."""
    for step, r in recs:
        position = r.positions[0]
        if not 0 <= r.num_accepted <= r.num_draft <= width(r):
            return Difference("0 <= num_accepted <= num_draft <= spec width", step, rid, position,
                              f"<= {r.num_draft} <= {width(r)}", r.num_accepted)
        if len(r.draft_token_ids) != r.num_draft or len(r.sampled) != r.emit_count:
            return Difference("drafts and sampled tokens traced", step, rid, position,
                              (r.num_draft, r.emit_count), (len(r.draft_token_ids), len(r.sampled)))
    return None


def _continuity(rid: int, recs) -> Difference | None:
    """Each real step starts where the previous one left the request: a verify step from the
    position of the last committed token, a prefill (resume) over the whole history, then its
    draft slots."""
    committed_through = None  # position of the request's last committed token
    for step, r in recs:
        if committed_through is not None:
            if r.is_prefill and len(r.input_ids) - width(r) != committed_through + 1:
                return Difference("resumed prefill length", step, rid, 0, committed_through + 1,
                                  len(r.input_ids) - width(r))
            if not r.is_prefill and r.positions[0] != committed_through:
                return Difference("verify start position", step, rid, r.positions[0], committed_through,
                                  r.positions[0])
        committed_through = r.window_position + r.emit_count
    return None


def logits_window_difference(trace: list[StepTrace]) -> Difference | None:
    """Reason A: a verify row's logits window must be its query's rows from the query start,
    num_draft + 1 of them at least (all 1 + width, as planned); a prefill row's, its last token
    before its draft slots, and those."""
    for step in trace:
        for r in step.requests:
            window = list(r.logits_indices)
            end = r.query_start + len(r.input_ids)
            expected = list(range(end - 1 - width(r), end) if r.is_prefill else range(r.query_start, end))
            if window != expected or len(window) < r.num_draft + 1:
                return Difference("logits window", step.step, r.request_id, r.window_position, expected, window)
    return None


def acceptance_difference(outputs, trace, greedy_ids: set[int]) -> Difference | None:
    """Greedy requests: a verify step from position s accepts the longest prefix of its drafts
    that matches the final sequence from s + 1 (beyond the end, at least as far as it is known)."""
    real = real_records(trace, outputs)
    for out in sorted(outputs, key=lambda o: o.request_id):
        if out.request_id not in greedy_ids:
            continue
        sequence = list(out.prompt_token_ids) + list(out.token_ids)
        for step, r in real.get(out.request_id, []):
            if r.is_prefill and width(r) == 0:
                continue
            s = r.window_position
            known = sequence[s + 1:s + 1 + r.num_draft]
            match = next((j for j, (d, t) in enumerate(zip(r.draft_token_ids, known)) if d != t), len(known))
            exact = match < len(known) or len(known) == r.num_draft
            if (exact and r.num_accepted != match) or (not exact and r.num_accepted < match):
                return Difference("num_accepted (greedy: matching draft prefix)", step, out.request_id, s,
                                  match if exact else f">= {match}", r.num_accepted)
    return None


def ngram_drafts(history: list[int], k: int, min_n: int = 1, max_n: int = 3) -> list[int]:
    """Prompt lookup in plain Python: the tokens after the earliest earlier occurrence of the
    history's last n tokens, n from max_n down to min_n; at most k, never past the history."""
    length = len(history)
    for n in range(max_n, min_n - 1, -1):
        suffix = history[length - n:]
        for start in range(length - n):
            if history[start:start + n] == suffix:
                return history[start + n:start + n + k]
    return []


def ngram_draft_difference(outputs, trace, min_n: int = 1, max_n: int = 3) -> Difference | None:
    """Every real verify step's drafts are the prompt-lookup drafts of the history it starts from."""
    real = real_records(trace, outputs)
    for out in sorted(outputs, key=lambda o: o.request_id):
        sequence = list(out.prompt_token_ids) + list(out.token_ids)
        for step, r in real.get(out.request_id, []):
            if width(r) == 0:
                continue
            s = r.window_position
            expected = ngram_drafts(sequence[:s + 1], width(r), min_n, max_n)
            if list(r.draft_token_ids) != expected:
                return Difference("ngram drafts", step, out.request_id, s, expected, list(r.draft_token_ids))
    return None


def history_difference(outputs, histories: dict[int, list[list[int]]], trace) -> Difference | None:
    """Requests with logits processors against the engine's contract for them (docs/engine.md):
    no draft slots in any step (a processor sees one logits row per step), and one call per output
    token, the j-th receiving exactly the first j output tokens (the prompt excluded, no token of a
    later step, no call past the end). `histories`: request id -> the history each call received,
    in call order (gates/processors.py HistoryRecorder); requests without one are not judged."""
    real = real_records(trace, outputs)
    for out in sorted(outputs, key=lambda o: o.request_id):
        rid, start, tokens = out.request_id, len(out.prompt_token_ids), list(out.token_ids)
        if rid not in histories:
            continue
        drafted = next(((step, r) for step, r in real.get(rid, []) if width(r) > 0), None)
        if drafted is not None:
            step, r = drafted
            return Difference("draft slots of a request with logits processors", step, rid, r.positions[0], 0,
                              width(r))
        calls = histories[rid]
        for j in range(max(len(calls), len(tokens))):
            want = tokens[:j] if j < len(tokens) else "no call past the request's end"
            got = calls[j] if j < len(calls) else "no call"
            if got != want:
                return Difference("output history a logits processor received", step_of(trace, rid, start + j),
                                  rid, start + j, want, got)
    return None


def mixed_refusals(trace: list[StepTrace]) -> dict[str, int]:
    """Refusal kind -> number of steps where a request refused for it shared the step with a
    device-fed request (the predicate split's case)."""
    counts: dict[str, int] = {}
    for step in trace:
        if any(r.device_fed for r in step.requests):
            for kind in {r.refusal for r in step.requests if not r.device_fed and r.refusal}:
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def tokens_scheduled(step: StepTrace) -> int:
    """The step's query tokens: every prefill token and every verify row's 1 + width slots
    (padding rows of the graph arm are the arm's, not the scheduler's, and not counted)."""
    return sum(len(r.input_ids) for r in step.requests)


def limits_difference(trace: list[StepTrace]) -> Difference | None:
    """Each step against the limits it was scheduled under (StepTrace.limits): the token budget
    and max_num_seqs; the KV pool (every block held lies in it, none is held twice, held plus
    free is the whole pool); each row's block table is what its request held; and the blocks
    reserved cover every position the row writes, and, when a step was still in flight as this
    one launched (async runner), every position it could write had that step accepted all its
    drafts: its reservation was made without knowing them."""
    by_step = {s.step: s for s in trace}
    for s in trace:
        if s.limits is None:
            return Difference("scheduler limits traced", s.step, -1, -1, "ScheduleLimits", None)
        diff = _budget(s) or _pool(s) or _reservations(s, by_step.get(s.launched_behind))
        if diff:
            return diff
    return None


def _budget(s: StepTrace) -> Difference | None:
    lim = s.limits
    tokens = tokens_scheduled(s)
    if tokens > lim.max_num_batched_tokens:
        return Difference("tokens scheduled <= max_num_batched_tokens", s.step, -1, -1,
                          f"<= {lim.max_num_batched_tokens}", tokens)
    if s.num_reqs > lim.max_num_seqs:
        return Difference("requests scheduled <= max_num_seqs", s.step, -1, -1, f"<= {lim.max_num_seqs}", s.num_reqs)
    return None


def _pool(s: StepTrace) -> Difference | None:
    lim = s.limits
    owner: dict[int, int] = {}
    for rid, blocks in sorted(lim.blocks_held.items()):
        for b in blocks:
            if not 0 <= b < lim.num_kv_blocks:
                return Difference("KV block held within the pool", s.step, rid, -1,
                                  f"in [0, {lim.num_kv_blocks})", b)
            if b in owner:
                return Difference("KV block held once", s.step, rid, -1, f"block {b} held by request {owner[b]} only",
                                  f"block {b} also held by request {rid}")
            owner[b] = rid
    if len(owner) + lim.num_free_blocks != lim.num_kv_blocks:
        return Difference("KV blocks held + free = the pool", s.step, -1, -1, lim.num_kv_blocks,
                          f"{len(owner)} held + {lim.num_free_blocks} free")
    return None


def _reservations(s: StepTrace, behind: StepTrace | None) -> Difference | None:
    lim = s.limits
    before = {r.request_id: r for r in behind.requests} if behind else {}
    for r in s.requests:
        held = lim.blocks_held.get(r.request_id)
        sink = lim.num_kv_blocks
        if held is None or list(r.block_table) != held + [sink] * (len(r.block_table) - len(held)):
            return Difference("block table = the blocks the request held", s.step, r.request_id, -1,
                              held, list(r.block_table))
        capacity = len(held) * lim.block_size
        last = max(r.positions)
        if last >= capacity:
            return Difference("KV reserved covers the positions written", s.step, r.request_id, last,
                              f"< {capacity}", last)
        prev = before.get(r.request_id)
        if prev is not None and not r.is_prefill:
            # the in-flight step's last committed position at most: a prefill commits one token
            # after its query, a verify row its drafts and one more
            committed = len(prev.input_ids) if prev.is_prefill else prev.positions[0] + width(prev) + 1
            worst = committed + width(r)
            if worst >= capacity:
                return Difference("KV reserved covers the step in flight accepting every draft", s.step,
                                  r.request_id, worst, f"< {capacity}", worst)
    return None


def prefill_deferred_by_budget(trace: list[StepTrace]) -> bool:
    """The token budget bound with verify slots competing for it: a step ran verify rows and
    left out, for the budget, a request waiting for its prefill (one that held no blocks)."""
    return any(s.limits is not None and any(not r.is_prefill for r in s.requests)
               and any(rid not in s.limits.blocks_held for rid in s.limits.deferred) for s in trace)
