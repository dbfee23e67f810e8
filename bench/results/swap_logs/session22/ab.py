"""Device A/B: GPT medium, swap at given budgets, several shims/envs; median of the last 5 steps.
usage: ab.py OUT STEPS RUN... where RUN = label:fraction:shim:ENV=V,ENV=V (shim '-' = built one;
fraction 0 = unmodified, no pyobmem)."""
import json, os, statistics, subprocess, sys, time
sys.path.insert(0, os.getcwd())
from pyobmem.capture import read_capture

BUD = {"75": 27821342720, "60": 22100207206, "50": 18286116864, "40": 14472026521}
out, steps = sys.argv[1], int(sys.argv[2])
gpt = ["python3", "scripts/workloads/gpt.py", "--size", "medium", "--batch", "8", "--seq", "1024",
       "--deterministic", "--seed", "0", "--steps", str(steps)]
res = {}
for spec in sys.argv[3:]:
    label, frac, shim, envs = (spec.split(":") + [""])[:4]
    env = dict(os.environ)
    for kv in filter(None, envs.split(",")):
        k, v = kv.split("=", 1)
        env[k] = v
    # TREE=dir: another tree's Python and its built shim, run from that tree (python -m puts the
    # working directory first on sys.path: PYTHONPATH alone still ran this tree's, session 22)
    cwd = os.path.abspath(env.pop("TREE", "."))
    env["PYTHONPATH"] = "/tmp/site:" + cwd
    if shim != "-":
        env["PYOBMEM_SHIM"] = os.path.abspath(shim)
    js, cap = f"/tmp/{label}.json", f"/tmp/{label}.pyobmem"
    cmd = gpt + ["--json", js]
    if frac != "0":
        cmd = ["python3", "-m", "pyobmem", "run", "--swap", "--budget", str(BUD[frac]), "-q", "-f", "-o", cap, "--"] + cmd
    t0 = time.time()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, cwd=cwd)
    wall = time.time() - t0
    r = {"rc": p.returncode, "wall_s": round(wall, 1)}
    try:
        d = json.load(open(js))
        r["step_ms"] = [round(x, 1) for x in d["step_ms"]]
        r["losses"] = d["losses"]
        r["last5"] = statistics.median(d["step_ms"][-5:])
    except Exception as e:
        r["err"] = str(e) + p.stderr[-1500:]
    if frac != "0" and os.path.exists(cap):
        c = read_capture(cap)
        r["notes"] = {k: v for d in c.notes.values() for k, v in d.items() if k.startswith("swap")}
        if label in os.environ.get("KEEP", "").split(","):
            import shutil; shutil.copy(cap, f"{out}/{label}.pyobmem")
        os.remove(cap)
    r["dev"] = [l for l in p.stderr.splitlines() if "pyobmem: swap" in l or "dev" in l.lower()][-20:]
    res[label] = r
    base = res.get("base", {}).get("last5")
    print(label, r["rc"], r.get("last5"), round(r["last5"] / base, 4) if base and r.get("last5") else "", r["wall_s"], flush=True)
    json.dump(res, open(f"{out}/ab.json", "w"), indent=1, default=str)
base = res.get("base", {})
for k, r in res.items():
    same = r.get("losses") == base.get("losses")
    print(k, "losses equal to base:", same)
