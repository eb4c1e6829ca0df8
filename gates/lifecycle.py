"""Request lifecycles for the gates: Hypothesis-drawn schedules of admissions (a workload's
arrival steps), aborts (LLM.abort before a given engine step) and finishes, one traced run of
such a schedule, and the checks every lifecycle gate makes on it.

A schedule's run is compared with a run of the same workload *without* the aborted requests:
the requests not aborted must give exactly its tokens and, per (request, position), its emit
counts and device inputs (gates/compare.py keys steps by position, so batch composition does not
matter). Beside that, what only the lifecycle can get wrong, checked on the run itself:
- an aborted request is in no step planned after its abort;
- its slot and KV blocks go to no other request in the step launched while its last step was
  still in flight (released when that step is read, not at abort time; StepTrace.launched_behind
  says which step was in flight);
- after the run every slot and block is free again.
"""
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from engine.bench.workload import Workload
from engine.trace import RequestTrace, ScheduleLimits, StepTrace
from gates.compare import Difference
from gates.invariants import limits_difference
from gates.workloads import PROMPTS, Run, params, run, workloads

MAX_ABORT_STEP = 10
PER_REQUEST = ("prompts", "max_tokens", "arrival_steps", "host_history", "seeds", "stop_token_ids", "ignore_eos")


@dataclass(frozen=True)
class Abort:
    request: int   # index into the workload
    step: int      # LLM.abort is called when the scheduler is about to plan this step


@dataclass(frozen=True)
class Lifecycle:
    workload: Workload
    aborts: tuple[Abort, ...]

    @property
    def aborted(self) -> set[int]:
        return {a.request for a in self.aborts}

    def kept(self, aborted: set[int] | None = None) -> Workload:
        """The workload without the aborted requests (`aborted`: those a run really aborted, by
        index; an abort due after its request finished aborts nothing): the run the others are
        compared with."""
        aborted = self.aborted if aborted is None else aborted
        keep = [i for i in range(self.workload.num_reqs) if i not in aborted]
        w = self.workload
        return replace(w, **{name: tuple(getattr(w, name)[i] for i in keep) if getattr(w, name) else ()
                             for name in PER_REQUEST})


@dataclass(frozen=True)
class AbortEvent:
    request_id: int
    step: int                 # the step planned next, after the abort
    status: str               # "waiting", "preempted" or "running" at abort time
    in_flight: bool           # a launched step not yet read held the request
    num_committed: int        # output tokens it had when aborted
    finish_reason: str        # what abort() returned for it


@dataclass
class LifecycleRun:
    run: Run                  # the whole run, every request
    events: list[AbortEvent]
    leaked: str | None        # slots or blocks still taken after the run, or None
    sink_block: int

    @property
    def aborted_ids(self) -> set[int]:
        """The requests aborted; request ids are workload indices (one fresh engine per run)."""
        return {e.request_id for e in self.events}


@st.composite
def lifecycles(draw, min_reqs: int = 3, max_reqs: int = 6, **workload_kwargs) -> Lifecycle:
    """A workload and aborts of one to all-but-one of its requests, at steps 0..MAX_ABORT_STEP."""
    workload = draw(workloads(min_reqs=min_reqs, max_reqs=max_reqs, **workload_kwargs))
    n = workload.num_reqs
    victims = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n - 1, unique=True))
    return Lifecycle(workload, tuple(Abort(i, draw(st.integers(0, MAX_ABORT_STEP))) for i in sorted(victims)))


def run_lifecycle(make_llm, lifecycle: Lifecycle, **engine) -> LifecycleRun:
    """Run the schedule: requests added with their arrival steps, each abort called just before
    its step is planned (a request already finished by then is not aborted)."""
    llm = make_llm(trace=True, **engine)
    w = lifecycle.workload
    reqs = [llm.add_request(p, sp, a) for p, sp, a in zip(w.prompt_list(), params(w), w.arrivals())]
    due = sorted(lifecycle.aborts, key=lambda a: a.step)
    events: list[AbortEvent] = []
    while llm.has_unfinished():
        now = [a for a in due if a.step <= llm.scheduler.step]
        due = [a for a in due if a.step > llm.scheduler.step]
        for a in now:
            req = reqs[a.request]
            if req.is_finished:
                continue
            status = "running" if req.slot is not None else "preempted" if req.is_resumed else "waiting"
            in_flight = req.request_id in llm.in_flight_request_ids
            (out,) = llm.abort(req.request_id)
            events.append(AbortEvent(req.request_id, llm.scheduler.step, status, in_flight, len(out.token_ids),
                                     out.finish_reason))
        llm.step()
    outputs = [llm.output(r) for r in reqs]
    run = Run(w, {**engine, "async_runner": engine.get("async_runner")}, llm.is_async, outputs, llm.trace,
              {s.route for s in llm.trace}, llm.config.max_model_len)
    return LifecycleRun(run, events, _leaked(llm), llm.config.total_kv_blocks)


def _leaked(llm) -> str | None:
    s = llm.scheduler
    slots, blocks = len(s.free_slots), s.block_manager.num_free_blocks
    if slots == llm.config.max_num_seqs and blocks == s.block_manager.num_blocks and not s.held:
        return None
    return (f"after the run {slots} of {llm.config.max_num_seqs} slots and {blocks} of "
            f"{s.block_manager.num_blocks} KV blocks are free ({len(s.held)} aborted requests still held)")


def kept_run(life: LifecycleRun, kept: Workload) -> Run:
    """The run's requests that were not aborted, renumbered 0.. in workload order, as the run
    without the aborted ones numbers them (outputs and trace alike); `kept`: that run's workload."""
    run = life.run
    renumber = {o.request_id: i for i, o in enumerate(o for o in run.outputs if o.request_id not in life.aborted_ids)}
    outputs = [replace(o, request_id=renumber[o.request_id]) for o in run.outputs if o.request_id in renumber]
    trace = [replace(s, requests=[replace(r, request_id=renumber[r.request_id]) for r in s.requests
                                  if r.request_id in renumber], limits=_renumbered(s.limits, renumber))
             for s in run.trace]
    return replace(run, workload=kept, outputs=outputs, trace=[s for s in trace if s.requests])


def _renumbered(limits: ScheduleLimits | None, renumber: dict[int, int]) -> ScheduleLimits | None:
    """The step's limits with the kept requests renumbered; an aborted request's blocks stay held
    (they are the pool's), under an id of its own that no kept request has (-1 - its id)."""
    if limits is None:
        return None
    new = {rid: renumber.get(rid, -1 - rid) for rid in limits.blocks_held.keys() | set(limits.deferred) |
           set(limits.preempted)}
    return replace(limits, blocks_held={new[rid]: blocks for rid, blocks in limits.blocks_held.items()},
                   deferred=[new[rid] for rid in limits.deferred], preempted=[new[rid] for rid in limits.preempted])


def lifecycle_difference(life: LifecycleRun) -> Difference | None:
    """What the run itself must show: aborts return what was committed with reason "abort", no
    aborted request is planned after its abort, its slot and blocks are not handed on while its
    step is in flight, and nothing is left taken after the run."""
    outputs = {o.request_id: o for o in life.run.outputs}
    for e in life.events:
        out = outputs[e.request_id]
        if e.finish_reason != "abort" or out.finish_reason != "abort" or len(out.token_ids) != e.num_committed:
            return Difference("aborted request's output", e.step, e.request_id, -1,
                              ("abort", e.num_committed), (out.finish_reason, len(out.token_ids)))
    aborted_at = {e.request_id: e.step for e in life.events}
    for s in life.run.trace:
        for r in s.requests:
            if r.request_id in aborted_at and s.step >= aborted_at[r.request_id]:
                return Difference("aborted request planned after its abort", s.step, r.request_id, -1,
                                  "no row", f"a row in slot {r.slot}")
    for e in life.events:
        behind = launched_behind_abort(life, e)
        if behind is None:
            continue  # the aborted request's step was read (drained) before the next was planned
        mine, nxt = behind
        blocks = set(mine.block_table) - {life.sink_block}
        for r in nxt.requests:
            taken = r.slot == mine.slot or blocks & set(r.block_table)
            if taken:
                return Difference("slot or KV block of an aborted request reused while its step was in flight",
                                  e.step, r.request_id, -1, f"not slot {mine.slot} nor blocks {sorted(blocks)}",
                                  f"slot {r.slot}, blocks {sorted(set(r.block_table) - {life.sink_block})}")
    if life.leaked:
        return Difference("slots and blocks freed after the run", -1, -1, -1, "all free", life.leaked)
    return None


def launched_behind_abort(life: LifecycleRun, e: AbortEvent) -> tuple[RequestTrace, StepTrace] | None:
    """(the aborted request's row in the step in flight, the step launched behind it) when the
    trace shows the next step launched while the aborted request's step was still unread; None
    when that step was read before the next was planned (nothing of the request was in flight)."""
    by_step = {s.step: s for s in life.run.trace}
    held, nxt = by_step.get(e.step - 1), by_step.get(e.step)
    mine = next((r for r in held.requests if r.request_id == e.request_id), None) if held else None
    if mine is None or nxt is None or nxt.launched_behind != held.step:
        return None
    return mine, nxt


def slot_reused(life: LifecycleRun) -> bool:
    """An aborted request's slot went to a new admission (a prefill row) within two steps of the
    abort: the step launched while its step was in flight, or the first one after it was read."""
    last_slot = {}
    for s in life.run.trace:
        for r in s.requests:
            last_slot[r.request_id, s.step] = r.slot
    for e in life.events:
        slot = last_slot.get((e.request_id, e.step - 1))
        if slot is None:
            continue
        for s in life.run.trace:
            if e.step <= s.step <= e.step + 1 and any(r.is_prefill and r.slot == slot for r in s.requests):
                return True
    return False


def scheduling_gaps(trace: list[StepTrace]) -> list[RequestTrace]:
    """The verify rows of requests back from a step they sat out while running (no preemption
    between: the row is not a prefill): the token budget left them unscheduled while others ran."""
    ran = [s.step for s in trace if s.requests]
    last: dict[int, int] = {}
    returns = []
    for s in trace:
        for r in s.requests:
            prev = last.get(r.request_id)
            if prev is not None and not r.is_prefill and any(prev < t < s.step for t in ran):
                returns.append(r)
            last[r.request_id] = s.step
    return returns


# Every slot taken (max_num_seqs=2), request 0 aborted while its step is in flight, request 1
# running on, requests 2 and 3 waiting: the first admission after the abort takes its slot;
# request 4 is aborted before it arrives.
ABORT_REUSE = Lifecycle(Workload(prompts=tuple(PROMPTS[i] for i in (7, 6, 2, 3, 1)), max_tokens=(40, 30, 24, 40, 20),
                                 arrival_steps=(0, 0, 1, 2, 6)),
                        (Abort(0, 3), Abort(4, 2)))
ABORT_REUSE_ENGINE = dict(max_num_seqs=2)

# A binding token budget: twelve requests whose prompts (5 to 7 tokens on the fixture's bytes) are
# shorter than a verify query (1 + k = 8 tokens), so the budget of 56 that admitted their prefills
# holds seven verify steps: the oldest seven run, the others sit out while running and come back
# (device-fed under the async runner) as others finish, with the drafts their prefill proposed
# (these prompts' first token repeats in them, so the ngram lookup finds drafts at once).
# max_model_len equals the budget, the least the engine accepts.
GAP_PROMPTS = (" \n\n\n", "1, 2, ", "ff or", "def _")
GAPS = Workload(prompts=GAP_PROMPTS * 3, max_tokens=(6, 20, 9, 24, 12, 28, 16, 30, 8, 18, 10, 14),
                ignore_eos=(True,) * 12)
GAPS_ENGINE = dict(max_num_seqs=12, max_model_len=56, max_num_batched_tokens=56, num_spec_tokens=7)


def run_against_kept(make_llm, lifecycle: Lifecycle, **engine) -> tuple[Run, Run, LifecycleRun]:
    """(the sync run without the aborted requests, the async lifecycle run's kept requests, the
    whole lifecycle run): the pair a gate compares, and what its lifecycle checks read."""
    life = run_lifecycle(make_llm, lifecycle, async_runner=True, **engine)
    kept = lifecycle.kept(life.aborted_ids)
    baseline = run(make_llm, kept, async_runner=False, **engine)
    return baseline, kept_run(life, kept), life


def note_lifecycle(gate_record, life: LifecycleRun) -> None:
    """The lifecycle checks of the run (its scheduler limits too), and the claims it covered."""
    gate_record.check(lifecycle_difference(life), f"{life.run.label()}: the aborts themselves")
    gate_record.check(limits_difference(life.run.trace), f"{life.run.label()}: scheduler limits")
    # The request was in flight at its abort, and the trace shows the next step launched behind it:
    # the slot and block check above ran (a trace that lost what was in flight skips it silently).
    gate_record.occurred("abort with a step in flight",
                         any(e.in_flight and launched_behind_abort(life, e) for e in life.events))
    gate_record.occurred("abort of a waiting request", any(e.status == "waiting" for e in life.events))
    gate_record.occurred("aborted slot reused by a new admission", slot_reused(life))
