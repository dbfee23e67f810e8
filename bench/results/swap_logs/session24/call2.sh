# Session 24 call 2: chunked physical memory (k: this tree) against main (m: dev/m = b477544), 70 steps,
# then the swap GPU tests with what time is left.
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
make -C dev/m native WERROR= >/dev/null 2>&1 || { echo dev/m BUILD FAILED; exit 1; }
date "+%s.%N %Y/%m/%d %H:%M:%S" > $OUT/clock.txt; nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 20 > $OUT/smi.csv 2>/dev/null &
SMI=$!
KEEP=k50,k60 python3 dev/ab.py $OUT 70 base:0:-: k50:50:-: m50:50:-:TREE=dev/m k60:60:-:
kill $SMI
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][-20:])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "last20", round(statistics.median(s[-20:])/b,4) if s else None, s)
    n=r.get("notes",{})
    for a in ("swap.waits","swap.app_syncs","swap.host","swap.releases"):
        if a in n: print(k, a, n[a])
for k in ("k50","k60"):
    f=os.environ["OUT"]+f"/{k}.plans.json"
    if os.path.exists(f):
        for x in json.load(open(f))["plans"]: print(k, x["generation"], x["written_s"], x["chosen_by_replay"], x.get("restores"), x.get("trial"))
P
rm -f $OUT/*.pyobmem
left=$((570 - SECONDS)); echo "gpu tests: ${left}s"
[ $left -gt 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider tests/gpu/test_swap_roundtrip.py tests/gpu/test_swap_c14_async.py tests/gpu/test_swap_c17_vmm.py tests/gpu/test_swap_c09_pointer_table.py tests/gpu/test_swap_budget.py tests/gpu/test_swap_c10_graphs.py 2>&1 | tail -15
