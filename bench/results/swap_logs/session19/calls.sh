set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
git log --oneline -1 2>/dev/null
python3 dev/ab.py $OUT 16 base:0:-: o50:50:-: n50:50:dev/new/libpyobmem.so: o60:60:-: n60:60:dev/new/libpyobmem.so: o75:75:-:
python3 - <<'P'
import json,os
d=json.load(open(os.environ["OUT"]+"/ab.json"))
for k,r in d.items():
    n=r.get("notes",{})
    for a in ("swap.waits","swap.host","swap.app_syncs"):
        if a in n: print(k, a, n[a])
P
