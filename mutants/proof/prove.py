"""`specgate prove [DEFECT ...] [--json FILE] [--markdown FILE] [--full] [--jobs N]`
(also `python -m mutants.proof.prove`): every gate shown red on a planted defect, and green on the
clean tree.

One pass:

    snapshot the tree -> check every patch applies -> per tree (clean, each defect), in parallel:
    copy the snapshot, plant the defect, run the gates there (mutants/proof/prover.py) -> Proof (the
    matrix and its judgement, mutants/proof/matrix.py) -> tables and reports

Each defect's copy runs the gates it names, plus lossless when the defect claims to leave every
token unchanged (so that claim is checked, not assumed); --full runs every gate there. The clean
copy runs every gate. Everything is written under one temporary folder, removed at the end even
when interrupted; the working tree is only read.
"""
import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from gates import timings
from gates.argtypes import device, float_in, int_at_least, output_file
from gates.registry import GATES, has_cuda
from mutants.proof import gate_mutants, matrix
from mutants.proof import html as proof_html
from mutants.proof.apply import StalePatch, copy_tree, patched_files
from mutants.proof.catalogue import Defect, by_name
from mutants.proof.matrix import CLEAN, NEEDS_CUDA, RAN, STALE, Proof, TreeRun
from mutants.proof.prover import Prover, ending_on_signals, gate_command

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 900


@dataclass(frozen=True)
class ProveOptions:
    """What a proof is asked to do (`specgate prove`'s options)."""
    jobs: int = 2                    # trees proven in parallel
    full: bool = False               # every gate on every defect, not only those it names (+ lossless)
    device: str = "cpu"              # device the CPU gates run the engine on; CUDA defects run on cuda
    timeout_s: float = DEFAULT_TIMEOUT_S  # one tree's gate run; a timeout fails
    progress: bool = True            # a progress bar on a terminal
    complete: bool = True            # the whole catalogue was asked for: an unproven gate fails


def gates_for(defect: Defect, all_gates: list[str], full: bool) -> list[str]:
    """The gates a defect's copy runs, in registry order: those it names, and lossless when it
    claims every token unchanged; every gate with --full."""
    if full:
        return list(all_gates)
    return [g for g in all_gates if g in defect.gates or (g == "lossless" and defect.token_invisible)]


def stale_check(defects: list[Defect], base: Path) -> dict[str, str]:
    """defect name -> why it no longer applies to the snapshot, for each stale defect."""
    def read(rel):
        path = base / rel
        return path.read_text() if path.is_file() else None
    stale = {}
    for d in defects:
        try:
            if not d.patch.is_file():
                raise StalePatch(f"no patch file {d.patch.relative_to(REPO)}")
            patched_files(d.patch.read_text(), read)
        except (StalePatch, ValueError) as e:
            stale[d.name] = str(e)
    return stale


def schedule(tasks: list[tuple], seconds: dict[str, float]) -> list[tuple]:
    """Trees (label, defect, gate names, device, forwards) in the order they start: the longest first, by
    the sum of their gates' last measured seconds (gates/timings.py: build/gate-seconds.json, else
    a static estimate), so the long trees do not start last and leave one job running alone at the
    end. Ties keep the catalogue's order."""
    return sorted(tasks, key=lambda t: -sum(timings.estimate(g, seconds) for g in t[2]))


def clean_parts(gates: list[str], jobs: int, seconds: dict[str, float]) -> list[tuple[str, list[str]]]:
    """The clean tree's gates as (label, gates) tasks: one, or with several jobs as many parts,
    balanced by the gates' last seconds, so the clean tree (every gate) is not one long task that
    the others wait on."""
    if jobs <= 1 or len(gates) <= 1:
        return [(CLEAN, list(gates))]
    parts = timings.balance(((g, timings.estimate(g, seconds)) for g in gates), jobs)
    order = {g: i for i, g in enumerate(gates)}
    return [(f"{CLEAN} part {i + 1} of {len(parts)}", sorted(part, key=order.get)) for i, part in enumerate(parts)]


def merge_clean(parts: list[TreeRun]) -> TreeRun:
    """One clean-tree run from its parts: every gate's result; not RAN if a part did not run;
    its seconds the sum of the parts' (the gate time it cost)."""
    if len(parts) == 1 and parts[0].tree == CLEAN:
        return parts[0]
    failed = next((p for p in parts if p.status != RAN), None)
    gates = {g: r for p in parts for g, r in p.gates.items()}
    detail = "\n".join(f"{p.tree}: {p.detail}" for p in parts if p.detail)
    return TreeRun(CLEAN, failed.status if failed else RAN, gates, round(sum(p.seconds for p in parts), 1), detail)


def prove(defects: list[Defect], options: ProveOptions = ProveOptions(), *, repo: Path = REPO,
          cuda: bool | None = None, command=gate_command, gate_needs: dict[str, str] | None = None,
          timed: set[str] | None = None) -> Proof:
    """Run the proof of `defects` on a snapshot of `repo`. The rest are seams for tests: `cuda`
    (default: whether this machine has it), `command` (the gate run of one tree), `gate_needs`
    (gate -> 'cpu'/'cuda', registry order; default the registry's) and `timed` (the gates that run
    alone; default the registry's timed gates)."""
    if gate_needs is None:
        gate_needs = {g.name: g.needs for g in GATES}
    if timed is None:
        timed = {g.name for g in GATES if g.timed}
    cuda = has_cuda() if cuda is None else cuda
    jobs, device = options.jobs, options.device
    all_gates = list(gate_needs)
    t0 = time.perf_counter()
    prover = Prover(jobs, options.timeout_s, command)
    runs: dict[str, TreeRun] = {}
    with tempfile.TemporaryDirectory(prefix="specgate-prove-") as tmp:
        work = Path(tmp)
        base = copy_tree(repo, work / "snapshot")
        stale = stale_check(defects, base)
        seconds = timings.load()
        planted = []
        for d in defects:
            if d.name in stale:
                runs[d.name] = TreeRun(d.name, STALE, detail=stale[d.name])
            elif d.needs == "cuda" and not cuda:
                runs[d.name] = TreeRun(d.name, NEEDS_CUDA, detail="needs CUDA; this machine has none")
            else:
                planted.append((d.name, d, gates_for(d, all_gates, options.full),
                                "cuda" if d.needs == "cuda" else device, d.judged_forwards))
        # The clean tree judges every forward a defect's tree judges: what goes red there must be green here.
        clean_forwards = max((t[4] for t in planted), key=len, default=())
        tasks = [(label, None, part, device, clean_forwards) for label, part in clean_parts(all_gates, jobs, seconds)]
        tasks += planted
        tasks = schedule(tasks, seconds)  # the longest first
        # Timed gates (speed, busy) would measure the other trees' load: they run in a second
        # phase, one at a time and each in a process of its own (on the H200 busy's graph-arm level
        # read 0.52 to 0.61 in a fresh process and 0.38 to 0.43 after speed-ab in the same one);
        # their results join the tree's first-phase run.
        parallel = [(label, d, [g for g in names if g not in timed], dev, fw)
                    for label, d, names, dev, fw in tasks]
        alone = [(label, d, [g], dev, fw) for label, d, names, dev, fw in tasks for g in names if g in timed]
        phases = [([t for t in parallel if t[2]], jobs), ([t for t in alone if t[2]], 1)]
        total = sum(len(p) for p, _ in phases)
        bar = _progress(total, options.progress)
        lines = options.progress and bar is not None and bar.disable  # not a terminal: a line per run
        done = 0
        try:
            for phase, workers in phases:
                for run in _run_phase(prover, base, work, phase, workers):
                    runs[run.tree] = join_runs(runs.get(run.tree), run)
                    done += 1
                    if bar is not None:
                        bar.set_postfix_str(f"{run.tree}: {_summary(run)}")
                        bar.update(1)
                    if lines:
                        print(f"prove: [{done}/{total}] {run.tree}: {_summary(run)} ({run.seconds:.0f} s)",
                              file=sys.stderr, flush=True)
        finally:
            if bar is not None:
                bar.close()
    parts = [runs.pop(label) for label in [label for label in runs if label.startswith(CLEAN)]]
    clean = merge_clean(parts) if parts else None
    if clean is not None and clean.status == RAN and command is gate_command and repo == REPO:
        # the clean tree ran every gate unplanted: its seconds order the next proof's trees
        timings.record({g: r.seconds for g, r in clean.gates.items() if r.status != matrix.SKIPPED})
    return matrix.build_proof(defects, runs, clean, gate_needs, cuda, options.complete, time.perf_counter() - t0)


def _run_phase(prover: Prover, base: Path, work: Path, tasks: list, workers: int):
    """Run `tasks` (label, defect, gate names, device, forwards) on `workers` threads; yield each TreeRun."""
    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = [pool.submit(prover.run_tree, base, work, *task) for task in tasks]
        for future in as_completed(futures):
            yield future.result()
    except BaseException:
        prover.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def join_runs(first: TreeRun | None, second: TreeRun) -> TreeRun:
    """One tree's two phases as one run: the gates of both; the worse status; both details."""
    if first is None:
        return second
    status = first.status if first.status != RAN else second.status
    detail = "\n".join(d for d in (first.detail, second.detail) if d)
    return TreeRun(first.tree, status, {**first.gates, **second.gates}, round(first.seconds + second.seconds, 1),
                   detail)


def _progress(total: int, enabled: bool):
    from tqdm import tqdm
    return tqdm(total=total, unit="tree", desc="prove", disable=not (enabled and sys.stderr.isatty()))


def _summary(run: TreeRun) -> str:
    if run.status != RAN:
        return run.status
    reds = [g for g, r in run.gates.items() if r.status == matrix.RED]
    return f"red: {', '.join(reds) or 'none'}"


# ---- command line ---------------------------------------------------------------------------------
def add_prove_parser(subparsers) -> None:
    p = subparsers.add_parser("prove", help="plant each seeded defect in a copy of the tree and show "
                              "the gates it names go red, and every gate green on the clean tree")
    p.add_argument("defects", nargs="*", metavar="DEFECT", help="defects to plant (default: all)")
    p.add_argument("--json", type=output_file, default=None, metavar="FILE",
                   help="write the matrix and judgement as JSON")
    p.add_argument("--markdown", type=output_file, default=None, metavar="FILE", help="write the matrix as Markdown")
    p.add_argument("--html", type=output_file, default=None, metavar="FILE",
                   help="write the matrix as a self-contained HTML page, each cell linked to its evidence "
                   "(default: beside --json or --markdown, as prove.html)")
    p.add_argument("--full", action="store_true", help="run every gate on every defect, not only the "
                   "ones it names plus lossless")
    p.add_argument("--jobs", type=int_at_least(1), default=2, metavar="N", help="trees proven in parallel (default 2)")
    p.add_argument("--device", type=device, default="cpu", help="device the CPU gates run the engine on (default cpu); "
                   "defects that need CUDA always run on cuda")
    p.add_argument("--timeout", type=float_in(0.0, lo_open=True), default=None, metavar="S",
                   help=f"seconds one tree's gate run may take; a timeout fails (default {DEFAULT_TIMEOUT_S}; "
                   f"{gate_mutants.DEFAULT_TIMEOUT_S} with --gate-mutants)")
    gate_mutants.add_gate_mutant_args(p)
    p.set_defaults(func=cmd_prove)


def cmd_prove(args) -> int:
    if args.gate_mutants:
        return gate_mutants.cmd_gate_mutants(args)
    if stray := gate_mutants.flags_given(args):
        print(f"specgate: error: {', '.join(stray)} go with --gate-mutants", file=sys.stderr)
        return 2
    try:
        defects = by_name(args.defects)
    except KeyError as e:
        print(f"specgate: error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("specgate: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    options = ProveOptions(args.jobs, args.full, args.device, args.timeout or DEFAULT_TIMEOUT_S,
                           complete=not args.defects)
    try:
        with ending_on_signals():
            proof = prove(defects, options)
    except KeyboardInterrupt:
        print("specgate: prove interrupted; its gate runs were ended and its temporary folder removed",
              file=sys.stderr)
        return 130
    flags = "".join(f" {f}" for f in (" ".join(args.defects), "--full" if args.full else "") if f)
    meta = {"args": flags, "wall_s": round(proof.wall_s, 1), "jobs": args.jobs, "full": args.full,
            "device": args.device, "complete": not args.defects}
    v, wall = proof.judgement, proof.wall_s
    print(matrix.text_table(proof))
    print("\n" + matrix.LEGEND)
    for title, items in (("problems", v.problems), ("notes", v.notes)):
        if items:
            print(f"\n{title}:\n" + "\n".join(f"  - {p}" for p in items))
    print("\ngate time over all trees: " + ", ".join(
        f"{g} {t['seconds']:.0f} s in {t['runs']} runs"
        for g, t in matrix.gate_seconds(proof.runs, proof.clean).items()))
    print(f"\nprove: {'PASS' if v.exit_status == 0 else 'FAIL'} ({len(v.problems)} problems) in {wall:.0f} s "
          f"with {args.jobs} jobs")
    html = args.html or next((str(Path(f).with_suffix(".html")) for f in (args.json, args.markdown) if f), None)
    for path, text in ((args.json, lambda: json.dumps(matrix.report(proof, meta), indent=2)),
                       (args.markdown, lambda: matrix.markdown(proof, meta)),
                       (html, lambda: proof_html.page(proof, meta))):
        if path:
            Path(path).write_text(text(), encoding="utf-8")
            print(f"wrote {path}")
    if not (args.json or args.markdown or html):
        print("wrote nothing (give --json, --markdown or --html FILE)")
    return v.exit_status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="specgate")
    sub = ap.add_subparsers(dest="command", required=True)
    add_prove_parser(sub)
    args = ap.parse_args(["prove", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
