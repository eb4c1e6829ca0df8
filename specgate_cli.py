"""The `specgate` command line: generate, bench, gates, prove, mutate.

The top of the import layers (see README's Layout): it hands the engine and the gates the
fixture models as defaults, and joins the gate registry with the defect catalogue (which defects
prove which gate), so that the packages below it import only downward.
"""
import argparse
import json
import logging
import os
import sys
import time

from engine.errors import SpecgateError
from fixtures import DRAFTER_DIR, TARGET_DIR
from gates.registry import GATES


def _engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default=str(TARGET_DIR), help="Hugging Face-format model folder (default: fixture target)")
    ap.add_argument("--spec", choices=["ngram", "block"], default=None, help="speculative decoding drafter")
    ap.add_argument("--num-spec-tokens", type=int, default=4, help="draft tokens per verify step (k)")
    ap.add_argument("--drafter", default=None, help="block drafter folder (default: fixture drafter)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="default: the checkpoint's dtype (float32 for float16 or unstated)")
    runner = ap.add_mutually_exclusive_group()
    runner.add_argument("--async-runner", dest="async_runner", action="store_true", default=None,
                        help="use the async runner (lifts the veto for this run)")
    runner.add_argument("--sync-runner", dest="async_runner", action="store_false",
                        help="use the sync runner (default: the veto's decision, engine/veto.py)")


def _drafter(args) -> str | None:
    """The drafter asked for, else the fixture drafter when the block drafter is used."""
    return args.drafter or (str(DRAFTER_DIR) if args.spec == "block" else None)


def _llm(args, **extra):
    from engine import LLM
    kwargs = dict(spec=args.spec, num_spec_tokens=args.num_spec_tokens, drafter=_drafter(args),
                  device=args.device, async_runner=args.async_runner)
    if args.dtype is not None:
        kwargs["dtype"] = args.dtype
    kwargs.update(extra)
    return LLM(args.model, **kwargs)


def cmd_generate(args) -> int:
    from engine import SamplingParams
    from engine.metrics import Acceptance
    llm = _llm(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                            top_k=args.top_k, top_p=args.top_p)
    t0 = time.perf_counter()
    out = llm.generate(args.prompt, params)[0]
    seconds = time.perf_counter() - t0
    print(args.prompt + out.text)
    n = len(out.token_ids)
    line = (f"[prompt {len(out.prompt_token_ids)} tokens, completion {n} tokens, {seconds:.2f} s, "
            f"{n / seconds:.1f} tokens/s, finish {out.finish_reason}")
    if args.spec:
        acc = Acceptance()
        acc.add(out.stats, n)
        line += f", τ {acc.mean_acceptance_length:.2f}, accept rate {acc.acceptance_rate:.1%}"
    print(line + "]", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from engine import bench
    from engine.runtime import model_checksums
    if args.measure_load:
        return _measure_load(args)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    from fixtures.corpus import load_corpus
    workload = bench.heldout_workload(load_corpus(), args.num_prompts, max_tokens=args.max_tokens,
                                      temperature=args.temperature)
    legs = bench.run_bench(lambda c: _llm(args, max_num_seqs=c), workload, concurrencies, args.legs,
                           args.warmup_legs, progress=sys.stderr.isatty())
    meta = {"spec": args.spec, "k": args.num_spec_tokens if args.spec else 0,
            "device": args.device, "models": model_checksums(args.model, _drafter(args))}
    result = bench.report(legs, workload, meta)
    for c, s in result["summary"].items():
        acc = s["acceptance"]
        extra = (f"  τ {acc['mean_acceptance_length']:.2f}  accept rate {acc['acceptance_rate']:.1%}"
                 f"  accept length {acc['accept_length']:.2f}") if args.spec else ""
        print(f"concurrency {c}: {s['tokens_per_s_mean']} tokens/s (warm legs {s['legs']}, "
              f"min {s['tokens_per_s_min']}, max {s['tokens_per_s_max']}){extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        bench.plot(legs, args.plot, f"spec={args.spec} k={meta['k']} on {args.device}")
    return 0


def _measure_load(args) -> int:
    """`specgate bench --measure-load`: load time and peak host memory of the weights alone."""
    from engine.config import DTYPES
    from engine.loader import measure_load
    m = measure_load(args.model, args.device, DTYPES[args.dtype] if args.dtype else None).as_dict()
    device = f", device peak {m['device_peak_mib']} MiB" if m["device_peak_mib"] is not None else ""
    print(f"load {m['seconds']} s, weights {m['weights_mib']} MiB, peak host memory {m['peak_rss_mib']} MiB "
          f"(before the load {m['peak_rss_mib_before']} MiB){device}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": m, "model": args.model, "device": args.device}, f, indent=2)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="specgate", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    _engine_args(g)
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="tokens/s and acceptance per leg on held-out prompts")
    b.add_argument("--concurrency", default="1,8")
    b.add_argument("--legs", type=int, default=3)
    b.add_argument("--warmup-legs", type=int, default=1)
    b.add_argument("--num-prompts", type=int, default=8)
    b.add_argument("--max-tokens", type=int, default=64)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--json", default=None)
    b.add_argument("--plot", default=None, help="write a PNG of τ and tokens/s per leg")
    b.add_argument("--measure-load", action="store_true", help="only load the weights and report the "
                   "load time and peak host memory (run it in a fresh process)")
    _engine_args(b)
    b.set_defaults(func=cmd_bench)
    from gates.cli import add_gates_parser
    from mutants.catalogue import proven_against
    from mutants.mutate import add_mutate_parser
    from mutants.prove import add_prove_parser
    add_gates_parser(sub, proven_against(g.name for g in GATES))
    add_prove_parser(sub)
    add_mutate_parser(sub)
    args = ap.parse_args(argv)
    if "OMP_NUM_THREADS" not in os.environ:
        # The fixture models are tiny: one thread beats several that spin on small kernels
        # (20x here when another process shares the two cores).
        import torch
        torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, format="specgate: %(message)s")
    try:
        return args.func(args)
    except SpecgateError as e:
        print(f"specgate: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
