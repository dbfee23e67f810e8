# Session 25 call 2: PYOBMEM_HANDOFF_AFTER_OPS at 50% (a swap-out's memory is not handed over until
# N ops after an op last named its block: the stale parameter words' demand swap-ins wait for
# copies out of handed-over memory), 0 / 6 / 16, with the slow-call log's named_out lines; 50 steps.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
git log --oneline -1
python3 dev/ab.py $OUT 50 base:0:-: m50:50:-:PYOBMEM_SLOW_LOG=$OUT/m50_slow.tsv r6:50:-:PYOBMEM_HANDOFF_AFTER_OPS=6,PYOBMEM_SLOW_LOG=$OUT/r6_slow.tsv r16:50:-:PYOBMEM_HANDOFF_AFTER_OPS=16,PYOBMEM_SLOW_LOG=$OUT/r16_slow.tsv
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][20:50])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "steps 20-49", round(statistics.median(s[20:50])/b,4) if s else None, "last5", r.get("last5"))
    n=r.get("notes",{})
    for a in ("swap.waits","swap.app_syncs"):
        if a in n: print(k, a, n[a])
P
for f in $OUT/*_slow.tsv; do echo "$f: named_out by state and ops_since (steady state: second half)"; n=$(wc -l < $f); tail -n $((n/2)) $f | awk -F'\t' '$2=="named_out" {print $5, ($19<4?$19:($19<16?"4-15":($19<64?"16-63":"64+")))}' | sort | uniq -c; done
gzip $OUT/*.tsv
