"""The gate registry: each gate's name, module, one-line purpose and what it needs.

A gate is one pytest module, gates/<module>.py. `mutation_suite` says whether the mutation runs
(mutants/mutation/mutate.py) use it as part of their suite. Which seeded defects a gate is proven against
is not written here: the defect catalogue (mutants/proof/catalogue.py, a layer above) names the gates
each defect turns red, and the layers that know both join them (the specgate command, prove).
"""
import re
from dataclasses import dataclass
from pathlib import Path

GATES_DIR = Path(__file__).resolve().parent
NEEDS = ("cpu", "cuda")
# engine.config.FORWARDS, named here so the registry, the command's --help and the defect catalogue need no torch
FORWARDS = ("reference", "compiled")
KEBAB_CASE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def check_name(kind: str, name: str) -> None:
    """Gate and defect names are kebab-case: what `specgate gates run NAME` and `prove NAME` take."""
    if not KEBAB_CASE.fullmatch(name):
        raise ValueError(f"{kind} name {name!r} is not kebab-case")


def has_cuda() -> bool:
    """Whether a gate that needs CUDA can run here."""
    import torch
    return torch.cuda.is_available()


@dataclass(frozen=True)
class Gate:
    name: str          # kebab-case, what `specgate gates run NAME` and `make gate NAME=` take
    module: str        # gates/<module>.py
    purpose: str
    needs: str         # "cpu" runs anywhere; "cuda" is skipped, never green, without a GPU
    path: Path | None = None  # where the module lives when it is not under gates/ (tests only)
    # Part of the mutation runs' suite: a gate that judges one run exactly and needs no CUDA
    # (a timed or CUDA gate would read a mutant's slowness or this machine as a kill or a survivor).
    mutation_suite: bool = False
    # Measures time or the device's busy level: `gates run --jobs N` runs it alone, after the
    # other gates, so no other gate's process shares the cores while it measures.
    timed: bool = False
    # Its verdict depends on the forward the engine runs (the reference modules or the fused one
    # compiled by inductor): on CUDA each of its engine-building tests runs once per forward the
    # session judges (the `forward` axis, gates/conftest.py), and the veto's verdict needs both.
    forward_axis: bool = False

    def __post_init__(self):
        check_name("gate", self.name)
        if self.needs not in NEEDS:
            raise ValueError(f"gate {self.name}: needs must be one of {NEEDS}, got {self.needs!r}")

    @property
    def file(self) -> Path:
        return self.path or GATES_DIR / f"{self.module}.py"


GATES = (
    Gate("lossless", "lossless", "G1: greedy spec output equals plain greedy token for token (both drafters, "
         "both runners, eager and graph arm); sampled output passes a chi-square test against the target, "
         "and a lossy verify fails it", "cpu", mutation_suite=True, forward_axis=True),
    Gate("combine", "combine", "G2: per step and request, the async runner's device inputs (ids, positions, "
         "sequence length, logits window) equal the sync runner's", "cpu", mutation_suite=True,
         forward_axis=True),
    Gate("emit-count", "emit_count", "per step and request, async emit counts equal sync's, every run's "
         "trace agrees with its tokens and metrics, greedy acceptance equals what the drafts imply, and the "
         "compiled forward emits what the reference forward emits",
         "cpu", mutation_suite=True, forward_axis=True),
    Gate("reason-a", "reason_a", "on every verify step, eager and graph arm, each request's logits window "
         "starts at its query start and covers its drafts + 1 rows", "cpu", mutation_suite=True,
         forward_axis=True),
    Gate("predicate-split", "predicate_split", "batches where refused (prefill, resumed, host history) and "
         "device-fed requests share a step: async equals sync in tokens and emit counts", "cpu", mutation_suite=True,
         forward_axis=True),
    Gate("depth", "depth", "requests from the start of the context to 4,072 positions on a decisive random "
         "folder (8,232 under --deep; on CUDA the 1B shape to 33,808, past 32,768): async spec tokens equal plain "
         "at every depth, the oracle drafter's tokens per verify step stay at the level asked for in every depth "
         "bucket, the ngram drafter's are reported, and on CUDA a plain step grows no faster than its KV read", "cpu"),
    Gate("acceptance", "acceptance", "the bench's per-leg acceptance equals the trace's in vLLM and SGLang "
         "units, and at drawn leg and warm-up counts both axes fold exactly the warm legs", "cpu"),
    Gate("speed-ab", "speed_ab", "G3: TPOT and output throughput, sync against async, eager and graph arm, at "
         "concurrency 1 and 8, runners interleaved; a delta under the runners' spread is reported as under "
         "the floor (CPU: a smoke run; the verdict reads the graph arm on CUDA)", "cpu", timed=True,
         forward_axis=True),
    Gate("busy", "busy", "G4: the busy level of the decode window, eager and graph arm, async and sync; the "
         "async graph arm's level without the profiler must reach --busy-threshold, the sync runner's must not, "
         "and async must beat sync beyond a bootstrap floor", "cuda", timed=True,
         forward_axis=True),
    Gate("oracle", "oracle", "transformers itself as the reference: greedy tokens equal its argmax on the fixture "
         "target and random Llama 3- and Llama 2-style folders, float32 and bfloat16 (judged above bfloat16 "
         "rounding, past 1,000 positions, mixed-length batch); tokenizer ids equal AutoTokenizer's per layout; "
         "generation defaults equal its generate", "cpu"),
    Gate("no-sync", "no_sync", "the whole async decode loop (schedule to commit) makes no host read beyond "
         "the engine's declared waits: a host-read hook everywhere, and on CUDA "
         "torch.cuda.set_sync_debug_mode('error') around each step; eager and graph arm", "cpu", forward_axis=True),
)


def by_name(names: list[str] | None = None) -> list[Gate]:
    """The gates named, in registry order when none are; an unknown name raises KeyError."""
    known = {g.name: g for g in GATES}
    if not names:
        return list(GATES)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise KeyError(f"unknown gate(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in names]


def gate_of_file(path: str | Path, gates=GATES) -> Gate | None:
    path = Path(path).resolve()
    return next((g for g in gates if g.file.resolve() == path), None)

