#!/usr/bin/env bash
# The GPU check on the lent H200 (a command may run 10 minutes there): the environment, every
# gate on CUDA, then the GPU-deciding gates (REPEAT_GATES) again until ROUNDS clean runs in a row,
# the veto verdict over those runs, the proof
# with the CUDA-only defects, and a bench. Reports (JSON, JUnit, Markdown, PNG, logs) go under
# $OUT (default reports/gpu); a short table is printed last. Stages: env gates verdict prove bench
# (default: all of them), e.g. `scripts/gpu-check.sh env gates verdict`.
#
# The GPU machine has torch, transformers, safetensors, scipy, pytest and hypothesis but no
# internet: a package it lacks travels as wheels in .whl/ (README, "On the GPU").
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-reports/gpu}
ROUNDS=${ROUNDS:-3}
REPEAT_GATES=${REPEAT_GATES:-lossless busy no-sync speed-ab}
PY=${PYTHON:-python3}
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

if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

for stage in $stages; do
    case $stage in
    env)
        { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
          $PY - <<'PY'
import importlib, sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}, "
      f"device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
for name in ("pytest", "hypothesis", "scipy", "safetensors", "tokenizers", "tqdm", "matplotlib"):
    try:
        print(f"{name} {importlib.import_module(name).__version__}")
    except ImportError as e:
        print(f"{name} MISSING ({e})")
PY
        } 2>&1 | tee "$OUT/env.txt"
        ;;
    gates)
        for i in $(seq "$ROUNDS"); do
            names=$([ "$i" = 1 ] || echo "$REPEAT_GATES")
            # shellcheck disable=SC2086  # the gate names are words
            timed "gates-cuda-$i" $PY -m specgate_cli gates run $names --device cuda \
                --json "$OUT/gates-cuda-$i.json" --junit "$OUT/gates-cuda-$i.xml"
        done
        ;;
    verdict)
        timed verdict $PY -m specgate_cli gates verdict -v "$OUT"/gates-cuda-*.json
        ;;
    prove)
        # The CPU gates run on the CPU (16 cores there), the CUDA-only defects and the CUDA gates on
        # the GPU; the timed gates run alone after the rest (mutants/prove.py).
        timed prove $PY -m specgate_cli prove --jobs "${PROVE_JOBS:-8}" \
            --json "$OUT/prove-cuda.json" --markdown "$OUT/prove-cuda.md"
        ;;
    bench)
        for runner in sync async; do
            timed "bench-$runner" $PY -m specgate_cli bench --device cuda --spec ngram --concurrency 1,8 --legs 4 \
                --"$runner"-runner --json "$OUT/bench-$runner.json" --plot "$OUT/bench-$runner.png"
        done
        ;;
    *) echo "gpu-check: unknown stage '$stage' (stages: env gates verdict prove bench)" >&2; exit 2 ;;
    esac
done

echo
echo "stage            rc   seconds  last line"
printf '%s\n' "${summary[@]}"
