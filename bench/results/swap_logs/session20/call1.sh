set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
make -C dev/e1 native WERROR= >/dev/null 2>&1 || { echo E1 BUILD FAILED; exit 1; }
git log --oneline -1 2>/dev/null
timeout 60 python3 dev/release_probe.py > $OUT/release_probe.json 2>$OUT/release_probe.err; cat $OUT/release_probe.json; tail -3 $OUT/release_probe.err
python3 dev/ab.py $OUT 16 base:0:-: o50:50:-: e50:50:dev/e1/pyobmem/libpyobmem.so: o60:60:-: e60:60:dev/e1/pyobmem/libpyobmem.so: e75:75:dev/e1/pyobmem/libpyobmem.so:
python3 - <<'P'
import json,os
d=json.load(open(os.environ["OUT"]+"/ab.json"))
for k,r in d.items():
    n=r.get("notes",{})
    for a in ("swap.waits","swap.host"):
        if a in n: print(k, a, n[a])
P
