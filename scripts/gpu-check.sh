#!/usr/bin/env bash
# The GPU check on the lent H200 (a command may run 10 minutes there): the environment, every
# gate on CUDA, then the GPU-deciding gates (REPEAT_GATES) again until ROUNDS clean runs in a row,
# the veto verdict over those runs and gates1b's and depth1b's reports where there are some
# (TIMED_ARMS=graph: the timed gates, busy and speed-ab, time the graph arm alone, the one the
# verdict judges, in every round and in gates1b; REPEAT_TIMED_ARMS: in the later rounds only),
# the proof with the CUDA-only defects, and a bench. Reports (JSON, JUnit, Markdown, PNG, logs)
# go under $OUT (default reports/gpu); a short table is printed last. Stages: env gates verdict
# prove bench (default: all of them), e.g. `scripts/gpu-check.sh env gates verdict`.
#
# Two more stages, on the seeded random-weight 1B benchmark model (`specgate bench-model`, written
# to $BENCH1B_DIR, default /tmp, about 10 s): `bench1b` (load time and peak host memory, ms per
# plain decode step of the sync and async graph arm at c=1 and c=8 against the HBM floor (the
# reference forward and the fused one compiled by inductor), the
# transformers peer, and spec with the oracle drafter against plain when the tree has it; about
# 4 minutes) and `gates1b` (the CUDA gates busy, speed-ab and no-sync on that model). Neither is
# in the default list; each fits one 10-minute call, e.g. `scripts/gpu-check.sh env bench1b`.
# `matmul1b`: the 1B shape's weight matrices timed per variant, each call on a fresh copy (bench-model matmul;
# MATMUL1B_ARGS adds options, e.g. --rows 1 --variants eager).
# `tiles1b`: engine/gemv.py's one-token kernels, every tile setting timed on the 1B shape
# (scripts/gemv_tile_sweep.py; tiles_for holds what it chose).
# `paged1b`: the paged attention backend against sdpa on the 1B shape (tests, decode, kernels, 16k).
# `depth1b`: the depth gate on CUDA (the 1B shape past 32,768 positions, gates/depth.py; a later
# verdict stage reads its report) and ms per plain decode step at 4k and 16k tokens of context,
# sdpa against flex. On CUDA every gate stage judges both forwards (the reference and the
# compiled one, the CUDA default).
# BENCH_DEVICE and BENCH1B_SHAPE (default cuda and llama-1b) let a CPU run with the tiny shape
# check the stages' plumbing.
#
# Stage `startup` (not in the default list): what building an engine and its first request cost,
# compiling and graph capture included, with an empty inductor cache (cold) and the one that run
# filled (warm), each in a fresh process (`specgate bench --measure-startup`), on the fixtures and
# the 1B shape; STARTUP_ARGS adds options (e.g. --no-compile for the reference forward).
#
# The GPU machine has torch, transformers, safetensors, scipy, pytest and hypothesis but no
# internet: a package it lacks travels as wheels in .whl/ (docs/gpu.md). It brings back
# at most 8 files: PACK=1 packs every report into $OUT/gpu-check.tar.gz at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT=${OUT:-reports/gpu}
ROUNDS=${ROUNDS:-3}
REPEAT_GATES=${REPEAT_GATES:-lossless busy no-sync speed-ab}
PY=${PYTHON:-python3}
BENCH_DEVICE=${BENCH_DEVICE:-cuda}
GATE_DEVICE=${GATE_DEVICE:-cuda}  # cpu: a CPU run checks the gates stage's plumbing
BENCH1B_SHAPE=${BENCH1B_SHAPE:-llama-1b}
BENCH1B_DIR=${BENCH1B_DIR:-/tmp/specgate-bench/$BENCH1B_SHAPE-seed0}
# The spec legs' workload (specgate bench): 8 held-out prompts x 128 tokens, 3 legs (1 warm-up).
BENCH1B_LEG_ARGS=${BENCH1B_LEG_ARGS:---num-prompts 8 --max-tokens 128 --legs 3}
# The decode timer's: 64-token prompts, 128 tokens, 3 timed legs after a warm-up, the reference and
# the fused forward (bench-model decode).
BENCH1B_DECODE_ARGS=${BENCH1B_DECODE_ARGS:---prompt-len 64 --max-tokens 128 --legs 3 --compile off,on}
STARTUP_ARGS=${STARTUP_ARGS:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stages=${*:-env gates verdict prove bench}
summary=()
note() { summary+=("$1"); echo "== $1"; }
timed() {  # timed NAME COMMAND...: run, log to $OUT/NAME.log, remember rc and seconds
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    note "$(printf '%-16s rc=%-3s %5ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log")")"
    return $rc
}

long_context_leg() {  # long_context_leg CONTEXT BACKEND: ms per plain decode step at CONTEXT tokens, c=1 and 8
    timed "long-$1-$2" timeout "${DEPTH1B_LEG_TIMEOUT:-150}" "$PY" -m specgate_cli bench-model decode \
        --shape llama-1b-deep --device "$BENCH_DEVICE" --runners async --arm graph --concurrency 1,8 \
        --prompt-len "$1" --max-tokens 32 --legs 2 --attention-backends "$2" --json "$OUT/long-$1-$2.json"
}

if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

for stage in $stages; do
    case $stage in
    env)
        { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
          "$PY" - <<'PY'
import importlib, sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
for name in ("pytest", "hypothesis", "scipy", "safetensors", "tokenizers", "tqdm", "matplotlib", "transformers"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except ImportError as e:
        print(f"{name} MISSING ({e})")
PY
        } 2>&1 | tee "$OUT/env.txt"
        ;;
    gates)
        # With both forwards a round outgrows one 10-minute call: run it in parts, one call each,
        # e.g. PART=a GATES="lossless combine emit-count" GATES_TIMEOUT=560 (reports
        # gates-cuda-a-1.json ...; the later rounds repeat the REPEAT_GATES among GATES), then
        # `specgate gates verdict` over every part's reports. GATE_JOBS=N runs N gate processes at
        # once on the one GPU (gates/run.py; the timed gates, busy and speed-ab, still run alone).
        repeat=$REPEAT_GATES
        if [ -n "${GATES:-}" ]; then
            repeat=$(for g in $REPEAT_GATES; do [[ " $GATES " == *" $g "* ]] && printf '%s ' "$g"; done)
        fi
        for i in $(seq "$ROUNDS"); do
            names=$([ "$i" = 1 ] && echo "${GATES:-}" || echo "$repeat")
            [ "$i" = 1 ] || [ -n "$names" ] || continue
            report="$OUT/gates-cuda-${PART:+$PART-}$i"
            # TIMED_ARMS (e.g. graph): the arms the timed gates measure, every round; REPEAT_TIMED_ARMS
            # in the later rounds
            timed_arms=${TIMED_ARMS:-}
            [ "$i" = 1 ] || timed_arms=${REPEAT_TIMED_ARMS:-$timed_arms}
            arms=()
            [ -z "$timed_arms" ] || arms=(--timed-arms "$timed_arms")
            # shellcheck disable=SC2086  # the gate names are words
            timed "gates-cuda-${PART:+$PART-}$i" timeout "${GATES_TIMEOUT:-0}" "$PY" -m specgate_cli gates run $names \
                --device "$GATE_DEVICE" --jobs "${GATE_JOBS:-1}" "${arms[@]}" --json "$report.json" --junit "$report.xml"
        done
        ;;
    verdict)
        # Every round's reports, the 1B shape's where gates1b wrote one (a verdict without it would
        # not judge the model-sized gates, busy, speed-ab and no-sync, on the 1B shape), and
        # depth1b's where there is one (a red depth gate on CUDA keeps the veto in the same call).
        reports=("$OUT"/gates-cuda-*.json)
        for extra in gates1b depth1b; do
            [ ! -f "$OUT/$extra.json" ] || reports+=("$OUT/$extra.json")
        done
        timed verdict "$PY" -m specgate_cli gates verdict -v "${reports[@]}"
        ;;
    prove)
        # The CPU gates run on the CPU (16 cores there), the CUDA-only defects and the CUDA gates on
        # the GPU; the timed gates run alone after the rest (mutants/proof/prove.py).
        timed prove "$PY" -m specgate_cli prove --jobs "${PROVE_JOBS:-8}" \
            --json "$OUT/prove-cuda.json" --markdown "$OUT/prove-cuda.md"
        ;;
    bench)
        for runner in sync async; do
            timed "bench-$runner" "$PY" -m specgate_cli bench --device cuda --spec ngram --concurrency 1,8 --legs 4 \
                --"$runner"-runner --json "$OUT/bench-$runner.json" --plot "$OUT/bench-$runner.png"
        done
        ;;
    bench1b)
        B1=$BENCH1B_DIR
        timed bench1b-write "$PY" -m specgate_cli bench-model write --shape "$BENCH1B_SHAPE" --dir "$B1" || continue
        timed bench1b-load "$PY" -m specgate_cli bench --model "$B1" --device "$BENCH_DEVICE" --measure-load \
            --json "$OUT/bench1b-load.json"
        # shellcheck disable=SC2086  # BENCH1B_DECODE_ARGS is a list of words
        timed bench1b-decode "$PY" -m specgate_cli bench-model decode --model "$B1" --device "$BENCH_DEVICE" \
            --runners sync,async --arm graph --concurrency 1,8 $BENCH1B_DECODE_ARGS --json "$OUT/bench1b-decode.json"
        timed bench1b-peer "$PY" -m specgate_cli bench-model peer --model "$B1" --device "$BENCH_DEVICE" \
            --concurrency 1,8 --json "$OUT/bench1b-peer.json"
        spec=()
        if "$PY" -m specgate_cli bench --help 2>/dev/null | grep -q -- --oracle-tau; then
            legs=("plain")
            for tau in 4.3 2.5; do legs+=("oracle-$tau"); done
            for leg in "${legs[@]}"; do
                drafter=()
                [ "$leg" = plain ] || drafter=(--spec oracle --oracle-tau "${leg#oracle-}" --num-spec-tokens 4)
                # shellcheck disable=SC2086  # BENCH1B_LEG_ARGS is a list of words
                timed "bench1b-$leg" "$PY" -m specgate_cli bench --model "$B1" --device "$BENCH_DEVICE" --graph \
                    --async-runner --concurrency 1 $BENCH1B_LEG_ARGS "${drafter[@]}" \
                    --json "$OUT/bench1b-$leg.json" --plot "$OUT/bench1b-$leg.png" \
                    && spec+=(--spec "$leg=$OUT/bench1b-$leg.json")
            done
        else
            note "bench1b-spec     skipped: this tree has no oracle proposer (specgate bench --spec oracle --oracle-tau)"
        fi
        timed bench1b-summary "$PY" -m specgate_cli bench-model summary --decode "$OUT/bench1b-decode.json" \
            --peer "$OUT/bench1b-peer.json" --load "$OUT/bench1b-load.json" "${spec[@]}" \
            --json "$OUT/bench1b.json" --plot "$OUT/bench1b.png"
        ;;
    matmul1b)
        # What each weight matrix of the 1B shape reaches at M = 1, 8 and 40, per variant (cuBLAS,
        # inductor, max-autotune, coordinate descent); about 4 minutes, most of it autotuning.
        timed matmul1b-write "$PY" -m specgate_cli bench-model write --shape "$BENCH1B_SHAPE" --dir "$BENCH1B_DIR" \
            || continue
        # shellcheck disable=SC2086  # MATMUL1B_ARGS is a list of words
        timed matmul1b "$PY" -m specgate_cli bench-model matmul --model "$BENCH1B_DIR" --device "$BENCH_DEVICE" \
            ${MATMUL1B_ARGS:-} --json "$OUT/matmul1b.json"
        ;;
    tiles1b)
        # engine/gemv.py's one-token kernels on the 1B shape, every tile setting timed over 16 layers'
        # weights a graph replay, then a step's 64 kernels with tiles_for's tiles against the best
        # (scripts/gemv_tile_sweep.py, about 90 s on an H100).
        timed tiles1b "$PY" scripts/gemv_tile_sweep.py --json "$OUT/tiles1b.json"
        ;;
    depth1b)
        # The depth gate on CUDA (gates/depth.py's CUDA plan: the 1B shape with 40,960 positions,
        # written once to the bench-model cache, requests past 32,768 + 1,024), then ms per plain
        # decode step at long contexts, sdpa's gather against flex's paged read, c=1 and c=8
        # (DEPTH1B_CONTEXTS, default 4096 16384) and the paged kernel (DEPTH1B_BACKENDS, default sdpa flex
        # paged), each leg bounded so one call holds them all. The verdict stage reads depth1b.json
        # (its environment names the fixture target, which the gate does not run on: the depth
        # gate's `models` names the folder it ran on, and the verdict asks no model-size gates of it).
        timed depth1b "$PY" -m specgate_cli gates run depth --device "$BENCH_DEVICE" \
            --json "$OUT/depth1b.json" --junit "$OUT/depth1b.xml"
        for ctx in ${DEPTH1B_CONTEXTS:-4096 16384}; do
            for backend in ${DEPTH1B_BACKENDS:-sdpa flex paged}; do
                long_context_leg "$ctx" "$backend"
            done
        done
        ;;
    paged1b)
        # The paged attention backend (engine/paged_kernel.py) against sdpa on the 1B shape, in one
        # call of about 9 minutes: the kernel's CUDA tests, ms per plain decode step of the compiled
        # async graph arm at c=1 and c=8, kernels per step by class (eager arm; PAGED1B_KERNEL_BACKENDS,
        # default paged sdpa), and the paged
        # kernel at PAGED1B_CONTEXTS (default 16384) tokens of context (PAGED1B_LONG_BACKENDS, default
        # paged: the depth1b stage times sdpa there).
        timed paged1b-tests timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/engine/test_cuda_path.py \
            -k "paged and not compiled"
        timed paged1b-write "$PY" -m specgate_cli bench-model write --shape "$BENCH1B_SHAPE" --dir "$BENCH1B_DIR" \
            || continue
        timed paged1b-decode timeout 170 "$PY" -m specgate_cli bench-model decode --model "$BENCH1B_DIR" \
            --device "$BENCH_DEVICE" --runners async --arm graph --concurrency 1,8 --prompt-len 64 --max-tokens 96 \
            --legs 2 --compile on --attention-backends sdpa,paged --json "$OUT/paged1b-decode.json"
        for backend in ${PAGED1B_KERNEL_BACKENDS:-paged sdpa}; do
            timed "paged1b-kernels-$backend" timeout 80 "$PY" -m specgate_cli bench --model "$BENCH1B_DIR" \
                --device "$BENCH_DEVICE" --compile --concurrency 1,8 --num-prompts 8 --max-tokens 32 --legs 2 \
                --warmup-legs 1 --count-kernels --attention-backend "$backend" --json "$OUT/paged1b-kernels-$backend.json"
        done
        for ctx in ${PAGED1B_CONTEXTS:-16384}; do
            for backend in ${PAGED1B_LONG_BACKENDS:-paged}; do
                long_context_leg "$ctx" "$backend"
            done
        done
        ;;
    gates1b)
        timed gates1b-write "$PY" -m specgate_cli bench-model write --shape "$BENCH1B_SHAPE" --dir "$BENCH1B_DIR" \
            || continue
        # The fixture block drafter does not fit this target: its cases are skipped with the reason
        # and the ngram drafter runs every case; busy's level defaults to 0.95, as on every model.
        arms=()
        [ -z "${TIMED_ARMS:-}" ] || arms=(--timed-arms "$TIMED_ARMS")
        timed gates1b "$PY" -m specgate_cli gates run busy speed-ab no-sync --model "$BENCH1B_DIR" \
            --device "$BENCH_DEVICE" "${arms[@]}" --json "$OUT/gates1b.json" --junit "$OUT/gates1b.xml"
        ;;
    startup)
        # shellcheck disable=SC2086  # STARTUP_ARGS is a list of words
        timed startup "$PY" -m specgate_cli bench --measure-startup --device "$BENCH_DEVICE" --spec ngram --graph \
            $STARTUP_ARGS --json "$OUT/startup.json"
        timed startup1b-write "$PY" -m specgate_cli bench-model write --shape "$BENCH1B_SHAPE" --dir "$BENCH1B_DIR" \
            || continue
        # shellcheck disable=SC2086
        timed startup1b "$PY" -m specgate_cli bench --measure-startup --model "$BENCH1B_DIR" --device "$BENCH_DEVICE" \
            --spec ngram --graph $STARTUP_ARGS --json "$OUT/startup1b.json"
        ;;
    *) echo "gpu-check: unknown stage '$stage' (stages: env gates verdict prove bench bench1b matmul1b tiles1b paged1b gates1b depth1b startup)" >&2
       exit 2 ;;
    esac
done

echo
echo "stage            rc   seconds  last line"
printf '%s\n' "${summary[@]}"
if [ -f "$OUT/bench1b-summary.log" ] && [[ " $stages " == *" bench1b "* ]]; then
    echo
    grep -v '^wrote ' "$OUT/bench1b-summary.log"
fi
# The lent machine brings back at most 8 files from $OUT: PACK=1 leaves one archive of them all.
if [ "${PACK:-0}" = 1 ]; then
    tar -czf "$OUT/../gpu-check.tar.gz" -C "$OUT" . && find "$OUT" -mindepth 1 -delete \
        && mv "$OUT/../gpu-check.tar.gz" "$OUT/gpu-check.tar.gz" && echo "packed: $OUT/gpu-check.tar.gz"
fi
