# Session 25 call 1: the slow-call log (PYOBMEM_SLOW_LOG) at 50% (s50: where the host's 46 ms at the
# embedding's backward goes), and PYOBMEM_FREE_WAIT=0 at 50% (f50: the budget never waits for frees), 50 steps.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
git log --oneline -1
KEEP=s50 python3 dev/ab.py $OUT 50 base:0:-: s50:50:-:PYOBMEM_SLOW_LOG=$OUT/s50_slow.tsv f50:50:-:PYOBMEM_FREE_WAIT=0,PYOBMEM_SLOW_LOG=$OUT/f50_slow.tsv
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][20:50])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "steps 20-49", round(statistics.median(s[20:50])/b,4) if s else None, "last5", r.get("last5"))
    n=r.get("notes",{})
    for a in ("swap.waits","swap.app_syncs","swap.host"):
        if a in n: print(k, a, n[a])
P
timeout 120 python3 dev/slowgaps.py $OUT/s50.pyobmem $OUT/s50_slow.tsv --from-frac 0.6 --to-frac 0.64 --min-ms 3 > $OUT/s50_gaps.txt 2>&1
T=tests/data/gpt_medium_tensors.pyobmem; S=$OUT/s50.pyobmem
timeout 150 python3 scripts/swap_anatomy.py $T $S --iteration 30 --section gpu,gaps --top 25 > $OUT/s50_anatomy.txt 2>&1
head -c 6000 $OUT/s50_gaps.txt; tail -3 $OUT/s50_gaps.txt
gzip $OUT/*.tsv
rm -f $OUT/*.pyobmem
