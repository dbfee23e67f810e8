# Session 25 call 5 (the tree that lands): GPT medium at 50% with the slow-call log (30 steps) and
# swap_anatomy --slow-log of it, then the swap GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
KEEP=s50 python3 dev/ab.py $OUT 30 s50:50:-:PYOBMEM_SLOW_LOG=$OUT/s50_slow.tsv
T=tests/data/gpt_medium_tensors.pyobmem; S=$OUT/s50.pyobmem
timeout 100 python3 scripts/swap_anatomy.py $T $S --section gaps --top 12 --slow-log $OUT/s50_slow.tsv > $OUT/s50_anatomy.txt 2>&1; echo "anatomy rc $?"
head -60 $OUT/s50_anatomy.txt
awk -F'\t' 'NR>1 {c[$3]++} END {for (k in c) print k, c[k]}' $OUT/s50_slow.tsv
gzip $OUT/*.tsv; rm -f $OUT/*.pyobmem
left=$((560 - SECONDS)); echo "gpu tests: ${left}s"
[ $left -gt 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider tests/gpu/test_swap_roundtrip.py tests/gpu/test_swap_c14_async.py tests/gpu/test_swap_c17_vmm.py tests/gpu/test_swap_c09_pointer_table.py tests/gpu/test_swap_budget.py tests/gpu/test_swap_c10_graphs.py 2>&1 | tail -15
