# Session 24 call 4: the steady-state bench on the landed native/ and pyobmem/ (= b477544's)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
set -o pipefail
python3 scripts/bench_swap.py --parts gpt --fractions 0.75,0.6,0.5,0.9,0.4 --steps 70 --warmup 48 --ref-steps 8 --out-dir $OUT --time-budget $((572 - SECONDS)) 2>&1 | tee $OUT/bench_log.txt | tail -40
