"""`specgate gates list`, `specgate gates run [NAME ...] [--json FILE] [--junit FILE]` and
`specgate gates verdict [REPORT.json ...]`.

Which defects prove each gate is handed in (`proven_against`, gate -> defect names) by the layer
that knows the defect catalogue: the specgate command. `python -m gates.cli` alone has no
catalogue and lists none.
"""
import os
import sys
from collections.abc import Mapping

from gates import report
from gates.registry import GATES, by_name


def add_gates_parser(subparsers, proven_against: Mapping[str, tuple[str, ...]] | None = None) -> None:
    gates = subparsers.add_parser("gates", help="list or run the gates that decide whether the async "
                                  "runner may be switched on")
    sub = gates.add_subparsers(dest="gates_command", required=True)
    ls = sub.add_parser("list", help="names, purposes, needs and the defects each is proven against")
    ls.set_defaults(func=cmd_list)
    run = sub.add_parser("run", help="run gates (all when none is named); exit 1 when any is red or errored")
    run.add_argument("names", nargs="*", metavar="NAME", help="gates to run (default: all)")
    run.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON")
    run.add_argument("--junit", default=None, metavar="FILE", help="write the report as JUnit XML")
    run.add_argument("--deep", action="store_true", help="Hypothesis 'deep' profile: many more examples")
    run.add_argument("--model", default=None, help="target model folder (default: the fixture target)")
    run.add_argument("--drafter", default=None, help="block drafter folder (default: the fixture drafter)")
    run.add_argument("--device", default=None, help="device for the engine runs (default: cpu)")
    run.add_argument("--busy-threshold", type=float, default=None, metavar="LEVEL",
                     help="busy gate: the busy fraction the async graph arm must reach (default per model: "
                     "0.95 for the 1B shape and larger, 0.50 for the fixtures; see gates/busy.py)")
    run.add_argument("--cpu-only", action="store_true", help="only the gates that need no CUDA")
    run.add_argument("--jobs", type=int, default=os.cpu_count() or 1, metavar="N",
                     help="pytest processes at once (default: the CPU count); each gate runs whole in one, "
                     "the timed gates (speed-ab, busy) alone after the others, so the report does not depend on N")
    run.set_defaults(func=cmd_run)
    gates.set_defaults(proven_against=dict(proven_against or {}))
    verdict = sub.add_parser("verdict", help="LIFT or KEEP the async-runner veto, with reasons, from gate "
                             "reports; exit 1 only when a report has a red or errored gate")
    verdict.add_argument("reports", nargs="*", metavar="REPORT", default=["reports/gates.json"],
                         help="JSON reports of `gates run --json` (default: reports/gates.json)")
    verdict.add_argument("-v", "--verbose", action="store_true", help="also list every gate run read")
    verdict.set_defaults(func=cmd_verdict)


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
    result = run_gates(gates, args.json, args.junit, deep=args.deep, model=args.model,
                       drafter=args.drafter, device=args.device, proven_against=args.proven_against, jobs=args.jobs,
                       pytest_args=("--busy-threshold", str(args.busy_threshold)) if args.busy_threshold else ())
    print(report.table(result["gates"]))
    counts = result["summary"]
    print(f"{counts['green']} green, {counts['red']} red, {counts['skipped']} skipped, "
          f"{counts['error']} error in {result['seconds']:.0f} s")
    return result["exit_status"]


def cmd_verdict(args) -> int:
    from gates import verdict
    try:
        reports = verdict.load(args.reports)
    except ValueError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 2
    v = verdict.decide(reports)
    for line in v.runs if args.verbose else ():
        print(f"  ran: {line}")
    for reason in v.reasons:
        print(f"  keep: {reason}")
    print(v.line)
    return 1 if any(g["status"] in ("red", "error") for r in reports for g in r.get("gates", [])) else 0


def main(argv=None) -> int:
    """`python -m gates.cli gates ...`: the same subcommand without the rest of `specgate`."""
    import argparse
    ap = argparse.ArgumentParser(prog="specgate")
    add_gates_parser(ap.add_subparsers(dest="command", required=True))
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
