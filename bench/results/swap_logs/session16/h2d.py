"""A swap run's copies per direction in iteration K as a FIFO engine at BW (default 52e9 B/s) from each
copy's issue (record time less its duration): GiB issued and estimated done every 40 ms from the
iteration's first GPU clock sample, and the backlog. usage: h2d.py SWAP K [BW]"""
import sys, numpy as np
sys.path.insert(0,'scripts'); sys.path.insert(0,'.')  # run from the repository root
import swap_anatomy as sa
from pyobmem.capture import SWAP_IN, SWAP_OUT
run = sa.load_run(sys.argv[1]); k=int(sys.argv[2]); bw=float(sys.argv[3]) if len(sys.argv)>3 else 52e9
pos, gpu, iss = sa.samples(run, k, after=3)
a,b = run.window(k)
t0 = gpu[0]; tend = run.ts[b] + 30e6
s = run.capture.swaps
for d, name in ((SWAP_IN,'H2D'),(SWAP_OUT,'D2H')):
    x = s[(s['direction']==d)]
    issue = x['ts_ns'].astype(np.int64) - x['duration_ns'].astype(np.int64)
    m = (issue >= run.ts[a]-0e6) & (issue < tend)
    x, issue = x[m], issue[m]
    o = np.argsort(issue); x, issue = x[o], issue[o]
    end = np.empty(len(x)); t = 0; busy=0; idle=0
    for i in range(len(x)):
        st = max(issue[i], t)
        if i and st > t: idle += st - t
        t = st + x['bytes'][i]/bw*1e9; end[i] = t
    print(name, len(x), f"{x['bytes'].sum()/2**30:.2f} GiB", f"first issue {(issue[0]-t0)/1e6:.1f} last end {(end[-1]-t0)/1e6:.1f} idle between {idle/1e6:.1f} ms")
    # print queue depth at times
    for T in range(0, 760, 40):
        tt = t0 + T*1e6
        issued = x['bytes'][issue <= tt].sum(); done_est = x['bytes'][end <= tt].sum()
        print(f"   t={T:4d} issued {issued/2**30:6.2f} GiB  est done {done_est/2**30:6.2f}  backlog {(issued-done_est)/bw*1e3*2**0:7.1f} ms")
