"""`specgate gates decide [--bench1b]`, what `make gates` runs: the whole decision in one command.

On a machine with CUDA: every gate on the fixture models on the GPU (`--device cuda`, so each
forward-dependent gate judges the reference and the compiled forward), then with --bench1b the
gates whose figures depend on the model's scale (BENCH1B_GATES) on the 1B benchmark shape (the
seeded random-weight folder, written once to specgate's cache, engine/bench/models.py), then the
veto's verdict over every report, last. Without CUDA: every gate on the CPU, and the verdict,
KEEP with its reasons; --bench1b is noted and skipped (the 1B shape's gates judge a GPU). The exit
status is the gates runs': non-zero when a gate is red or errored; KEEP is informational.
"""
import sys
from dataclasses import dataclass
from pathlib import Path

from gates import report
from gates.registry import GATES, Gate, by_name, has_cuda

BENCH1B_SHAPE, BENCH1B_SEED = "llama-1b", 0
BENCH1B_GATES = ("busy", "speed-ab", "no-sync")


@dataclass(frozen=True)
class DecisionRun:
    """One gates run of the decision, and where its reports go."""
    label: str
    gates: tuple[Gate, ...]
    json_path: Path
    junit_path: Path
    bench1b: bool = False      # on the 1B benchmark folder (written, if missing, just before it runs)


def plan(cuda: bool, bench1b: bool, reports: Path) -> tuple[list[DecisionRun], list[str]]:
    """The runs of the decision and the notes to print about what is left out."""
    runs = [DecisionRun("fixtures", tuple(GATES), reports / "gates.json", reports / "gates.xml")]
    notes = []
    if bench1b and cuda:
        runs.append(DecisionRun(f"the {BENCH1B_SHAPE} benchmark shape", tuple(by_name(list(BENCH1B_GATES))),
                                reports / "gates-1b.json", reports / "gates-1b.xml", bench1b=True))
    elif bench1b:
        notes.append(f"--bench1b: the {BENCH1B_SHAPE} benchmark shape's gates ({', '.join(BENCH1B_GATES)}) judge a "
                     "GPU, and this machine has no CUDA: not run")
    return runs, notes


def bench1b_folder() -> Path:
    """The 1B benchmark folder, written once to specgate's cache ($SPECGATE_CACHE/bench-models)."""
    from engine.bench.models import write_bench_model
    return write_bench_model(BENCH1B_SHAPE, BENCH1B_SEED,
                             progress=lambda m: print(f"specgate: {m}", file=sys.stderr, flush=True))


def cmd_decide(args) -> int:
    from gates import verdict
    from gates.run import run_gates
    cuda = has_cuda()
    device = args.device or ("cuda" if cuda else "cpu")
    runs, notes = plan(cuda, args.bench1b, Path(args.reports))
    Path(args.reports).mkdir(parents=True, exist_ok=True)
    status = 0
    for run in runs:
        print(f"specgate: gates on {run.label}, device {device}", file=sys.stderr, flush=True)
        model = str(bench1b_folder()) if run.bench1b else None
        result = run_gates(list(run.gates), str(run.json_path), str(run.junit_path), model=model, device=device,
                           proven_against=args.proven_against, jobs=args.jobs)
        counts = result.summary
        print(report.table(result.gates))
        print(f"{run.label}: {counts['green']} green, {counts['red']} red, {counts['skipped']} skipped, "
              f"{counts['error']} error in {result.seconds:.0f} s; wrote {run.json_path}")
        status = max(status, result.exit_status)
    for note in notes:
        print(f"specgate: {note}")
    paths = [str(run.json_path) for run in runs]
    v = verdict.decide(verdict.load(paths), report_names=paths)
    for reason in v.reasons:
        print(f"  keep: {reason}")
    print(v.line)
    return status
