# Session 25 call 4 (the tree that lands): GPT medium at 60%, 70 steps, median of the last 20
# against the unswapped run, then the swap GPU tests with what time is left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
make native WERROR= >/dev/null 2>&1 || { echo BUILD FAILED; exit 1; }
python3 dev/ab.py $OUT 70 base:0:-: p60:60:-:
python3 - <<'P'
import json,os,statistics
d=json.load(open(os.environ["OUT"]+"/ab.json"))
b=statistics.median(d["base"]["step_ms"][-20:])
for k,r in d.items():
    s=r.get("step_ms") or []
    print(k, "last20", round(statistics.median(s[-20:])/b,4) if s else None, "steps 48-69", round(statistics.median(s[48:70])/b,4) if s else None)
P
left=$((560 - SECONDS)); echo "gpu tests: ${left}s"
[ $left -gt 30 ] && timeout $left python3 -m pytest -q -p no:cacheprovider tests/gpu/test_swap_roundtrip.py tests/gpu/test_swap_c14_async.py tests/gpu/test_swap_c17_vmm.py tests/gpu/test_swap_c09_pointer_table.py tests/gpu/test_swap_budget.py tests/gpu/test_swap_c10_graphs.py 2>&1 | tail -15
