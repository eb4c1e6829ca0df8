"""`specgate gates list`, `specgate gates run [NAME ...] [--json FILE] [--junit FILE]`,
`specgate gates verdict [REPORT.json ...]` and `specgate gates decide [--bench1b]` (gates/decide.py).

Which defects prove each gate is handed in (`proven_against`, gate -> defect names) by the layer
that knows the defect catalogue: the specgate command. `python -m gates.cli` alone has no
catalogue and lists none.
"""
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from engine.config import ARMS
from engine.veto import EVIDENCE_FILE
from gates import report
from gates.argtypes import choice_list, device, float_in, folder, int_at_least, output_file
from gates.registry import FORWARDS, GATES, by_name

ENGINE_DTYPES = ("float32", "bfloat16")  # engine.config.DTYPES, named here so --help needs no torch

DEFAULT_JSON = "reports/gates.json, or reports/gate-NAME.json for named gates"


def add_gates_parser(subparsers, proven_against: Mapping[str, tuple[str, ...]] | None = None) -> None:
    gates = subparsers.add_parser("gates", help="list or run the gates that decide whether the async "
                                  "runner may be switched on")
    sub = gates.add_subparsers(dest="gates_command", required=True)
    ls = sub.add_parser("list", help="names, purposes, needs and the defects each is proven against")
    ls.set_defaults(func=cmd_list)
    run = sub.add_parser("run", help="run gates (all when none is named); exit 1 when any is red or errored")
    run.add_argument("names", nargs="*", metavar="NAME", help="gates to run (default: all)")
    run.add_argument("--json", type=output_file, default=None, metavar="FILE",
                     help=f"write the report as JSON (default: {DEFAULT_JSON})")
    run.add_argument("--junit", type=output_file, default=None, metavar="FILE", help="write the report as JUnit XML")
    run.add_argument("--deep", action="store_true", help="Hypothesis 'deep' profile: many more examples")
    run.add_argument("--model", type=folder, default=None, help="target model folder (default: the fixture target)")
    run.add_argument("--drafter", type=folder, default=None, help="block drafter folder (default: the fixture drafter)")
    run.add_argument("--device", type=device, default=None, help="device for the engine runs (default: cpu)")
    run.add_argument("--dtype", choices=ENGINE_DTYPES, default=None,
                     help="dtype of the engine runs (default: the model folder's own). The token-exact gates "
                     "compare greedy tokens across batch shapes: on a bfloat16 folder use float32, since bf16 "
                     "matmuls round differently per batch shape and a near tie can flip a token")
    run.add_argument("--busy-threshold", type=float_in(0.0, 1.0, lo_open=True), default=None, metavar="LEVEL",
                     help="busy gate: the busy fraction the async graph arm must reach, measured without "
                     "the profiler, and the sync runner must not (default 0.95; see gates/busy.py)")
    run.add_argument("--forwards", type=choice_list(*FORWARDS), default=None, metavar="F[,F]",
                     help="the forwards the gates judge: reference (compile=False), compiled (compile=True). Default: "
                     "both with --device cuda, where each forward-dependent gate runs its engine tests once per "
                     "forward; the reference on the CPU, both under --deep, where the compiled forward is judged "
                     "by emit-count's compiled case alone (inductor's CPU compile takes minutes)")
    run.add_argument("--timed-arms", type=choice_list(*ARMS), default=None, metavar="A[,A]",
                     help="the arms the timed gates (busy, speed-ab) measure: eager, graph (default both). The "
                     "verdict judges the graph arm; `--timed-arms graph` leaves out the eager legs, most of a "
                     "timed gate's time on CUDA, and the report names the arm left out")
    run.add_argument("--cpu-only", action="store_true", help="only the gates that need no CUDA")
    run.add_argument("--stop-at-red", action="store_true", help="end a gate at its first failed check (the gate "
                     "is red whatever its other tests give; `specgate prove` runs its defect trees so)")
    run.add_argument("--coverage", nargs="?", const="reports/coverage", default=None, metavar="DIR",
                     help="measure each gate's engine lines and branches (coverage.py): figures into the JSON, "
                     "HTML into DIR (default reports/coverage); with every gate, unreached request-path "
                     "branches not in gates/unreached-branches.toml, or stale entries there, fail the run")
    run.add_argument("--jobs", type=int_at_least(1), default=os.cpu_count() or 1, metavar="N",
                     help="pytest processes at once (default: the CPU count); each gate runs whole in one, "
                     "the timed gates (speed-ab, busy) alone after the others, so the report does not depend on N")
    run.set_defaults(func=cmd_run)
    gates.set_defaults(proven_against=dict(proven_against or {}))
    verdict = sub.add_parser("verdict", help="LIFT or KEEP the async-runner veto, with reasons, from gate "
                             "reports; exit 1 only when a report has a red or errored gate")
    verdict.add_argument("reports", nargs="*", metavar="REPORT", default=["reports/gates.json"],
                         help="JSON reports of `gates run --json` (default: reports/gates.json)")
    verdict.add_argument("-v", "--verbose", action="store_true", help="also list every gate run read")
    verdict.add_argument("--allow-mixed-trees", action="store_true",
                         help="combine reports that judged different source trees (refused by default)")
    # A flag, not an optional value: `--record REPORT.json ...` once wrote the evidence over the first
    # report (2026-12-03); the file is --evidence's.
    verdict.add_argument("--record", action="store_true", help="write the decision and what it judged to the "
                         "evidence file the engine reads: the veto lifts by default only for that engine's "
                         "sources, device kinds, forwards and arms")
    verdict.add_argument("--evidence", type=output_file, default=str(EVIDENCE_FILE), metavar="FILE",
                         help="with --record, the evidence file to write (default engine/veto-evidence.json)")
    verdict.set_defaults(func=cmd_verdict)
    decide = sub.add_parser("decide", help="the whole decision, what `make gates` runs: every gate (on the GPU "
                            "when there is one), with --bench1b the 1B shape's gates too, then the verdict")
    decide.add_argument("--bench1b", action="store_true", help="on CUDA, then run busy, speed-ab and no-sync on "
                        "the 1B benchmark shape (written once to ~/.cache/specgate/bench-models, $SPECGATE_CACHE)")
    decide.add_argument("--device", type=device, default=None, help="default: cuda when available, else cpu")
    decide.add_argument("--jobs", type=int_at_least(1), default=os.cpu_count() or 1, metavar="N",
                        help="pytest processes at once (as gates run)")
    decide.add_argument("--reports", type=output_file, default="reports", metavar="DIR",
                        help="where gates.json, gates.xml (and gates-1b.json, .xml) go, made if missing "
                        "(default: reports)")
    decide.set_defaults(func=cmd_decide)


def cmd_decide(args) -> int:
    from gates.decide import cmd_decide as decide
    return decide(args)


def cmd_list(args) -> int:
    for g in GATES:
        proven = ", ".join(args.proven_against.get(g.name, ())) or "-"
        print(f"{g.name:<16} needs {g.needs:<5} proven against: {proven}\n    {g.purpose}")
    return 0


def cmd_run(args) -> int:
    from gates.run import run_gates
    if args.jobs < 1:
        print("specgate: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        gates = by_name(args.names)
    except KeyError as e:
        print(f"specgate: error: {e.args[0]}", file=sys.stderr)
        return 2
    if args.cpu_only:
        gates = [g for g in gates if g.needs == "cpu"]
    from engine.config import ModelConfig, read_config_json
    from engine.errors import SpecgateError
    checks = (("--model", args.model, ModelConfig.from_dir),
              ("--drafter", args.drafter, lambda d: read_config_json(Path(d), "drafter")))
    for flag, given, check in checks:
        try:
            if given:  # refused here in one line, not after a pytest session's worth of output
                check(given)
        except SpecgateError as e:
            print(f"specgate: error: argument {flag}: {e}", file=sys.stderr)
            return 2
    json_path = args.json or default_json(args.names)
    Path(json_path).parent.mkdir(parents=True, exist_ok=True)
    result = run_gates(gates, json_path, args.junit, deep=args.deep, model=args.model,
                       drafter=args.drafter, device=args.device, proven_against=args.proven_against,
                       pytest_args=(("--busy-threshold", str(args.busy_threshold)) if args.busy_threshold else ())
                       + (("--dtype", args.dtype) if args.dtype else ())
                       + (("--forwards", ",".join(args.forwards)) if args.forwards else ())
                       + (("--timed-arms", ",".join(args.timed_arms)) if args.timed_arms else ())
                       + (("--gates-stop-at-red",) if args.stop_at_red else ()),
                       coverage_dir=args.coverage, jobs=args.jobs)
    print(report.table(result.gates))
    counts = result.summary
    print(f"{counts['green']} green, {counts['red']} red, {counts['skipped']} skipped, "
          f"{counts['error']} error in {result.seconds:.0f} s")
    if result.reach is not None:
        from gates.reach import summary
        print(summary(result))
    for path in filter(None, (json_path, args.junit)):
        print(f"wrote {path}")
    return result.exit_status


def default_json(names: list[str]) -> str:
    """Where `gates run` writes its JSON without --json: reports/gates.json for every gate (what
    `gates verdict` reads by default), reports/gate-NAME.json for named gates (as `make gate`)."""
    return f"reports/gate-{'+'.join(names)}.json" if names else "reports/gates.json"


def cmd_verdict(args) -> int:
    from gates import verdict
    if args.record and any(Path(r).resolve() == Path(args.evidence).resolve() for r in args.reports):
        print(f"specgate: error: --evidence {args.evidence} is one of the reports read: the evidence would "
              f"overwrite it", file=sys.stderr)
        return 2
    try:
        reports = verdict.load(args.reports)
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 2
    try:
        v = verdict.decide(reports, allow_mixed=args.allow_mixed_trees, report_names=list(args.reports))
        recorded = verdict.record(v, reports, list(args.reports), Path(args.evidence)) if args.record else None
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 2
    for line in v.runs if args.verbose else ():
        print(f"  ran: {line}")
    for reason in v.reasons:
        print(f"  keep: {reason}")
    if recorded:
        print(f"wrote {recorded} ({v.decision} for engine {verdict.engine_source_hash()[:12]})")
    print(v.line)
    return 1 if any(g.status in ("red", "error") for r in reports for g in r.gates) else 0


def main(argv=None) -> int:
    """`python -m gates.cli gates ...`: the same subcommand without the rest of `specgate`."""
    import argparse
    ap = argparse.ArgumentParser(prog="specgate")
    add_gates_parser(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
