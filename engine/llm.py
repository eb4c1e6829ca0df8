"""The public engine: LLM(model=DIR).generate(prompts, SamplingParams(...)).

A step is: schedule -> plan -> launch on the device -> read results -> apply them to requests.
The sync runner reads step t's results before scheduling step t+1. The async runner launches
step t+1 first and reads step t's results afterwards, so the host never waits on the device;
it learns every result, including that a request finished, one step late.

Over 300 lines because the request lifecycle (add, abort, the streamed deltas) sits beside the
step it is applied in, and the whole-run entry points (generate, stream) share its validation.
"""
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from engine.clock import NullClock
from engine.config import EngineConfig, ModelConfig
from engine.errors import ModelLoadError, RequestError, SpecgateError
from engine.generation_config import GenerationDefaults
from engine.loader import load_model
from engine.outputs import RequestDelta, RequestOutput
from engine.proposers import NgramProposer, Proposer, ProposerFactory
from engine.request import Request
from engine.runner import InFlight, ModelRunner
from engine.sampling import SamplingParams, request_key
from engine.scheduler import ScheduledBatch, Scheduler
from engine.step_plan import StepPlan
from engine.step_result import StepResult
from engine.tokenizer import HFTokenizer, load_tokenizer
from engine.trace import StepTrace, schedule_limits, trace_step
from engine.veto import runner_policy


class LLM:
    def __init__(self, model: str | os.PathLike | None = None, proposer: ProposerFactory | None = None,
                 **engine_kwargs):
        """`proposer`: with spec="oracle" only, the factory of a proposer the caller brings (the
        bench's oracle, engine/bench/oracle.py); engine_kwargs: EngineConfig's fields."""
        if model is None:
            raise ModelLoadError("LLM() needs model=<a Hugging Face-format folder> (the fixture target is "
                                 "fixtures.TARGET_DIR; the specgate command and the test fixtures pass it)")
        model_dir = Path(model)
        self.model_config = ModelConfig.from_dir(model_dir)
        engine_kwargs.setdefault("dtype", self.model_config.default_engine_dtype)
        # Unasked, max_model_len fits the model (a small folder may hold fewer positions than 512).
        engine_kwargs.setdefault("max_model_len", min(EngineConfig.max_model_len,
                                                      self.model_config.max_position_embeddings))
        self.config = EngineConfig(model=str(model_dir), **engine_kwargs)
        self.model_dir = model_dir
        self.generation = GenerationDefaults.from_dir(model_dir, self.model_config)
        self.eos_token_ids = frozenset(self.generation.eos_token_ids)
        self.tokenizer = load_tokenizer(model_dir)
        if self.tokenizer.vocab_size > self.model_config.vocab_size and isinstance(self.tokenizer, HFTokenizer):
            raise SpecgateError(f"{model_dir}: tokenizer.json has {self.tokenizer.vocab_size} tokens, more than "
                                f"the model's vocab_size {self.model_config.vocab_size}")
        if self.model_config.vocab_size < self.tokenizer.vocab_size:
            raise SpecgateError(f"{model_dir}: vocab_size {self.model_config.vocab_size} is smaller than the "
                                f"byte tokenizer's {self.tokenizer.vocab_size}")
        if self.config.max_model_len > self.model_config.max_position_embeddings:
            raise SpecgateError(f"max_model_len ({self.config.max_model_len}) exceeds the model's "
                                f"max_position_embeddings ({self.model_config.max_position_embeddings})")
        if self.config.device.startswith("cuda") and not torch.cuda.is_available():
            raise SpecgateError("device='cuda' was asked for, but no CUDA device is available")
        self.policy = runner_policy(self.config.spec, self.config.async_runner, self.config.device,
                                    self.config.compile, self.config.graph, self.config.attention_backend)
        self.model = load_model(model_dir, self.config.device, self.config.torch_dtype)
        self.runner = ModelRunner(self.config, self.model, self._make_proposer(proposer))
        self.runner.capture_graphs()  # the graph arm on CUDA: every bucket, up front
        self.scheduler = Scheduler(self.config, self.policy)
        self.trace: list[StepTrace] | None = [] if self.config.trace else None
        # Where the host read device results: 'blocking' when the step read was the newest one
        # launched (the device has nothing queued behind it), 'deferred' when a later step was
        # already queued, so the device stayed busy while the host read.
        self.host_reads = {"blocking": 0, "deferred": 0}
        self._rng = torch.Generator().manual_seed(self.config.seed)
        self._next_id = 0
        self._in_flight: InFlight | None = None
        self._finished: list[Request] = []
        self._requests: dict[int, Request] = {}   # unfinished, or finished and not yet streamed
        self._num_streamed: dict[int, int] = {}   # request id -> output tokens already in a delta
        # Requests with news since the last deltas(), by id: bounded by the requests not yet
        # streamed to their end, however many steps run without a deltas() call (bench loops).
        self._touched: dict[int, Request] = {}
        self.clock = NullClock()  # the bench hands in its step clock here (engine/clock.py)

    @property
    def is_async(self) -> bool:
        return self.policy.is_async

    def _make_proposer(self, factory: ProposerFactory | None) -> Proposer:
        spec = self.config.spec
        if (spec == "oracle") != (factory is not None):
            raise SpecgateError(
                "spec='oracle' is for benchmarks only and needs proposer=<a factory>: the oracle replays the "
                "target's own greedy continuation (LLM(..., spec='oracle', proposer=engine.bench.oracle."
                "oracle_proposer(script)), built by `specgate bench --spec oracle`)" if factory is None else
                f"a proposer factory was given with spec={spec!r}; it is used only with spec='oracle'")
        if spec == "ngram":
            return NgramProposer(self.config.k)
        if spec == "block":
            from engine.block_drafter import BlockProposer
            return BlockProposer.from_dir(self.config.drafter, self.model, self.config)
        if spec == "oracle":
            return factory(self.config, self.model_dir, self.model_config.vocab_size)
        return NgramProposer(0)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    arrival_step: int = 0) -> Request:
        """Validate and queue one request. A bad request raises RequestError and changes nothing."""
        token_ids, params = self._validate(prompt, params, arrival_step)
        req = Request(self._next_id, token_ids, params, request_key(params.seed, self._rng),
                      arrival_step=self.scheduler.step + arrival_step)
        self._next_id += 1
        self.scheduler.add(req)
        self._requests[req.request_id] = req
        self._num_streamed[req.request_id] = 0
        return req

    def abort(self, request_ids: int | Iterable[int]) -> list[RequestOutput]:
        """End requests now, with finish reason "abort": waiting, running, preempted or in a step
        still in flight alike. Each returns what it had committed; a step in flight emits nothing
        more for it, and its KV blocks and state slot are given back only after that step's
        results are read. An id that is unknown or already finished raises RequestError and
        aborts nothing (all ids are checked first)."""
        ids = [request_ids] if isinstance(request_ids, int) else list(request_ids)
        reqs = []
        for rid in ids:
            req = self._requests.get(rid) if isinstance(rid, int) and not isinstance(rid, bool) else None
            if req is None or req.is_finished:
                raise RequestError(f"cannot abort request {rid!r}: unknown or already finished (abort takes "
                                   f"the id of a request added and not yet finished)")
            reqs.append(req)
        if len(set(map(id, reqs))) != len(reqs):
            raise RequestError(f"request ids to abort repeat: {ids}")
        in_flight = self._in_flight.plan.requests if self._in_flight is not None else []
        for req in reqs:
            self.scheduler.abort(req, self.scheduler.step, in_flight=any(req is r for r in in_flight))
            self.runner.state.forget_drafts(req.request_id)
            self._touched[req.request_id] = req
        return [self.output(req) for req in reqs]

    def _validate(self, prompt, params, arrival_step) -> tuple[list[int], SamplingParams]:  # params None: defaults
        if isinstance(prompt, str):
            token_ids = self.tokenizer.encode(prompt) if prompt else []
        elif isinstance(prompt, (list, tuple)):
            token_ids = list(prompt)
        else:
            raise RequestError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        if not token_ids:
            raise RequestError("prompt is empty")
        params = self.generation.sampling_params(len(token_ids)) if params is None else params
        if not isinstance(params, SamplingParams):
            raise RequestError(f"params must be a SamplingParams, got {type(params).__name__}")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids + list(params.stop_token_ids)
               if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise RequestError(f"token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if params.top_k > vocab:
            raise RequestError(f"top_k ({params.top_k}) exceeds the vocabulary ({vocab}); use -1 to keep every token")
        if len(token_ids) >= self.config.max_model_len:
            raise RequestError(f"prompt has {len(token_ids)} tokens; the context holds "
                               f"{self.config.max_model_len} (max_model_len): the prompt plus at least "
                               f"one generated token")
        if isinstance(arrival_step, bool) or not isinstance(arrival_step, int) or arrival_step < 0:
            raise RequestError(f"arrival_step must be an integer >= 0, got {arrival_step!r}")
        self.runner.proposer.check_request(token_ids, params.max_tokens, params.temperature)
        return token_ids, params

    @property
    def in_flight_request_ids(self) -> list[int]:
        """The requests of the step launched and not yet read (async runner; else empty)."""
        return [req.request_id for req in self._in_flight.plan.requests] if self._in_flight is not None else []

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._in_flight is not None

    # ---- one step -----------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one engine step; returns the requests that finished during it."""
        self._finished = []
        if self._in_flight and self.policy.drains_before_schedule(self.scheduler.running):
            self._complete(self._in_flight, blocking=True)  # such sampling needs the full history
            self._in_flight = None
        self.clock.start()
        batch = self.scheduler.schedule()
        for req, slot in zip(batch.preempted, batch.preempted_slots):
            self.runner.state.keep_drafts(req.request_id, slot)
        self._check_progress(batch)
        launched = self._launch(batch) if batch.requests else None
        if launched is not None and self.trace is not None:  # before the step in flight frees anything
            launched.limits = schedule_limits(self.config, self.scheduler, batch)
        previous, self._in_flight = self._in_flight, launched
        if launched is not None and previous is not None:
            launched.launched_behind = previous.plan.step
        if previous is not None:
            self._complete(previous, blocking=launched is None)
        if not self.policy.completes_late and self._in_flight is not None:
            self._complete(self._in_flight, blocking=True)
            self._in_flight = None
        return self._finished

    def _check_progress(self, batch: ScheduledBatch) -> None:
        if (self.scheduler.has_unfinished() and not (batch.requests or batch.preempted or self._in_flight)
                and not self.scheduler.arrives_later(batch.step)):
            # The scheduler is deterministic: the next step would see the same state and also
            # schedule nothing, forever.
            raise RuntimeError(f"engine stalled at step {batch.step}: {len(self.scheduler.running)} running and "
                               f"{len(self.scheduler.waiting)} waiting requests, none schedulable (a scheduler bug)")

    def _launch(self, batch: ScheduledBatch) -> InFlight:
        plan = self.runner.plan_step(batch, self.policy, self.config.graph)
        self.clock.mark("plan")
        for req, prefill in zip(batch.requests, batch.is_prefill):
            if prefill:
                if req.is_resumed:
                    self.runner.state.resume_drafts(req.request_id, req.slot)
                req.start_prefill()
                self.runner.proposer.admit(req.slot, req.prompt_token_ids, req.rng_key)
        flight = self.runner.launch(plan, self.clock)
        self.clock.launched()
        return flight

    def _complete(self, flight: InFlight, blocking: bool) -> None:
        """Read a step's results and apply them."""
        self.host_reads["blocking" if blocking else "deferred"] += 1
        started = self.clock.now()
        results = self.runner.read(flight, blocking)
        waited = self.clock.now()
        if self.trace is not None:
            self.trace.append(trace_step(flight.plan, flight.traced, results, self.policy.route,
                                         flight.launched_behind, flight.limits))
        self._apply(flight.plan, results)
        self.scheduler.release_held(flight.plan.requests)
        # The runner replays a graph for a step planned in the graph arm, on CUDA only.
        self.clock.add_completion(started, waited, flight.gpu_span, flight.plan.arm == "graph" and self.runner.is_cuda)

    def _apply(self, plan: StepPlan, results: list[StepResult]) -> None:
        """The one place a step's results reach its requests: counters, tokens, finish reasons.
        A request whose step failed on the host (req.error) ends alone, emitting nothing from that
        step; the others in the batch go on."""
        self._touched.update((req.request_id, req) for req in plan.requests)
        for req in plan.requests:
            if req.error is not None and not req.is_finished:
                self._finish(req, "error", plan.step)
        for row, result in zip(plan.real_rows, results):
            req = row.request
            if req.is_finished:
                continue  # the device ran past this request's end; nothing more is emitted
            if row.is_prefill:  # a resume verified the drafts it held, if any
                req.record_prefill(result.num_draft, result.num_accepted)
            else:  # every decode step is a verify step, drafts or none (spec width 0: sampled on the host)
                req.record_verify(result.num_draft, result.num_accepted)
            produced = result.emitted
            for i, token in enumerate(produced):
                req.append_output(token, plan.step)
                reason = self._finish_reason(req, token)
                if reason:
                    self._finish(req, reason, plan.step, num_truncated=len(produced) - i - 1)
                    break

    def _finish(self, req: Request, reason: str, step: int, num_truncated: int = 0) -> None:
        self.scheduler.finish(req, reason, step, num_truncated)
        self.runner.state.forget_drafts(req.request_id)
        self._finished.append(req)

    def _finish_reason(self, req: Request, token: int) -> str | None:
        p = req.params
        if token in p.stop_token_ids or (token in self.eos_token_ids and not p.ignore_eos):
            return "stop"
        if len(req.output_token_ids) >= p.max_tokens:
            return "length"
        if req.num_tokens >= self.config.max_model_len:
            return "context"  # cut by max_model_len before max_tokens: the caller asked for more
        return None

    # ---- streaming ------------------------------------------------------------------------------
    def step_deltas(self) -> list[RequestDelta]:
        """Run one engine step (add_request first); returns what it added to each request,
        one RequestDelta per request with news (tokens, or its finish), aborts since the last
        call included."""
        self.step()
        return self.deltas()

    def deltas(self) -> list[RequestDelta]:
        """The news since the last call, without running a step: what LLM.abort ended."""
        out = []
        for rid, req in self._touched.items():
            if rid not in self._num_streamed:
                continue
            start = self._num_streamed[rid]
            tokens = list(req.output_token_ids[start:])
            if not tokens and not req.is_finished:
                continue
            self._num_streamed[rid] = len(req.output_token_ids)
            out.append(RequestDelta(rid, tokens, req.finish_reason if req.is_finished else None))
            if req.is_finished:
                del self._num_streamed[rid], self._requests[rid]
        self._touched = {}
        return out

    def stream(self, prompts: str | list, params: SamplingParams | list[SamplingParams] | None = None,
               arrival_steps: list[int] | None = None) -> Iterator[RequestDelta]:
        """Like generate, but yields each request's tokens as its steps commit them: RequestDelta
        records, a step's in request order, the last one per request with its finish reason.
        The caller may call abort() between deltas; the aborted requests' last deltas follow."""
        reqs = self._add_all(prompts, params, arrival_steps)
        ids = {req.request_id for req in reqs}
        while any(rid in self._num_streamed for rid in ids):
            news = self.deltas() or (self.step_deltas() if self.has_unfinished() else [])
            yield from (d for d in news if d.request_id in ids)

    # ---- whole runs ---------------------------------------------------------------------------
    def generate(self, prompts: str | list, params: SamplingParams | list[SamplingParams] | None = None,
                 arrival_steps: list[int] | None = None, use_tqdm: bool = False) -> list[RequestOutput]:
        """Run prompts to completion. Every request is validated before any runs, so a bad one
        raises RequestError (naming its index) and nothing is lost."""
        reqs = self._add_all(prompts, params, arrival_steps)
        bar = _progress(len(reqs)) if use_tqdm else None
        while self.has_unfinished():
            done = self.step()
            self.deltas()  # generate streams nothing; this keeps the bookkeeping of news empty
            if bar is not None:
                bar.update(len(done))
        if bar is not None:
            bar.close()
        return [self.output(r) for r in reqs]

    def _add_all(self, prompts, params, arrival_steps) -> list[Request]:
        """Validate every request, then add them all (generate and stream)."""
        if not isinstance(prompts, (str, list, tuple)):
            raise RequestError(f"prompts must be a string, a list of token ids, or a list of those; "
                               f"got {type(prompts).__name__}")
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        n = len(prompts)
        params_list = params if isinstance(params, list) else [params] * n  # None: the folder's defaults
        arrivals = arrival_steps or [0] * n
        if len(params_list) != n or len(arrivals) != n:
            raise RequestError(f"got {n} prompts, {len(params_list)} params and {len(arrivals)} arrival steps")
        for i, (prompt, p, a) in enumerate(zip(prompts, params_list, arrivals)):
            try:
                self._validate(prompt, p, a)
            except RequestError as e:
                raise RequestError(f"request {i}: {e}") from None
        return [self.add_request(pr, p, a) for pr, p, a in zip(prompts, params_list, arrivals)]

    def output(self, req: Request) -> RequestOutput:
        prompt = req.prompt_token_ids
        return RequestOutput(req.request_id, self.tokenizer.decode(prompt), prompt,
                             list(req.output_token_ids), self.tokenizer.decode(req.output_token_ids),
                             req.finish_reason or "", req.stats, req.error)


def _progress(total: int):
    import sys

    from tqdm import tqdm
    return tqdm(total=total, unit="req", disable=not sys.stderr.isatty())
