set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
make -C dev/e1 native WERROR= >/dev/null 2>&1 || { echo E1 BUILD FAILED; exit 1; }
make -C dev/e2 native WERROR= >/dev/null 2>&1 || { echo E2 BUILD FAILED; exit 1; }
E1=dev/e1/pyobmem/libpyobmem.so; E2=dev/e2/pyobmem/libpyobmem.so
python3 dev/ab.py $OUT 16 base:0:-: f50:50:$E2: e50:50:$E1: o50:50:-: f50b:50:$E2: e50b:50:$E1:
python3 - <<'P'
import json,os
d=json.load(open(os.environ["OUT"]+"/ab.json"))
for k,r in d.items():
    n=r.get("notes",{})
    for a in ("swap.waits","swap.host"):
        if a in n: print(k, a, n[a])
P
