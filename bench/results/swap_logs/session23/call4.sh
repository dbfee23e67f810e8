set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
date "+%s.%N %Y/%m/%d %H:%M:%S" > $OUT/clock.txt; nvidia-smi --query-gpu=timestamp,memory.used --format=csv,noheader,nounits -lms 20 > $OUT/smi.csv 2>/dev/null &
SMI=$!
KEEP=m75,m60,m50,m40 python3 dev/ab.py $OUT 70 base:0:-: m75:75:-: m60:60:-: m50:50:-: m40:40:-:
kill $SMI
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][-20:])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "last20", round(statistics.median(s[-20:])/b,4) if s else None, s)
for k in ("m75","m60","m50","m40"):
    f=os.environ["OUT"]+f"/{k}.plans.json"
    if os.path.exists(f):
        for x in json.load(open(f))["plans"]: print(k, x["generation"], x["written_s"], x["chosen_by_replay"], x.get("restores"), x.get("trial"))
P
rm -f $OUT/*.pyobmem
