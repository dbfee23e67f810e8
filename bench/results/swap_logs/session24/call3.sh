# Session 24 call 3 (main's native/ and pyobmem/ = b477544): where GPT medium's step at 50% goes
# (swap_anatomy of m50, the cover's steady state), and PYOBMEM_SYNC_HOLD=0 at 50% (h50), 50 steps.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
KEEP=m50 python3 dev/ab.py $OUT 50 base:0:-: m50:50:-: h50:50:-:PYOBMEM_SYNC_HOLD=0
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][20:36])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "steps 20-35", round(statistics.median(s[20:36])/b,4) if s else None, "last5", r.get("last5"), s)
    n=r.get("notes",{})
    for a in ("swap.waits","swap.app_syncs"):
        if a in n: print(k, a, n[a])
P
T=tests/data/gpt_medium_tensors.pyobmem; S=$OUT/m50.pyobmem
timeout 150 python3 scripts/swap_anatomy.py $T $S --iteration 30 --top 25 > $OUT/m50_anatomy.txt 2>&1
timeout 60 python3 scripts/swap_anatomy.py $T $S --iteration 30 --section gaps,handoffs,host --from 1280 --min-gap-ms 0.5 > $OUT/m50_step_end.txt 2>&1
timeout 60 python3 scripts/swap_anatomy.py $T $S --iteration 31 --section gaps,handoffs --to 80 --min-gap-ms 0.5 > $OUT/m50_step_start.txt 2>&1
head -c 3000 $OUT/m50_step_end.txt
rm -f $OUT/*.pyobmem
