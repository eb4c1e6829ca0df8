"""The `specgate` command line: generate, bench, gates, prove, mutate.

The top of the import layers (see README's Layout): it hands the engine and the gates the
fixture models as defaults, and joins the gate registry with the defect catalogue (which defects
prove which gate), so that the packages below it import only downward.
Over 300 lines because it holds every command's parser and thin handler (the benchmark model's
subcommands among them), each a few lines over the engine or gates function it calls.
"""
import argparse
import json
import logging
import os
import sys
import time

from engine.errors import SpecgateError
from fixtures import DRAFTER_DIR, TARGET_DIR
from gates.argtypes import Parser, choice_list, device, float_in, folder, int_at_least, int_list, output_file
from gates.registry import GATES

# Without --max-model-len: the model's max_position_embeddings, capped here so that a long-context
# checkpoint (128k positions) does not reserve KV for 128k tokens per sequence by default.
MAX_MODEL_LEN_CAP = 2048


def _engine_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", type=folder, default=str(TARGET_DIR),
                    help="Hugging Face-format model folder (default: fixture target)")
    ap.add_argument("--spec", choices=["ngram", "block", "oracle"], default=None,
                    help="speculative decoding drafter (oracle: `specgate bench` only, with --oracle-tau)")
    ap.add_argument("--num-spec-tokens", type=int_at_least(1, 16), default=4, metavar="K",
                    help="draft tokens per verify step (k, 1..16; the block drafter takes at most 8)")
    ap.add_argument("--drafter", type=folder, default=None, help="block drafter folder (default: fixture drafter)")
    ap.add_argument("--device", type=device, default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--max-model-len", type=int_at_least(2, 1 << 16), default=None, metavar="N",
                    help="context length in tokens, prompt + completion (default: the model's "
                    f"max_position_embeddings, at most {MAX_MODEL_LEN_CAP}); a request cut by it finishes "
                    "with reason 'context'")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16"],
                    help="default: the checkpoint's dtype (float32 for float16 or unstated)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="the fused forward compiled by inductor (engine/fused.py), or with --no-compile the "
                    "reference forward (default: compiled on CUDA, the reference on the CPU)")
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                    help="replay each decode step as one captured CUDA graph (the graph arm), or with --no-graph "
                    "launch its kernels one by one (the eager arm) (default: the graph arm on CUDA, the eager "
                    "arm on the CPU)")
    ap.add_argument("--attention-backend", choices=["sdpa", "flex", "paged"], default=None,
                    help="attention over the paged KV cache (EngineConfig.attention_backend): sdpa (gather), flex "
                    "or paged (a Triton kernel reading the cache in place) (default: paged on CUDA, sdpa on the CPU)")
    runner = ap.add_mutually_exclusive_group()
    runner.add_argument("--async-runner", dest="async_runner", action="store_true", default=None,
                        help="use the async runner (lifts the veto for this run)")
    runner.add_argument("--sync-runner", dest="async_runner", action="store_false",
                        help="use the sync runner (default: the veto's decision, engine/veto.py)")


def _drafter(args) -> str | None:
    """The drafter asked for, else the fixture drafter when the block drafter is used."""
    return args.drafter or (str(DRAFTER_DIR) if args.spec == "block" else None)


def _max_model_len(args) -> int:
    """--max-model-len, checked against the model; without it the model's own, capped."""
    from engine.config import ModelConfig
    positions = ModelConfig.from_dir(args.model).max_position_embeddings
    if args.max_model_len is None:
        return min(positions, MAX_MODEL_LEN_CAP)
    if args.max_model_len > positions:
        raise SpecgateError(f"argument --max-model-len: {args.max_model_len} exceeds the model's "
                            f"max_position_embeddings ({positions})")
    return args.max_model_len


def _llm(args, **extra):
    from engine import LLM
    max_model_len = _max_model_len(args)
    kwargs = dict(spec=args.spec, num_spec_tokens=args.num_spec_tokens, drafter=_drafter(args),
                  device=args.device, async_runner=args.async_runner, max_model_len=max_model_len,
                  max_num_batched_tokens=max(2048, max_model_len), compile=args.compile, graph=args.graph,
                  attention_backend=args.attention_backend)
    if args.dtype is not None:
        kwargs["dtype"] = args.dtype
    kwargs.update(extra)
    return LLM(args.model, **kwargs)


def cmd_generate(args) -> int:
    from engine import SamplingParams
    from engine.bench.metrics import Acceptance
    llm = _llm(args)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed,
                            top_k=args.top_k, top_p=args.top_p)
    t0 = time.perf_counter()
    out = llm.generate(args.prompt, params)[0]
    seconds = time.perf_counter() - t0
    print(args.prompt + out.text)
    n = len(out.token_ids)
    line = (f"[prompt {len(out.prompt_token_ids)} tokens, completion {n} tokens, {seconds:.2f} s, "
            f"{n / seconds:.1f} tokens/s, finish {out.finish_reason}, context {llm.config.max_model_len}")
    if args.spec:
        acc = Acceptance()
        acc.add(out.stats, n)
        line += f", τ {acc.mean_acceptance_length:.2f}, accept rate {acc.acceptance_rate:.1%}"
    print(line + "]", file=sys.stderr)
    if out.finish_reason == "context":
        print(f"specgate: warning: the completion was cut at {n} of --max-tokens {args.max_tokens} tokens: "
              f"prompt + completion reached the context length {llm.config.max_model_len} "
              "(raise --max-model-len, up to the model's max_position_embeddings)", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from engine.bench import legs as bench
    from engine.defaults import resolve_attention_backend, resolve_compile, resolve_graph
    from engine.loader import model_checksums
    _resolve_model_shape(args)
    if args.measure_load:
        return _measure_load(args)
    if args.measure_startup:
        return _measure_startup(args)
    concurrencies = args.concurrency
    if args.legs <= args.warmup_legs:
        print(f"specgate: error: --legs {args.legs} with --warmup-legs {args.warmup_legs} leaves no warm leg "
              f"to average: give --legs at least {args.warmup_legs + 1}, or lower --warmup-legs", file=sys.stderr)
        return 2
    oracle = args.spec == "oracle"
    if oracle != (args.oracle_tau is not None):
        raise SpecgateError("--spec oracle needs --oracle-tau T (the mean acceptance length to replay at), "
                            "and --oracle-tau is used only with --spec oracle")
    if oracle:
        from engine.bench.oracle import acceptance_for_tau, oracle_proposer
        acceptance_for_tau(args.oracle_tau, args.num_spec_tokens)  # refuse before the plain pass runs
        if args.temperature != 0:
            raise SpecgateError("--spec oracle replays a greedy run: --temperature must be 0")
    from fixtures.corpus import load_corpus
    workload = bench.heldout_workload(load_corpus(), args.num_prompts, max_tokens=args.max_tokens,
                                      temperature=args.temperature)
    terminal = sys.stderr.isatty()

    def leg_line(leg):  # not on a terminal: a line per leg instead of the bar
        tag = f"{leg.spec or 'plain'} " if oracle else ""  # the oracle bench runs both passes
        print(f"bench: {tag}c={leg.concurrency} leg {leg.index} ({'warm' if leg.warm else 'warm-up'}): "
              f"{leg.tokens_per_s} tokens/s in {leg.seconds:.1f} s", file=sys.stderr, flush=True)
    meta = {"spec": args.spec, "k": args.num_spec_tokens if args.spec else 0, "device": args.device,
            "graph": resolve_graph(args.graph, args.device), "compile": resolve_compile(args.compile, args.device),
            "attention_backend": resolve_attention_backend(args.attention_backend, args.device),
            "max_model_len": _max_model_len(args),
            "models": model_checksums(args.model, _drafter(args))}
    on_leg = None if terminal else leg_line
    if oracle:
        def make(c, script):
            return _llm(args, max_num_seqs=c, spec="oracle" if script else None,
                        proposer=oracle_proposer(script) if script else None)
        plain, legs = bench.run_oracle_bench(make, workload, concurrencies, args.legs, args.warmup_legs,
                                             args.oracle_tau, args.num_spec_tokens, terminal, on_leg)
        result = bench.oracle_report(plain, legs, workload, meta | {"oracle_tau": args.oracle_tau})
        _print_summary(result["plain"]["summary"], "plain  ")
    else:
        legs = bench.run_bench(lambda c: _llm(args, max_num_seqs=c),
                               workload, concurrencies, args.legs,
                               args.warmup_legs, progress=terminal, on_leg=on_leg)
        result = bench.report(legs, workload, meta)
    _print_summary(result["summary"], "oracle " if oracle else "", args.spec)
    for c, cmp in result.get("oracle_vs_plain", {}).items():
        print(f"concurrency {c}: oracle over plain {cmp['speedup']}x at τ {cmp['tau']:.2f} "
              f"(asked {args.oracle_tau}), tokens {'equal' if cmp['lossless'] else 'DIFFER from'} the plain run's")
    if args.count_kernels:
        from engine.bench.kernel_count import count_kernels
        result["kernels"] = {str(c): count_kernels(_llm(args, max_num_seqs=c, spec=None if oracle else args.spec,
                                                        graph=False), workload) for c in concurrencies}
        for c, kc in result["kernels"].items():
            n = kc.get("kernels_per_step", kc.get("aten_ops_per_step"))
            print(f"concurrency {c}: {n} {kc['counted']} per decode step ({kc['arm']} arm, {kc['steps']} steps)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        drafter = f"spec={args.spec} k={meta['k']}" if args.spec else "no drafter"
        bench.plot(result["figures"], args.plot, f"specgate bench: {drafter} on {args.device}\n"
                   f"{len(workload.prompts)} prompts x {workload.max_tokens} tokens, "
                   f"workload {result['workload']['fingerprint']}")
    for path in filter(None, (args.json, args.plot)):
        print(f"wrote {path}")
    if not (args.json or args.plot):
        print("wrote nothing (give --json FILE and/or --plot FILE.png)")
    return 0


def _print_summary(summary: dict, label: str, spec: str | None = None) -> None:
    for c, s in summary.items():
        acc = s["acceptance"]
        extra = (f"  τ {acc['mean_acceptance_length']:.2f}  accept rate {acc['acceptance_rate']:.1%}"
                 f"  accept length {acc['accept_length']:.2f}") if spec else ""
        print(f"{label}concurrency {c}: {s['tokens_per_s_mean']} tokens/s (warm legs {s['legs']}, "
              f"min {s['tokens_per_s_min']}, max {s['tokens_per_s_max']}){extra}")
        if "phases" in s:
            ph = s["phases"]
            host = "  ".join(f"{p} {ph['host_ms_per_step'][p]:.3f}" for p in ("plan", "upload", "launch", "completion"))
            gpu = (f"; GPU {ph['gpu_ms_per_step']:.3f} ms/step, host/GPU {ph['host_over_gpu']}"
                   if ph["gpu_ms_per_step"] is not None else "; no GPU time (CPU: device work runs in launch)")
            print(f"{label}  host ms/step: {host} (wait {ph['host_ms_per_step']['completion_wait']:.3f}){gpu}")


def _measure_load(args) -> int:
    """`specgate bench --measure-load`: load time and peak host memory of the weights alone,
    measured in a fresh child process (engine/bench/load_cost.py)."""
    from engine.bench.load_cost import measure_load_in_child
    m = measure_load_in_child(args.model, args.device, args.dtype)
    device = f", device peak {m['device_peak_mib']} MiB" if m["device_peak_mib"] is not None else ""
    touch = f" (+{m['touch_seconds']} s to page the mapped weights in)" if m["touch_seconds"] is not None else ""
    print(f"load {m['seconds']} s{touch}, weights {m['weights_mib']} MiB in {m['num_shards']} file(s), the largest "
          f"{m['largest_shard_mib']} MiB; peak host memory {m['peak_rss_mib']} MiB (before the load "
          f"{m['peak_rss_mib_before']} MiB, so the load added {m['load_added_mib']} MiB)"
          f"{device}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": m, "model": args.model, "device": args.device}, f, indent=2)
    return 0


def _measure_startup(args) -> int:
    """`specgate bench --measure-startup`: building the engine and its first request, cold (an empty
    inductor cache) and warm, each in a fresh child process (engine/bench/startup.py)."""
    from engine.bench.startup import CACHE_STATES, measure_startup
    from engine.config import ARMS, FORWARDS
    from engine.defaults import resolve_compile, resolve_graph
    max_model_len = _max_model_len(args)
    engine = dict(spec=args.spec, num_spec_tokens=args.num_spec_tokens, drafter=_drafter(args), device=args.device,
                  async_runner=args.async_runner, graph=args.graph, compile=args.compile, max_model_len=max_model_len,
                  max_num_batched_tokens=max(2048, max_model_len), **({"dtype": args.dtype} if args.dtype else {}))
    result = measure_startup(args.model, engine)
    forward = FORWARDS[resolve_compile(args.compile, args.device)]
    arm = ARMS[resolve_graph(args.graph, args.device)]
    print(f"start-up of {args.model} on {args.device}, the {forward} forward, {arm} arm:")
    for state in CACHE_STATES:
        m = result[state]
        print(f"  {state}: {m['startup_s']} s (engine {m['engine_s']} s with {m['graphs']} graphs captured, first "
              f"request {m['first_request_s']} s against {m['steady_request_s']} s warm; compiling {m['compile_s']} s, "
              f"inductor cache {m['cache_hits']} hits, {m['cache_misses']} misses)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


def _resolve_model_shape(args) -> None:
    """`bench --model-shape S`: the benchmark model folder of that shape, written if missing."""
    if args.model_shape is None:
        return
    if args.model != str(TARGET_DIR):
        raise SpecgateError("give --model or --model-shape, not both")
    from engine.bench.models import write_bench_model
    args.model = str(write_bench_model(args.model_shape, args.model_seed, progress=_progress))


def _progress(message: str) -> None:
    print(f"specgate: {message}", file=sys.stderr, flush=True)


def cmd_bench_model_write(args) -> int:
    from engine.bench.models import write_bench_model
    print(write_bench_model(args.shape, args.seed, args.dir, progress=_progress))
    return 0


def _bench_model_dir(args) -> str:
    if args.model is not None:
        return args.model
    from engine.bench.models import write_bench_model
    return str(write_bench_model(args.shape, args.seed, progress=_progress))


def _write_json(path, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {path}")


def cmd_bench_model_decode(args) -> int:
    from engine.bench.decode import decode_report
    from engine.defaults import resolve_attention_backend
    result = decode_report(_bench_model_dir(args), args.device, list(args.runners), args.arm, args.concurrency,
                           args.prompt_len, args.max_tokens, args.legs, progress=_progress,
                           attention_backends=args.attention_backends
                           or (resolve_attention_backend(None, args.device),),
                           compile_modes=tuple(mode == "on" for mode in args.compile))
    for arm, per_c in result["arms"].items():
        for c, r in per_c.items():
            floor = result["floor"][c]["ms"]
            print(f"{arm} c={c}: {r['ms_per_step']} ms per step ({r['ms_per_step'] / floor:.2f}x the floor "
                  f"{floor} ms), {r['tokens_per_s']} tokens/s")
    _write_json(args.json, result)
    return 0


def cmd_bench_model_peer(args) -> int:
    from engine.bench.dense_peer import dense_peer
    from engine.bench.models import bench_prompts
    from engine.bench.peer import transformers_peer
    prompts = bench_prompts(max(args.concurrency), args.prompt_len)
    model_dir = _bench_model_dir(args)
    # the dense peer first: its model is freed before transformers loads its own
    dense = dense_peer(model_dir, prompts, args.concurrency, args.device, progress=_progress)
    result = {**transformers_peer(model_dir, prompts, args.concurrency, args.device, progress=_progress),
              "dense": dense}
    for name, report in (("transformers", result), ("dense", dense)):
        if not report["ran"]:
            print(f"{name} peer not run: {report['why']}")
        for c, r in report.get("per_concurrency", {}).items():
            print(f"{name} c={c}: {r['ms_per_step']} ms per step")
    _write_json(args.json, result)
    return 0


def cmd_bench_model_matmul(args) -> int:
    import tempfile
    from pathlib import Path

    from engine.bench.matmul import matmul_report
    from engine.bench.models import config_dict, shape_named
    from engine.config import ModelConfig
    if args.model is not None:
        cfg = ModelConfig.from_dir(args.model)
    else:  # the shape's config.json alone: random matrices of its sizes need no weights written
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "config.json").write_text(json.dumps(config_dict(shape_named(args.shape))))
            cfg = ModelConfig.from_dir(tmp)
    result = matmul_report(cfg, args.device, rows=args.rows, variants=args.variants, progress=_progress)
    for key, b in result["best"].items():
        print(f"{key}: {b['microseconds']} µs, {b['gb_per_s']} GB/s ({b['variant']})")
    for m, us in result["per_step_us"].items():
        print(f"matmuls of one plain step at M={m}, each matrix at its best variant: {us / 1e3:.3f} ms")
    _write_json(args.json, result)
    return 0


def cmd_bench_model_summary(args) -> int:
    from engine.bench import summary as bench_summary
    spec = dict(pair.split("=", 1) for pair in args.spec)
    result = bench_summary.summarize_files(args.decode, args.peer, args.load, spec)
    _write_json(args.json, result)
    if args.plot:
        bench_summary.plot(result, args.plot)
        print(f"wrote {args.plot}")
    print(bench_summary.table(result))
    return 0


def add_bench_model_parser(sub) -> None:
    from engine.bench.matmul import VARIANTS as MATMUL_VARIANTS
    from engine.bench.models import SHAPES
    bm = sub.add_parser("bench-model", help="seeded random-weight benchmark models (no download)")
    bm_sub = bm.add_subparsers(dest="bench_model_command", required=True)
    w = bm_sub.add_parser("write", help="write a benchmark model folder unless it is complete; print its path")
    w.add_argument("--shape", choices=list(SHAPES), default="llama-1b")
    w.add_argument("--seed", type=int_at_least(0), default=0)
    w.add_argument("--dir", default=None, help="folder (default: $SPECGATE_CACHE/bench-models/SHAPE-seedN, "
                   "SPECGATE_CACHE defaulting to ~/.cache/specgate)")
    w.set_defaults(func=cmd_bench_model_write)
    for name, func, what in (("decode", cmd_bench_model_decode, "ms per plain decode step per runner, the copy "
                              "bandwidth and the HBM floor"),
                             ("peer", cmd_bench_model_peer, "ms per decode step of transformers' static-cache, "
                              "compiled generate and of a gpt-fast-style dense decoder (CUDA only)")):
        m = bm_sub.add_parser(name, help=what)
        m.add_argument("--model", type=folder, default=None, help="model folder (default: the --shape folder)")
        m.add_argument("--shape", choices=list(SHAPES), default="llama-1b")
        m.add_argument("--seed", type=int_at_least(0), default=0)
        m.add_argument("--device", type=device, default="cpu")
        m.add_argument("--concurrency", type=int_list(1, 256), default=[1, 8], metavar="C[,C...]")
        m.add_argument("--prompt-len", type=int_at_least(2, 1 << 16), default=64,
                       help="tokens per prompt (BOS + random bytes); at most the folder's positions less --max-tokens")
        m.add_argument("--json", type=output_file, default=None, metavar="FILE")
        if name == "decode":
            m.add_argument("--runners", type=choice_list("sync", "async"), default=("sync", "async"), metavar="R[,R]")
            m.add_argument("--arm", choices=["graph", "eager"], default="graph")
            m.add_argument("--max-tokens", type=int_at_least(2, 2048), default=128)
            m.add_argument("--legs", type=int_at_least(1), default=3, help="timed legs after one warm-up (median kept)")
            m.add_argument("--attention-backends", type=choice_list("sdpa", "flex", "paged"), default=None,
                           metavar="B[,B]", help="attention backends to time (EngineConfig.attention_backend; "
                                "flex: torch's FlexAttention, paged: specgate's Triton kernel; default: the device's, "
                                "paged on CUDA, sdpa on the CPU)")
            m.add_argument("--compile", type=choice_list("off", "on"), default=("off",), metavar="off|on|off,on",
                           help="time the reference forward (off), the fused one compiled by inductor (on), or both")
        m.set_defaults(func=func)
    m = bm_sub.add_parser("matmul", help="µs and GB/s of each weight matrix's matmul at M rows, per variant "
                          "(cuBLAS, inductor, autotuned): docs/benchmarks.md")
    m.add_argument("--model", type=folder, default=None, help="model folder (default: the --shape folder)")
    m.add_argument("--shape", choices=list(SHAPES), default="llama-1b")
    m.add_argument("--seed", type=int_at_least(0), default=0)
    m.add_argument("--device", type=device, default="cpu")
    m.add_argument("--rows", type=int_list(1, 4096), default=[1, 8, 40], metavar="M[,M...]")
    m.add_argument("--variants", type=choice_list(*MATMUL_VARIANTS), default=MATMUL_VARIANTS, metavar="V[,V...]")
    m.add_argument("--json", type=output_file, default=None, metavar="FILE")
    m.set_defaults(func=cmd_bench_model_matmul)
    m = bm_sub.add_parser("summary", help="join decode, peer, load and bench reports; print the table")
    m.add_argument("--decode", default=None, metavar="FILE")
    m.add_argument("--peer", default=None, metavar="FILE")
    m.add_argument("--load", default=None, metavar="FILE", help="a `specgate bench --measure-load --json` report")
    m.add_argument("--spec", action="append", default=[], metavar="LABEL=FILE",
                   help="a `specgate bench --json` report; LABEL plain is the baseline (repeatable)")
    m.add_argument("--json", type=output_file, default=None, metavar="FILE")
    m.add_argument("--plot", type=output_file, default=None, metavar="FILE.png")
    m.set_defaults(func=cmd_bench_model_summary)


def main(argv=None) -> int:
    ap = Parser(prog="specgate", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="complete one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-tokens", type=int_at_least(1), default=64)
    g.add_argument("--temperature", type=float_in(0.0), default=0.0)
    g.add_argument("--top-k", type=int_at_least(-1), default=-1, help="-1: off")
    g.add_argument("--top-p", type=float_in(0.0, 1.0, lo_open=True), default=1.0)
    g.add_argument("--seed", type=int_at_least(0), default=None)
    _engine_args(g)
    g.set_defaults(func=cmd_generate)
    b = sub.add_parser("bench", help="tokens/s and acceptance per leg on held-out prompts")
    b.add_argument("--concurrency", type=int_list(1, 256), default=[1, 8], metavar="C[,C...]",
                   help="concurrencies (max_num_seqs) to run, e.g. 1,8 (default)")
    b.add_argument("--legs", type=int_at_least(1), default=3, help="legs per concurrency (default 3)")
    b.add_argument("--warmup-legs", type=int_at_least(0), default=1,
                   help="the first N legs of each concurrency are warm-up: shown, never averaged (default 1)")
    b.add_argument("--num-prompts", type=int_at_least(1), default=8)
    b.add_argument("--max-tokens", type=int_at_least(1), default=64)
    b.add_argument("--temperature", type=float_in(0.0), default=0.0)
    b.add_argument("--json", type=output_file, default=None, metavar="FILE", help="write every leg and the fold")
    b.add_argument("--plot", type=output_file, default=None, metavar="FILE.png",
                   help="write a PNG: tokens/s per leg (and τ, acceptance per position with --spec)")
    b.add_argument("--oracle-tau", type=float_in(1.0), default=None, metavar="T",
                   help="with --spec oracle: the mean acceptance length the oracle replays at, in [1, k+1]; "
                   "runs the plain pass, then the oracle pass (benchmark models: random weights)")
    b.add_argument("--count-kernels", action="store_true",
                   help="also count the device kernels per decode step in the eager arm (torch.profiler; "
                   "on the CPU: aten ops)")
    b.add_argument("--measure-load", action="store_true", help="only load the weights and report the "
                   "load time and peak host memory (run it in a fresh process)")
    b.add_argument("--measure-startup", action="store_true", help="only report what building the engine and its "
                   "first request cost (compiling, graph capture), with an empty inductor cache and a warm one, each "
                   "in a fresh process")
    from engine.bench.models import SHAPES
    b.add_argument("--model-shape", choices=list(SHAPES), default=None,
                   help="bench the seeded random-weight model of this shape (written to the cache if missing; "
                   "`specgate bench-model write`) instead of --model")
    b.add_argument("--model-seed", type=int_at_least(0), default=0, help="its seed (default 0)")
    _engine_args(b)
    b.set_defaults(func=cmd_bench)
    add_bench_model_parser(sub)
    from gates.cli import add_gates_parser
    from mutants.mutation.mutate import add_mutate_parser
    from mutants.proof.catalogue import proven_against
    from mutants.proof.prove import add_prove_parser
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
