"""The gates' workloads: prompts, Hypothesis strategies for batch compositions (`None` means
"let Hypothesis choose"), the deterministic mixes some gates need, and one traced run. A workload
is the engine's `engine.bench.workload.Workload`; its host-history requests get `no_immediate_repeat`.
The prompts are text, so a model folder's own tokenizer encodes them (`--model DIR`).

Hypothesis examples per test come from the loaded profile: the bounded `ci` count a gate asks
for, or the `deep` profile's count under HYPOTHESIS_PROFILE=deep (`specgate gates run --deep`).
"""
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hypothesis import Phase, settings
from hypothesis import strategies as st

from engine.bench.workload import Workload
from engine.block_drafter import mismatch_with_target
from gates.processors import WHOLE_HISTORY, HistoryRecorder

DRAFTERS = ("ngram", "block")

# Code-like prompts of mixed lengths; some repeat themselves, so ngram drafts hit.
PROMPTS = (
    "def main(",
    "import os\nimport sys\n",
    "class Foo:\n    def __init__(self):\n        self.x = 1\n        self.y = 2\n",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    ",
    "x = 1\n" * 12,
    "if __name__ == '__main__':\n    main()\n",
    '    """Return the value of the key.\n\n    The key is looked up in the table.\n    """\n',
    "def parse(self, data):\n    result = []\n    for line in data.splitlines():\n        "
    "if not line:\n            continue\n        result.append(line.strip())\n    return ",
)
LONG_PROMPTS = tuple(p for p in PROMPTS if len(p) > 60)
MAX_TOKENS = 40
# stop_token_ids for the stop-rule workloads: bytes the fixture target emits now and then in
# code, neither so often that every request ends at once nor so rarely that none stops.
STOP_TOKENS = tuple(map(ord, "e(:=r"))


def drafter_skips(target_dir, drafter_dir) -> dict[str, str]:
    """The drafters of DRAFTERS that the gates skip on this target, with the reason: the ngram
    drafter runs on every target, the block drafter only on the one it was trained for (on another
    its drafts are noise: exact, but no acceptance to check)."""
    reason = mismatch_with_target(drafter_dir, target_dir) if target_dir else None
    return {"block": f"block drafter skipped: {reason}"} if reason else {}


def gate_settings(ci_examples: int) -> settings:
    """`ci_examples` under the ci profile, and no shrinking: a red gate reports the first
    failing example at once (each example is whole engine runs, and a seeded-defect run pays
    for every one). The deep profile's larger count, with shrinking, under deep; the mutation
    profile's smaller count under mutation (every surviving mutant pays for each example)."""
    profile = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    no_shrink = tuple(p for p in Phase if p is not Phase.shrink)
    if profile == "ci":
        return settings(max_examples=ci_examples, phases=no_shrink)
    if profile == "mutation":
        return settings(max_examples=min(ci_examples, settings.get_profile("mutation").max_examples),
                        phases=no_shrink)
    return settings(max_examples=max(ci_examples, settings.get_profile("deep").max_examples))


def no_immediate_repeat(output_ids, logits_row):
    """A logits processor: it needs the request's whole output on the host (a host-history
    refusal for the async runner, and no drafts for the request)."""
    if output_ids:
        logits_row[output_ids[-1]] = float("-inf")
    return logits_row


def params(workload: Workload) -> list:
    """The workload's SamplingParams, its host-history requests with `no_immediate_repeat`."""
    return workload.params(no_immediate_repeat)


@st.composite
def workloads(draw, min_reqs: int = 1, max_reqs: int = 8, long_prompts: bool = False,
              min_tokens: int = 1, host_history: bool | None = False,
              max_arrival: int | None = 6, stop_rules: bool = False) -> Workload:
    """A batch of requests for a gate. host_history: False, every request device-fed; True, every
    one needs its host history (a logits processor); None, mixed, with at least one device-fed
    request (a gate that asserts rows were combined on the device must get one: an all-host draw
    turned combine red on the H200) and, with two or more requests, at least one host-history one."""
    n = draw(st.integers(min_reqs, max_reqs))
    pool = LONG_PROMPTS if long_prompts else PROMPTS
    prompts = tuple(draw(st.sampled_from(pool)) for _ in range(n))
    max_tokens = tuple(draw(st.integers(min_tokens, MAX_TOKENS)) for _ in range(n))
    arrivals = tuple(draw(st.integers(0, max_arrival)) for _ in range(n)) if max_arrival else (0,) * n
    if host_history is None:  # mixed: at least one device-fed request, and a host-history one when n > 1
        processors = list(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        fed, held = draw(st.permutations(range(n)))[:2] if n > 1 else (0, None)
        processors[fed] = False
        if held is not None:
            processors[held] = True
        processors = tuple(processors)
    else:
        processors = (host_history,) * n
    if not stop_rules:
        return Workload(prompts, max_tokens, arrivals, processors)
    stops = tuple(tuple(draw(st.lists(st.sampled_from(STOP_TOKENS), max_size=2))) for _ in range(n))
    ignore_eos = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return Workload(prompts, max_tokens, arrivals, processors, stop_token_ids=stops, ignore_eos=ignore_eos)


# Arrivals during decode (prefill refusals), a cache too small for four requests (resumed
# refusals) and a logits-processor request (host-history refusals), all in steps that also
# carry device-fed requests; with max_num_seqs=4 and num_kv_blocks=18.
MIXED_REFUSALS = Workload(prompts=tuple(PROMPTS[i] for i in (7, 6, 2, 3, 5, 1)), max_tokens=(40,) * 6,
                          arrival_steps=(0, 0, 1, 3, 5, 8),
                          host_history=(False, False, False, True, False, False))
MIXED_REFUSALS_ENGINE = dict(max_num_seqs=4, num_kv_blocks=18)

# Requests 1, 2 and 4 carry the whole-history processor chains (gates/processors.py WHOLE_HISTORY),
# beside drafting requests that stop on stop_token_ids mid-verify: with max_num_seqs=4 and
# num_kv_blocks=17 the cache preempts processor requests 2 and 4 in most runs.
WHOLE_HISTORY_WORKLOAD = Workload(prompts=tuple(PROMPTS[i] for i in (6, 2, 7, 3, 4)), max_tokens=(28, 24, 24, 20, 20),
                                  arrival_steps=(0, 0, 1, 0, 2), host_history=(False, True, True, False, True),
                                  stop_token_ids=(tuple(map(ord, "e(")), (), (), tuple(map(ord, "e:")), ()))
WHOLE_HISTORY_ENGINE = dict(max_num_seqs=4, num_kv_blocks=17)


def whole_history_params(workload: Workload) -> list:
    """The workload's SamplingParams, its host-history requests given the WHOLE_HISTORY chains in turn."""
    chains = iter(WHOLE_HISTORY * workload.num_reqs)
    return [replace(p, logits_processors=list(next(chains))) if p.logits_processors else p for p in params(workload)]


# Every state slot taken (request i holds slot i), then requests finish one by one, so graph
# steps of 3 and 1 rows are padded to buckets 4 and 1 while the last slot is still in use.
GRAPH_PADDING = Workload(prompts=tuple(PROMPTS[i] for i in (3, 7, 2, 4)), max_tokens=(8, 16, 24, 40),
                         arrival_steps=(0, 0, 0, 0))
GRAPH_PADDING_ENGINE = dict(max_num_seqs=4, graph=True)

# A context the three long prompts (85, 74 and 73 tokens) reach within MAX_TOKENS while spec
# decoding, the short one (10 tokens) not: finishes by max_model_len beside one by max_tokens.
# KV blocks of 8 tokens, the only gate engine not on the default 16.
# The fifth prompt is given as token ids, one token: a history shorter than every ngram size.
# EOS is ignored, so the context is reached on any target, not only where the model happens not
# to emit an end id first (a random-weight folder lists several).
CONTEXT_LIMIT = Workload(prompts=(*(PROMPTS[i] for i in (6, 2, 4, 0)), (40,)), max_tokens=(MAX_TOKENS,) * 5,
                         arrival_steps=(0, 0, 2, 1, 0), ignore_eos=(True,) * 5)
CONTEXT_LIMIT_ENGINE = dict(max_model_len=96, max_num_seqs=4, block_size=8)  # KV pages of 8, not 16
CONTEXT_ROOM = 11   # tokens past the longest prompt: 85 + 11 = 96 on the fixture's bytes


def context_limit_engine(tokenizer) -> dict:
    """CONTEXT_LIMIT_ENGINE with the context CONTEXT_ROOM tokens past the longest prompt as this
    target's tokenizer encodes it (96 on the fixture), so the long prompts reach it on any target."""
    longest = max(len(p) if not isinstance(p, str) else len(tokenizer.encode(p)) for p in CONTEXT_LIMIT.prompts)
    return {**CONTEXT_LIMIT_ENGINE, "max_model_len": longest + CONTEXT_ROOM}


# Binding scheduler limits: a token budget equal to the context (LIMITS_ROOM tokens past the
# 85-token prompt) and a pool of 11 KV blocks, with max_num_seqs (20) never the one that binds.
# Step 1: two requests verify (2 x (1 + k) = 12 tokens) and the 85-token prompt arrives: 97 > 96,
# so its prefill waits for a verify row to go (a scheduler that counts a verify row as one token
# admits it: 97 tokens, which the staging buffers, 20 x (k + 1) = 120 tokens, still hold). The five
# requests after it grow past the pool, so requests are preempted in both runners. On the CPU the
# graph arm runs its uniform verify steps, padded, and steps with a prefill run eagerly.
LIMITS = Workload(prompts=tuple(PROMPTS[i] for i in (0, 0, 6, 1, 0, 1, 1, 1)),
                  max_tokens=(6, 24, 8, 24, 36, 30, 30, 36), arrival_steps=(0, 0, 1, 3, 2, 4, 2, 2),
                  ignore_eos=(True,) * 8)
LIMITS_ENGINE = dict(max_num_seqs=20, num_kv_blocks=11, num_spec_tokens=5, graph=True)
LIMITS_ROOM = 11   # tokens past the longest prompt: 85 + 11 = 96 on the fixture's bytes


def limits_engine(tokenizer) -> dict:
    """LIMITS_ENGINE with the context and the token budget LIMITS_ROOM tokens past the longest
    prompt as this target's tokenizer encodes it (96 on the fixture)."""
    longest = max(len(tokenizer.encode(p)) for p in LIMITS.prompts)
    return {**LIMITS_ENGINE, "max_model_len": longest + LIMITS_ROOM, "max_num_batched_tokens": longest + LIMITS_ROOM}


@dataclass
class Run:
    """One traced run: what a gate compares. `engine` holds the LLM's keyword arguments."""
    workload: Workload
    engine: dict
    is_async: bool
    outputs: list
    trace: list
    routes: set = field(default_factory=set)
    max_model_len: int = 0
    sampling: list = field(default_factory=list)    # the requests' SamplingParams; empty: params(workload)
    # request id -> the output history each call of its logits processors received, in call order
    # (a HistoryRecorder's), for every request with logits processors
    histories: dict[int, list[list[int]]] = field(default_factory=dict)

    @property
    def sampling_params(self) -> list:
        """The SamplingParams the requests ran with (without the run's history recorders)."""
        return self.sampling or params(self.workload)

    @property
    def final_len(self) -> dict[int, int]:
        return {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in self.outputs}

    @property
    def num_preemptions(self) -> int:
        return sum(o.stats.num_preemptions for o in self.outputs)

    def label(self) -> str:
        keys = ("spec", "num_spec_tokens", "async_runner", "graph", "num_kv_blocks", "max_num_seqs",
                "max_num_batched_tokens")
        return " ".join(f"{k}={self.engine[k]}" for k in keys if k in self.engine)


def run(make_llm, workload: Workload, sampling: list | None = None, observe: Callable | None = None,
        **engine) -> Run:
    """`sampling`: the requests' SamplingParams (default: params(workload)). Every request with
    logits processors also gets a HistoryRecorder, after them; the Run keeps its calls. `observe`
    is called with the LLM before it generates (to install a recorder)."""
    sampling = sampling or params(workload)
    recorders = [HistoryRecorder() if p.logits_processors else None for p in sampling]
    given = [replace(p, logits_processors=[*p.logits_processors, rec]) if rec else p
             for p, rec in zip(sampling, recorders)]
    llm = make_llm(trace=True, **engine)
    if observe is not None:
        observe(llm)
    outputs = llm.generate(workload.prompt_list(), given, arrival_steps=workload.arrivals())
    return Run(workload, engine, llm.is_async, outputs, llm.trace, {s.route for s in llm.trace},
               llm.config.max_model_len, sampling,
               {o.request_id: rec.calls for o, rec in zip(outputs, recorders) if rec is not None})


def run_pair(make_llm, workload: Workload, **engine) -> tuple[Run, Run]:
    """The same workload on the sync runner and on the async runner (veto lifted)."""
    return (run(make_llm, workload, async_runner=False, **engine),
            run(make_llm, workload, async_runner=True, **engine))


def observe_plans(llm, plans: list) -> None:
    """Record each executed plan as (step, arm, number of requests, has a prefill); changes nothing."""
    launch = llm.runner.launch

    def observed(plan, *args, **kwargs):
        plans.append((plan.step, plan.arm, len(plan.requests), any(row.is_prefill for row in plan.real_rows)))
        return launch(plan, *args, **kwargs)
    llm.runner.launch = observed
