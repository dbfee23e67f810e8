# Session 20's A/B calls: bash calls.sh RUN... (dev/ab.py's runs, label:fraction:shim:ENV=V).
# Call 1: base:0:-: o50:50:-: e50:50:$E1: o60:60:-: e60:60:$E1: e75:75:$E1: (and release_probe.py first)
# Call 2: base:0:-: f50:50:$E2: e50:50:$E1: o50:50:-: f50b:50:$E2: e50b:50:$E1:
# with E1=dev/e1/pyobmem/libpyobmem.so (e1_alternate_streams.patch on b680344) and E2=dev/e2/...
# (f254f4f's change on b680344), each a worktree under dev/. TREES: the worktrees to build
# (session 21: TREES=dev/g; session 22: TREES="dev/p dev/q").
set -x
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
for t in ${TREES:-dev/e1 dev/e2}; do
    [ -d $t ] && { make -C $t native WERROR= >/dev/null 2>&1 || { echo $t BUILD FAILED; exit 1; }; }
done
[ "${PROBE:-0}" = 1 ] && { timeout 60 python3 bench/results/swap_logs/session20/release_probe.py > $OUT/release_probe.json 2>$OUT/release_probe.err; cat $OUT/release_probe.json; }
python3 dev/ab.py $OUT 16 "$@"
python3 - <<'P'
import json,os
d=json.load(open(os.environ["OUT"]+"/ab.json"))
for k,r in d.items():
    n=r.get("notes",{})
    for a in ("swap.waits","swap.app_syncs","swap.host","swap.releases"):
        if a in n: print(k, a, n[a])
P
