"""The gates' workloads: prompts, Hypothesis strategies for batch compositions (`None` means
"let Hypothesis choose"), the deterministic mixes some gates need, and one traced run.

Hypothesis examples per test come from the loaded profile: the bounded `ci` count a gate asks
for, or the `deep` profile's count under HYPOTHESIS_PROFILE=deep (`specgate gates run --deep`).
"""
import os
from dataclasses import dataclass, field

from hypothesis import Phase, settings
from hypothesis import strategies as st

from engine import SamplingParams

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


@dataclass(frozen=True)
class Workload:
    prompts: tuple[str, ...]
    max_tokens: tuple[int, ...]
    arrival_steps: tuple[int, ...]
    host_history: tuple[bool, ...] = ()     # requests with a logits processor
    temperature: float = 0.0
    seeds: tuple[int, ...] = ()

    @property
    def num_reqs(self) -> int:
        return len(self.prompts)

    def params(self) -> list[SamplingParams]:
        processors = self.host_history or (False,) * self.num_reqs
        seeds = self.seeds or (None,) * self.num_reqs
        return [SamplingParams(temperature=self.temperature, max_tokens=m, seed=s,
                               logits_processors=[no_immediate_repeat] if p else [])
                for m, p, s in zip(self.max_tokens, processors, seeds)]


@st.composite
def workloads(draw, min_reqs: int = 1, max_reqs: int = 8, long_prompts: bool = False,
              min_tokens: int = 1, host_history: bool | None = False,
              max_arrival: int | None = 6) -> Workload:
    n = draw(st.integers(min_reqs, max_reqs))
    pool = LONG_PROMPTS if long_prompts else PROMPTS
    prompts = tuple(draw(st.sampled_from(pool)) for _ in range(n))
    max_tokens = tuple(draw(st.integers(min_tokens, MAX_TOKENS)) for _ in range(n))
    arrivals = tuple(draw(st.integers(0, max_arrival)) for _ in range(n)) if max_arrival else (0,) * n
    if host_history is None:
        processors = tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    else:
        processors = (host_history,) * n
    return Workload(prompts, max_tokens, arrivals, processors)


# Arrivals during decode (prefill refusals), a cache too small for four requests (resumed
# refusals) and a logits-processor request (host-history refusals), all in steps that also
# carry device-fed requests; with max_num_seqs=4 and num_kv_blocks=18.
MIXED_REFUSALS = Workload(prompts=tuple(PROMPTS[i] for i in (7, 6, 2, 3, 5, 1)), max_tokens=(40,) * 6,
                          arrival_steps=(0, 0, 1, 3, 5, 8),
                          host_history=(False, False, False, True, False, False))
MIXED_REFUSALS_ENGINE = dict(max_num_seqs=4, num_kv_blocks=18)

# Every state slot taken (request i holds slot i), then requests finish one by one, so graph
# steps of 3 and 1 rows are padded to buckets 4 and 1 while the last slot is still in use.
GRAPH_PADDING = Workload(prompts=tuple(PROMPTS[i] for i in (3, 7, 2, 4)), max_tokens=(8, 16, 24, 40),
                         arrival_steps=(0, 0, 0, 0))
GRAPH_PADDING_ENGINE = dict(max_num_seqs=4, graph=True)


@dataclass
class Run:
    """One traced run: what a gate compares. `engine` holds the LLM's keyword arguments."""
    workload: Workload
    engine: dict
    is_async: bool
    outputs: list
    trace: list
    routes: set = field(default_factory=set)

    @property
    def final_len(self) -> dict[int, int]:
        return {o.request_id: len(o.prompt_token_ids) + len(o.token_ids) for o in self.outputs}

    @property
    def num_preemptions(self) -> int:
        return sum(o.stats.num_preemptions for o in self.outputs)

    def label(self) -> str:
        keys = ("spec", "num_spec_tokens", "async_runner", "graph", "num_kv_blocks", "max_num_seqs")
        return " ".join(f"{k}={self.engine[k]}" for k in keys if k in self.engine)


def run(make_llm, workload: Workload, **engine) -> Run:
    llm = make_llm(trace=True, **engine)
    outputs = llm.generate(list(workload.prompts), workload.params(), arrival_steps=list(workload.arrival_steps))
    return Run(workload, engine, llm.is_async, outputs, llm.trace, {s.route for s in llm.trace})


def run_pair(make_llm, workload: Workload, **engine) -> tuple[Run, Run]:
    """The same workload on the sync runner and on the async runner (veto lifted)."""
    return (run(make_llm, workload, async_runner=False, **engine),
            run(make_llm, workload, async_runner=True, **engine))


def observe_plans(llm, plans: list) -> None:
    """Record each executed plan as (step, arm, number of requests, has a prefill); changes nothing."""
    execute = llm.runner.execute

    def observed(plan):
        plans.append((plan.step, plan.arm, len(plan.requests), any(row.is_prefill for row in plan.real_rows)))
        return execute(plan)
    llm.runner.execute = observed
