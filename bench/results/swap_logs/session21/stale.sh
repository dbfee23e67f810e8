# Session 21: the stale JSONs (frameworks, oversubscribed, alloc path) on the landed tree.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
mkdir -p $OUT/bench
python3 scripts/bench_swap.py --parts frameworks --steps 25 --out-dir $OUT/bench --time-budget 230 > $OUT/frameworks_log.txt 2>&1; echo frameworks rc $?
tail -5 $OUT/frameworks_log.txt
python3 scripts/bench_swap.py --parts oversubscribed --steps 25 --out-dir $OUT/bench --time-budget 150 > $OUT/oversub_log.txt 2>&1; echo oversub rc $?
tail -5 $OUT/oversub_log.txt
python3 scripts/bench_alloc_path.py --steps 15 --out $OUT/bench/alloc_path.json > $OUT/alloc_log.txt 2>&1; echo alloc rc $?
tail -8 $OUT/alloc_log.txt
ls -la $OUT/bench
