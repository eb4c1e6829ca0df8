"""`specgate prove --gate-mutants [--sample N] [--seed S] [--module FILE ...] [--time-limit S]
[--report FILE]`: the proof as a mutation suite of the gates' checking code.

A mutant of the checking code (gates/compare.py, invariants.py, distribution.py, measure.py,
acceptance.py: mutmut's own mutants, as `specgate mutate` lists them) that leaves every judgement
of the proof unchanged is a gate weakness the proof does not see. One pass:

    stage the mutation suite and list mutmut's mutants (mutants/mutation/) -> draw N of the gates'
    checking mutants uniformly with a fixed seed -> the mutation suite's verdict on each (mutmut's
    cache, or `mutmut run` on them) -> per mutant, in an order shuffled by the seed: the gates
    that can run its function (gate_reach.py), a copy of the tree with the mutant planted, and
    the proof's trees there: the clean tree, a tree a gate (each must stay green), and each
    defect naming one of those gates (those must go red) -> killed at the first changed
    judgement -> until the time limit -> report (gate_mutant_report.py)

A mutant no gate runnable here reaches is *not reached* (a survivor no tree could judge: busy's
checks on a machine without CUDA). A tree that times out decides nothing: a mutant with no kill
and a timeout is *undecided*, never counted as killed; one the time limit interrupts is not
judged at all. Each tree stops its gates at their first failed check (`--stop-at-red`): red is
all a tree's judgement reads. Defects claimed token-invisible are not re-checked for lossless
staying green (the kill is a gate that goes red where it must not, or stays green where it must
go red).
"""
import random
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from gates import timings
from gates.registry import GATES, has_cuda
from gates.report import GREEN, RED
from mutants.mutation.results import load_equivalents, read_results, valid_cached
from mutants.mutation.run import git, run_mutmut
from mutants.mutation.shard import bounded, list_mutants
from mutants.mutation.stage import MUTATED_GATES, STAGING, SUITE, stage
from mutants.proof import gate_mutant_report as report
from mutants.proof.apply import copy_tree
from mutants.proof.catalogue import DEFECTS, Defect
from mutants.proof.gate_mutant_report import KILLED, NOT_REACHED, SURVIVED, UNDECIDED, Measurement, MutantVerdict
from mutants.proof.gate_reach import reached
from mutants.proof.matrix import CLEAN, RAN, TIMEOUT, TreeRun
from mutants.proof.mutant_source import MutantSource, module_path, mutant_sources
from mutants.proof.prover import Prover, ending_on_signals, gate_command

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SAMPLE, DEFAULT_SEED = 24, 0
DEFAULT_TIME_LIMIT_S = 1200  # the whole measurement; a mutant whose function emit-count reaches costs ~19 trees
DEFAULT_TIMEOUT_S = 300  # one tree's gate run; a stop-at-red run of a defect's gates takes seconds


def gate_files(gate_needs: dict[str, str], cuda: bool) -> dict[str, str]:
    """The gates that can run here -> their module files (relative to the repository)."""
    return {g.name: g.file.relative_to(REPO).as_posix() for g in GATES
            if g.name in gate_needs and (gate_needs[g.name] != "cuda" or cuda)}


def reaching(mutant: MutantSource, files: dict[str, str], repo: Path = REPO) -> list[str]:
    """The gates (of `files`, name -> module) whose run can execute the mutant's function."""
    return [g for g, rel in files.items() if mutant.function in reached(rel, repo).get(mutant.path, set())]


def mutant_trees(gates: list[str], defects: list[Defect], cuda: bool, device: str = "cpu",
                 seconds: dict[str, float] | None = None) -> list[tuple[str, Defect | None, list[str], str]]:
    """The proof's trees a mutant reaching `gates` can change, as (label, defect, gates, device):
    the clean tree first, one tree a gate (a gate the mutant breaks goes red there at its first
    check, and its tree ends without waiting for the others), then each defect naming one of
    them, with those; each part cheapest first by the gates' last seconds."""
    seconds = timings.load() if seconds is None else seconds
    clean = [(f"{CLEAN} {g}", None, [g], device) for g in gates]
    trees = []
    for d in defects:
        names = [g for g in gates if g in d.gates]
        if names and (d.needs != "cuda" or cuda):
            trees.append((d.name, d, names, "cuda" if d.needs == "cuda" else device))

    def cost(tree):
        return sum(timings.estimate(g, seconds) for g in tree[2])
    return sorted(clean, key=cost) + sorted(trees, key=cost)


def tree_kill(run: TreeRun, defect: Defect | None, gates: list[str]) -> str | None:
    """Why a tree's run changes the proof's judgement (it kills the mutant), or None: on the clean
    tree a gate not green, on a defect's a gate it names not red, or a tree that could not run.
    A timeout is no kill."""
    if run.status == TIMEOUT:
        return None
    if run.status != RAN:
        return f"{run.tree}: {run.status}"
    for g in gates:
        status = run.cell(g)
        if defect is None and status != GREEN:
            return f"{CLEAN}: {g} {status or 'not run'}"
        if defect is not None and status != RED:
            return f"{defect.name}: {g} {status or 'not run'}, not red"
    return None


def tree_command(names: list[str], json_path: Path, device: str, stop_at_red: bool) -> list[str]:
    """A tree's gate run. Every tree, the clean one too, stops each gate at its first failed check:
    a mutant's judgement reads only whether a gate went red. A tree of one gate also ends at its
    first failed or errored test (pytest's --exitfirst: a mutant that makes a check raise errors
    every test of the gate, which --stop-at-red, reading failed checks only, would all run); a
    tree of several must run each, since a gate left unrun would read as a kill."""
    command = gate_command(names, json_path, device, stop_at_red=True)
    return ["env", "PYTEST_ADDOPTS=--exitfirst", *command] if len(names) == 1 else command


def prove_mutant(mutant: MutantSource, trees: list[tuple], snapshot: Path, work: Path, jobs: int,
                 timeout_s: float, command=tree_command, deadline: float | None = None) -> tuple[str, str, int] | None:
    """Plant the mutant in a copy of `snapshot` and run `trees` (mutant_trees) there, `jobs` at
    once, until one kills it: (verdict, what killed it or timed out, trees finished); None when
    the `deadline` (time.perf_counter()) came first and ended its runs: not judged."""
    base = work / "mutant"
    shutil.copytree(snapshot, base, symlinks=True)
    (base / mutant.path).write_text(mutant.source)
    prover = Prover(jobs, timeout_s, command)
    out_of_time = threading.Event()

    def stop_at_deadline():
        out_of_time.set()
        prover.stop()
    timer = threading.Timer(max(0.0, deadline - time.perf_counter()), stop_at_deadline) if deadline else None
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    verdict, by, finished, timed_out = SURVIVED, "", 0, []
    try:
        if timer:
            timer.start()
        futures = {pool.submit(prover.run_tree, base, work, label, defect, names, device): (defect, names)
                   for label, defect, names, device in trees}
        for future in as_completed(futures):
            run = future.result()
            if out_of_time.is_set():
                break  # a run ended by the deadline tells nothing
            finished += 1
            if run.status == TIMEOUT:
                timed_out.append(run.tree)
            reason = tree_kill(run, *futures[future])
            if reason:
                verdict, by = KILLED, reason
                break
    finally:
        if timer:
            timer.cancel()
        prover.stop()  # the first kill decides: what still runs is ended, what waits never starts
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(base, ignore_errors=True)
    if out_of_time.is_set() and verdict != KILLED:
        return None
    if verdict == SURVIVED and timed_out:
        verdict, by = UNDECIDED, f"timed out: {', '.join(timed_out)}"
    return verdict, by, finished


def suite_verdicts(names: list[str], max_children: int, log_path: Path) -> dict[str, tuple[str, str | None]]:
    """name -> (the mutation suite's status, its reviewed reason if equivalent-mutants.toml has one):
    from mutmut's cache in the staging folder where it holds a verdict for the code as it is, else
    from `mutmut run` on the rest (a staged suite already; list_mutants has listed them)."""
    hashes = list_mutants(STAGING)
    todo = [n for n in names if n not in valid_cached(hashes, STAGING)]
    if todo:
        print(f"gate-mutants: the mutation suite on {len(todo)} mutants (mutmut, {max_children} children; "
              f"{len(names) - len(todo)} from its cache)", file=sys.stderr, flush=True)
        rc, _ = run_mutmut(todo, max_children, log_path, STAGING)
        if rc:
            print(f"gate-mutants: mutmut exited {rc}; see {log_path}", file=sys.stderr)
    records = read_results([], load_equivalents(), STAGING, names=set(names))
    return {r.name: (r.status, r.equivalent) for r in records}


def listed(modules: tuple[str, ...]) -> list[str]:
    """mutmut's mutants of the gates' checking code in `modules` (the suite staged first, since the
    listing mutates the staged sources; cached by their digest)."""
    reset = stage(STAGING, SUITE)
    if reset:
        print(f"gate-mutants: the suite changed since the cached run: {reset} verdicts other than kills reset",
              file=sys.stderr)
    return sorted(n for n in list_mutants(STAGING) if module_path(n) in modules)


def run_gate_mutants(sample_size: int, seed: int, modules: tuple[str, ...], jobs: int, timeout_s: float,
                     log_path: Path, device: str = "cpu", time_limit_s: float | None = None) -> Measurement:
    """The whole measurement. The drawn mutants are judged in an order shuffled by the seed, so the
    ones judged before the time limit stopped it are a uniform sample too."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s if time_limit_s else None
    names = listed(modules)
    sample, _ = bounded(names, sample_size, seed)
    order = random.Random(seed).sample(sample, len(sample))
    sources = mutant_sources(sample, REPO)
    print(f"gate-mutants: {len(sample)} of {len(names)} listed mutants of {', '.join(modules)} drawn (seed {seed}) "
          f"in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    t1 = time.perf_counter()
    suite = suite_verdicts(sample, jobs, log_path)
    print(f"gate-mutants: the mutation suite's verdicts in {time.perf_counter() - t1:.0f} s; now the proof, "
          f"a mutant at a time", file=sys.stderr, flush=True)
    cuda = has_cuda()
    files = gate_files({g.name: g.needs for g in GATES}, cuda)
    m = Measurement([], len(names), len(sample), seed)
    with tempfile.TemporaryDirectory(prefix="specgate-gate-mutants-") as tmp:
        snapshot = copy_tree(REPO, Path(tmp) / "snapshot")
        for i, name in enumerate(order, 1):
            if deadline and time.perf_counter() >= deadline:
                m.stopped = True
                break
            mutant, t1 = sources[name], time.perf_counter()
            v = MutantVerdict(name, mutant.path, reaching(mutant, files), diff=mutant.diff)
            v.suite, v.equivalent = suite.get(name, ("not checked", None))
            trees = mutant_trees(v.gates, list(DEFECTS), cuda, device)
            if not trees:
                v.proof, v.by = NOT_REACHED, "no gate runnable here runs its function"
            else:
                work = Path(tmp) / f"m{i}"
                work.mkdir()
                judged = prove_mutant(mutant, trees, snapshot, work, jobs, timeout_s, deadline=deadline)
                shutil.rmtree(work, ignore_errors=True)
                if judged is None:
                    m.stopped = True
                    break
                v.proof, v.by, v.trees = judged
            v.seconds = round(time.perf_counter() - t1, 1)
            m.verdicts.append(v)
            print(f"gate-mutants: [{i}/{len(order)}] {name}: proof {v.proof}"
                  + (f" ({v.by})" if v.by else "") + f", {v.trees} of {len(trees)} trees in {v.seconds:.0f} s; "
                  f"suite {v.suite} ({time.perf_counter() - t0:.0f} s so far)", flush=True)
    if m.stopped:
        print(f"gate-mutants: stopped at the time limit ({time_limit_s:g} s): {len(m.verdicts)} of the {len(order)} "
              f"drawn judged, the first of the seeded order", file=sys.stderr, flush=True)
    m.verdicts.sort(key=lambda v: v.name)
    m.wall_s = time.perf_counter() - t0
    return m


# ---- command line (`specgate prove --gate-mutants`, mutants/proof/prove.py) ------------------------
def add_gate_mutant_args(p) -> None:
    from gates.argtypes import float_in, int_at_least, output_file
    g = p.add_argument_group("gate mutants (--gate-mutants)")
    g.add_argument("--gate-mutants", action="store_true",
                   help="the proof as a mutation suite of the gates' checking code: for N of mutmut's mutants of it, "
                   "whether the clean tree's gates stay green and each defect's go red (docs/proof.md)")
    g.add_argument("--sample", type=int_at_least(1), default=None, metavar="N",
                   help=f"mutants drawn uniformly (default {DEFAULT_SAMPLE})")
    g.add_argument("--seed", type=int, default=None, metavar="S", help=f"the draw's seed (default {DEFAULT_SEED})")
    g.add_argument("--module", action="append", default=None, choices=MUTATED_GATES, metavar="FILE",
                   help="draw only mutants of this file (repeatable): " + ", ".join(MUTATED_GATES))
    g.add_argument("--time-limit", type=float_in(0.0, lo_open=True), default=None, metavar="S",
                   help=f"judge no new mutant after S seconds, and end the one in progress (default "
                   f"{DEFAULT_TIME_LIMIT_S:g}); the drawn mutants are judged in a seeded random order, so those "
                   "judged are a uniform sample too")
    g.add_argument("--report", type=output_file, default=None, metavar="FILE",
                   help="the Markdown report (default reports/gate-mutants.md)")


def flags_given(args) -> list[str]:
    """The --gate-mutants options given on the command line."""
    return [flag for flag, value in (("--sample", args.sample), ("--seed", args.seed), ("--module", args.module),
                                     ("--time-limit", args.time_limit), ("--report", args.report))
            if value is not None]


def cmd_gate_mutants(args) -> int:
    given = [flag for flag, value in (("DEFECT", args.defects), ("--json", args.json), ("--markdown", args.markdown),
                                      ("--html", args.html), ("--full", args.full)) if value]
    if given:
        print(f"specgate: error: --gate-mutants takes no {', '.join(given)}: it judges every defect whose gates "
              f"a mutant reaches and writes --report", file=sys.stderr)
        return 2
    sample = args.sample or DEFAULT_SAMPLE
    seed = DEFAULT_SEED if args.seed is None else args.seed
    limit = args.time_limit or DEFAULT_TIME_LIMIT_S
    modules = tuple(args.module or MUTATED_GATES)
    page = Path(args.report or REPO / "reports" / "gate-mutants.md")
    page.parent.mkdir(parents=True, exist_ok=True)
    try:
        with ending_on_signals():
            m = run_gate_mutants(sample, seed, modules, args.jobs, args.timeout or DEFAULT_TIMEOUT_S,
                                 page.with_suffix(".mutmut.log"), args.device, limit)
    except KeyboardInterrupt:
        print("specgate: prove --gate-mutants interrupted; its runs were ended and its temporary folder removed",
              file=sys.stderr)
        return 130
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 1
    m.command = " ".join(["specgate prove --gate-mutants", f"--sample {sample}", f"--seed {seed}",
                          *(f"--module {mod}" for mod in args.module or ()), f"--time-limit {limit:g}",
                          f"--jobs {args.jobs}"])
    m.commit = git(["rev-parse", "--short", "HEAD"], REPO).strip()
    page.write_text(report.markdown(m), encoding="utf-8")
    print(f"wrote {page}")
    print(report.final_line(m))
    return 0
