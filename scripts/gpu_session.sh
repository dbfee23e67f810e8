#!/usr/bin/env bash
# The one script a device call runs on the GPU machine, from the repository root:
#
#     scripts/gpu_session.sh [build] [tests] [fixtures] [trace] [overhead] [cost] [captures] [collect]
#
# Default: build tests trace overhead (collect always runs at the end, and after trace/overhead).
#   build     pip-install the carried wheels (.whl/*.whl, e.g. cffi) into /tmp/site, `make native`
#   tests     python3 -m pytest -m gpu tests/gpu -q            -> $OUT/gpu_tests.txt
#   fixtures  trace gpt.py --size tiny --steps 10 into $CAPS      (also done by `trace`)
#   trace     fixtures + scripts/bench_trace.py --capture-dir $CAPS -> $OUT/trace.txt
#   overhead  scripts/bench_trace_overhead.py --only gpt --only mlp --repeats $REPEATS -> $OUT/overhead.txt
#   cost      scripts/bench_trace_overhead.py --only lstm --only ops (the LSTM LM in 10 rounds, op_cost.cu's
#             us per op kind; about 3.5 minutes)                   -> $OUT/cost.txt
#   captures  trace GPT medium (12 steps) and the CNN (20 steps) into $CAPS for the pattern
#             analysis (done on the dev machine), and run the export tests that need torch
#   swaptests tests/gpu/test_swap_*.py (and test_multigpu.py)         -> $OUT/gpu_tests.txt
#   bench     scripts/bench_swap.py --parts $PARTS (default all three) -> bench/results/swap_*.json
#   allocpath scripts/bench_alloc_path.py (GPT medium with and without swap mode's allocator, the
#             allocation loop)                                    -> bench/results/alloc_path.json
#   swapsmoke tiny GPT, GPT small, CNN without pyobmem and under --swap: scripts/swap_check.py -> $OUT/swap.txt
#   collect   bench/results/*.json -> $OUT/results.tar.gz; captures under 4 MiB (with their
#             workload JSON and stdout) -> $OUT/captures.tar.gz
# Every step is logged with timestamps and its exit status in $OUT/log.txt; a failing step does not
# stop the next. Each step's time limit is its default (T_<step>=seconds overrides) capped by what is
# left of SESSION_BUDGET (default 540 s), keeping COLLECT_RESERVE (20 s) for the final collect.
# The launcher is `python3 -m pyobmem run`; PYTHONPATH is /tmp/site and the repository.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/out}
CAPS=${CAPS:-/tmp/caps}
REPEATS=${REPEATS:-3}
SESSION_BUDGET=${SESSION_BUDGET:-540}
COLLECT_RESERVE=${COLLECT_RESERVE:-20}
CAPTURE_MAX=${CAPTURE_MAX:-$((12 * 1024 * 1024))}
SITE=/tmp/site
mkdir -p "$OUT" "$CAPS"
LOG=$OUT/log.txt
START=$(date +%s)
export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

log() { echo "[$(date '+%F %T')] $*" >>"$LOG"; echo "[$(date '+%T')] $*"; }

SUMMARY=()
LAST_RC=0
# run_step NAME DEFAULT_LIMIT OUTFILE CMD...: run CMD with output appended to OUTFILE, record rc.
run_step() {
    local name=$1 def=$2 outfile=$3
    shift 3
    local var="T_$name" limit left
    limit=${!var:-$def}
    left=$(( SESSION_BUDGET - COLLECT_RESERVE - ($(date +%s) - START) ))
    if (( left < 10 )); then
        log "== $name: skipped, session budget spent"
        SUMMARY+=("$name: skipped (budget)")
        return 0
    fi
    (( limit > left )) && limit=$left
    log "== $name (limit ${limit}s): $*"
    local t0=$(date +%s) rc
    timeout -k 10 "$limit" "$@" >>"$outfile" 2>&1
    rc=$?
    LAST_RC=$rc
    (( rc == 124 || rc == 137 )) && log "== $name: TIMED OUT after ${limit}s"
    log "== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
    SUMMARY+=("$name: rc=$rc ($(( $(date +%s) - t0 ))s)")
    return 0
}

setup() {
    log "session start in $REPO, steps: $*"
    { nvidia-smi -L 2>&1; python3 --version 2>&1
      python3 - <<'PY' 2>&1
import importlib.metadata as m
for p in ("torch", "jax", "jaxlib", "jax-cuda13-plugin", "cupy-cuda13x", "numpy", "scipy", "pytest", "cffi"):
    try:
        print(f"{p} {m.version(p)}")
    except m.PackageNotFoundError:
        print(f"{p} (not installed)")
PY
      git log -1 --oneline 2>/dev/null; git status --short 2>/dev/null | head -40; } >>"$LOG" 2>&1
}

install_wheels() {
    if compgen -G ".whl/*.whl" >/dev/null; then
        if [[ -f $SITE/.pyobmem-wheels ]]; then
            log "wheels already installed in $SITE"
        else
            run_step wheels 120 "$LOG" python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
            (( LAST_RC == 0 )) && touch "$SITE/.pyobmem-wheels"
        fi
    else
        log "no .whl/*.whl to install"
    fi
}

step_build() {
    run_step build 240 "$LOG" make native
    run_step import 60 "$LOG" python3 -c "import pyobmem, pyobmem.capture, pyobmem.abi; print('pyobmem imports from', pyobmem.__file__)"
}

step_tests() {
    if [[ -d tests/gpu ]]; then
        run_step tests 300 "$OUT/gpu_tests.txt" python3 -m pytest -m gpu tests/gpu -q -p no:cacheprovider
    else
        log "== tests: no tests/gpu directory, skipped" | tee -a "$OUT/gpu_tests.txt"
        SUMMARY+=("tests: skipped (no tests/gpu)")
    fi
}

FIXTURES_DONE=0
step_fixtures() {
    (( FIXTURES_DONE )) && return 0
    FIXTURES_DONE=1
    rm -f "$CAPS/gpt_tiny.pyobmem" "$CAPS/gpt_tiny.json"
    run_step fixtures 120 "$CAPS/gpt_tiny.stdout.txt" python3 -m pyobmem run -f -o "$CAPS/gpt_tiny.pyobmem" -- \
        python3 scripts/workloads/gpt.py --size tiny --steps 10 --deterministic --seed 0 --json "$CAPS/gpt_tiny.json"
    tail -n 20 "$CAPS/gpt_tiny.stdout.txt" >>"$LOG" 2>/dev/null
}

step_trace() {
    step_fixtures
    run_step trace 360 "$OUT/trace.txt" python3 scripts/bench_trace.py --capture-dir "$CAPS"
    step_collect
}

step_overhead() {
    run_step overhead 360 "$OUT/overhead.txt" python3 scripts/bench_trace_overhead.py --only gpt --only mlp \
        --repeats "$REPEATS"
    step_collect
}

step_cost() {
    run_step cost 270 "$OUT/cost.txt" python3 scripts/bench_trace_overhead.py --only lstm --only ops
    step_collect
}

step_captures() {
    run_step gpt_medium 150 "$CAPS/gpt_medium.stdout.txt" python3 -m pyobmem run -f -o "$CAPS/gpt_medium.pyobmem" -- \
        python3 scripts/workloads/gpt.py --size medium --steps 12 --deterministic --seed 0 --json "$CAPS/gpt_medium.json"
    run_step cnn 120 "$CAPS/cnn.stdout.txt" python3 -m pyobmem run -f -o "$CAPS/cnn.pyobmem" -- \
        python3 scripts/workloads/cnn.py --steps 20 --deterministic --seed 0 --json "$CAPS/cnn.json"
    run_step export_tests 120 "$OUT/gpu_tests.txt" python3 -m pytest -q -p no:cacheprovider tests/test_export_memory_viz.py
    step_collect
}

# swap_pair NAME BUDGET MINSWAP WORKLOAD ARGS...: the workload without pyobmem, then under --swap; the
# comparison (losses, step times, swaps, notes) goes to $OUT/swap.txt.
swap_pair() {
    local name=$1 budget=$2 minswap=$3
    shift 3
    run_step "${name}_base" 150 "$CAPS/${name}_base.stdout.txt" python3 "$@" --json "$CAPS/${name}_base.json"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 20 >"$CAPS/${name}_smi.csv" 2>/dev/null &
    local smi=$!
    run_step "${name}_swap" 200 "$CAPS/${name}_swap.stdout.txt" python3 -m pyobmem run --swap --budget "$budget" \
        --min-swap-bytes "$minswap" -f -o "$CAPS/${name}_swap.pyobmem" -- python3 "$@" --json "$CAPS/${name}_swap.json"
    kill $smi 2>/dev/null
    { echo "=== $name: budget $budget, min swap $minswap: $*"; tail -n 40 "$CAPS/${name}_swap.stdout.txt"; } >>"$OUT/swap.txt" 2>/dev/null
    run_step "${name}_check" 120 "$OUT/swap.txt" python3 scripts/swap_check.py "$CAPS/${name}_base.json" \
        "$CAPS/${name}_swap.json" "$CAPS/${name}_swap.pyobmem" "$CAPS/${name}_smi.csv"
}

step_swaptests() {
    run_step swaptests 360 "$OUT/gpu_tests.txt" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
        ${SWAPTESTS:-tests/gpu/test_swap_*.py $(ls tests/gpu/test_multigpu.py 2>/dev/null)}
}

step_bench() {
    run_step bench 560 "$OUT/bench_swap.txt" python3 scripts/bench_swap.py --parts "${PARTS:-gpt,frameworks,oversubscribed}" \
        --capture-dir "$CAPS" ${BENCH_ARGS:-}
    step_collect
}

step_allocpath() {
    run_step allocpath 300 "$OUT/alloc_path.txt" python3 scripts/bench_alloc_path.py ${ALLOC_ARGS:-}
    step_collect
}

step_swapsmoke() {
    swap_pair tiny 500MiB 2MiB scripts/workloads/gpt.py --size tiny --steps 30 --deterministic --seed 0
    swap_pair small12 12GiB 4MiB scripts/workloads/gpt.py --size small --steps 30 --deterministic --seed 0
    swap_pair small8 8GiB 4MiB scripts/workloads/gpt.py --size small --steps 30 --deterministic --seed 0
    swap_pair cnn 400MiB 4MiB scripts/workloads/cnn.py --steps 30 --deterministic --seed 0
    step_collect
}

COLLECTED=0
step_collect() {
    COLLECTED=1
    local f base keep=() size
    if compgen -G "bench/results/*.json" >/dev/null; then
        tar -czf "$OUT/results.tar.gz" bench/results/*.json && log "collect: results.tar.gz ($(ls bench/results/*.json | wc -l) files)"
    else
        log "collect: no bench/results/*.json yet"
    fi
    for f in "$CAPS"/*.pyobmem; do
        [[ -f $f ]] || continue
        size=$(stat -c %s "$f")
        base=${f%.pyobmem}
        if (( size < CAPTURE_MAX )); then
            keep+=("$(basename "$f")")
            for c in "$base.json" "$base.stdout.txt"; do [[ -f $c ]] && keep+=("$(basename "$c")"); done
        else
            log "collect: $(basename "$f") is $size bytes, not copied back"
        fi
    done
    if (( ${#keep[@]} )); then
        tar -czf "$OUT/captures.tar.gz" -C "$CAPS" "${keep[@]}" && log "collect: captures.tar.gz: ${keep[*]}"
        size=$(stat -c %s "$OUT/captures.tar.gz")
        (( size > 16 * 1024 * 1024 )) && log "collect: WARNING captures.tar.gz is $size bytes (> 16 MiB limit)"
    else
        log "collect: no capture under $CAPTURE_MAX bytes in $CAPS"
    fi
}

STEPS=("$@")
(( ${#STEPS[@]} )) || STEPS=(build tests trace overhead)
for s in "${STEPS[@]}"; do
    case $s in build|tests|fixtures|trace|overhead|cost|captures|swapsmoke|swaptests|bench|allocpath|collect) ;;
        *) echo "gpu_session.sh: error: unknown step '$s' (build tests fixtures trace overhead cost captures swapsmoke swaptests bench allocpath collect)" >&2; exit 2 ;;
    esac
done

setup "${STEPS[@]}"
install_wheels
for s in "${STEPS[@]}"; do
    COLLECTED=0
    "step_$s"
done
(( COLLECTED )) || step_collect
log "summary: ${SUMMARY[*]:-nothing ran}"
log "session end after $(( $(date +%s) - START ))s"
for s in "${SUMMARY[@]}"; do echo "  $s"; done | tee -a "$LOG"
