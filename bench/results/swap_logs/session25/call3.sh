# Session 25 call 3: the bench at 60% and 50% (70 steps, the steady state after the daemon's trial)
# on this tree, then a 50% run with the slow-call log and its anatomy (--slow-log), 50 steps.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
git log --oneline -1
mkdir -p $OUT/bench
python3 scripts/bench_swap.py --parts gpt --fractions 0.6,0.5 --steps 70 --warmup 48 --ref-steps 8 --out-dir $OUT/bench --time-budget 330 > $OUT/bench_log.txt 2>&1
tail -25 $OUT/bench_log.txt
KEEP=s50 python3 dev/ab.py $OUT 50 s50:50:-:PYOBMEM_SLOW_LOG=$OUT/s50_slow.tsv
T=tests/data/gpt_medium_tensors.pyobmem; S=$OUT/s50.pyobmem
timeout 120 python3 scripts/swap_anatomy.py $T $S --iteration 30 --section gpu,gaps --top 20 --slow-log $OUT/s50_slow.tsv > $OUT/s50_anatomy.txt 2>&1
sed -n '/== gaps/,$p' $OUT/s50_anatomy.txt | head -70
gzip $OUT/*.tsv
rm -f $OUT/*.pyobmem
