"""Host gaps of a swap capture with the slow-call log's lines inside each.
usage: slowgaps.py CAPTURE SLOW.tsv [--from-frac 0.5 --to-frac 0.62 --min-ms 5]"""
import argparse, csv, sys, os
import numpy as np
sys.path.insert(0, os.getcwd())
from pyobmem.capture import read_capture
ap = argparse.ArgumentParser()
ap.add_argument("capture"); ap.add_argument("slow")
ap.add_argument("--from-frac", type=float, default=0.5); ap.add_argument("--to-frac", type=float, default=0.62)
ap.add_argument("--min-ms", type=float, default=5)
a = ap.parse_args()
c = read_capture(a.capture)
ops = c.ops
pid = np.bincount(ops["pid"]).argmax()
rows = np.flatnonzero(ops["pid"] == pid)
ts = ops["ts_ns"][rows]
lo, hi = ts[0] + (ts[-1] - ts[0]) * a.from_frac, ts[0] + (ts[-1] - ts[0]) * a.to_frac
slow = list(csv.DictReader(open(a.slow), delimiter="\t"))
st = np.array([int(r["t_ns"]) for r in slow])
gaps = np.flatnonzero(np.diff(ts) > a.min_ms * 1e6)
tot = {}
for g in gaps:
    if not (lo <= ts[g] <= hi):
        continue
    t0, t1 = ts[g], ts[g + 1]
    print(f"gap {(t1 - t0) / 1e6:7.2f} ms at +{(t0 - ts[0]) / 1e9:8.3f} s before {c.kernel_name(rows[g + 1])[:50]}")
    for i in np.flatnonzero((st >= t0 - 200_000) & (st <= t1)):
        r = slow[i]
        extra = " ".join(f"{k[:-3] if k.endswith('_us') else k}={v}" for k, v in r.items()
                         if k not in ("t_ns", "call", "pos", "us", "after") and v not in ("0", "-"))
        print(f"    +{(st[i] - t0) / 1e6:6.2f} {r['call']:<12} pos={r['pos']:>5} {int(r['us']) / 1000:7.2f} ms"
              f" after={r['after']} {extra}")
# the whole log, by call: ms and count
by = {}
for r in slow:
    k = r["call"] + ("/" + r["after"] if r["call"] == "outside" else "")
    n, ms = by.get(k, (0, 0.0)); by[k] = (n + 1, ms + int(r["us"]) / 1000)
print("slow lines by call (count, ms):", {k: (n, round(ms)) for k, (n, ms) in sorted(by.items(), key=lambda x: -x[1][1])})
cols = ["free_wait_us", "drain_us", "map_us", "access_us", "create_us", "unmap_us", "release_us", "demand_us", "hold_us", "lock_us"]
print("slow lines' parts (ms):", {k[:-3]: round(sum(int(r[k]) for r in slow) / 1000) for k in cols})
