"""Events of a swap run's iteration K between positions LO and HI (may pass the end), time-ordered."""
import sys, numpy as np
sys.path.insert(0, 'scripts'); sys.path.insert(0, '.')
import swap_anatomy as sa
from pyobmem.capture import SWAP_IN, SWAP_OUT
run = sa.load_run(sys.argv[1]); k = int(sys.argv[2]); lo, hi = int(sys.argv[3]), int(sys.argv[4])
a, b = run.window(k)
c = run.capture
t0 = int(run.ts[a + lo]); t1 = int(run.ts[min(a + hi, len(run.ts) - 1)])
ev = []
for p in range(a + lo, min(a + hi, len(run.ts))):
    ev.append((int(run.ts[p]), f"op {p-a} {run.op_name(p)[:40]}"))
bl = c.blocks
for i in np.flatnonzero((bl['t_alloc'] >= t0) & (bl['t_alloc'] <= t1)):
    ev.append((int(bl['t_alloc'][i]), f"  alloc {c.block_label(i)} {bl['size'][i]/2**20:.1f}MiB"))
for i in np.flatnonzero((bl['t_free'] >= t0) & (bl['t_free'] <= t1)):
    ev.append((int(bl['t_free'][i]), f"  free {c.block_label(i)} {bl['size'][i]/2**20:.1f}MiB"))
s = c.swaps
for r in s[(s['ts_ns'] >= t0) & (s['ts_ns'] <= t1)]:
    d = 'OUT' if r['direction'] == SWAP_OUT else 'IN'
    ev.append((int(r['ts_ns']), f"    swap{d} {r['pid']}:{r['block_id']} {r['bytes']/2**20:.1f}MiB cause={r['cause']} dur={r['duration_ns']/1e6:.2f}ms"))
ev.sort()
for t, e in ev:
    print(f"{(t-t0)/1e6:9.3f} {e}")
