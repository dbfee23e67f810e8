"""Where a step goes on the GPU, from torch.profiler chrome traces (prof.py): usage prof_an.py BASE.json.gz SWAP.json.gz.
The second step between the loss.item() copies; compute-stream idle gaps by the copy that ended just before (h2d/d2h) or none (host);
the shim's copy rates by size (call7_profile_copies.txt is its HtoD / DtoH part for the swap trace)."""
import json, gzip, collections, sys, numpy as np
def load(f):
    d=json.load(gzip.open(f)); ev=d['traceEvents']
    g=[e for e in ev if e.get('cat') in ('kernel','gpu_memcpy','gpu_memset')]
    g.sort(key=lambda e:e['ts'])
    return g
def analyse(f, label):
    g=load(f)
    cs0=collections.Counter(e['args']['stream'] for e in g if e['cat']=='kernel').most_common(1)[0][0]
    ends=[e['ts']+e['dur'] for e in g if e['cat']=='gpu_memcpy' and 'DtoH' in e['name'] and e['args']['stream']==cs0 and e['args'].get('bytes',0)<=8]
    print(label, "loss copies", len(ends))
    t0,t1=ends[0],ends[1]
    s=[e for e in g if t0<=e['ts']<t1]
    by=collections.defaultdict(list)
    for e in s: by[(e['args']['stream'], e['cat'] if e['cat']!='gpu_memcpy' else e['name'].split(' (')[0])].append(e)
    for k,v in sorted(by.items(), key=lambda kv:-len(kv[1])):
        busy=sum(e['dur'] for e in v); by_=sum(e['args'].get('bytes',0) for e in v)
        print(f"  stream {k}: n {len(v)} busy {busy/1e3:.1f} ms bytes {by_/2**30:.2f} GiB {'' if not by_ else f'{by_/busy/1e3:.1f} GB/s'}")
    # compute stream = stream with most kernels
    cs=collections.Counter(e['args']['stream'] for e in s if e['cat']=='kernel').most_common(1)[0][0]
    comp=[e for e in s if e['args']['stream']==cs]
    # loss position: the first kernel with 'nll_loss' or 'log_softmax'
    lossk=[e['ts'] for e in comp if 'softmax' in e['name'].lower() and 'log' in e['name'].lower()]
    tl=lossk[0] if lossk else None
    bw=[e['ts'] for e in comp if 'multi_tensor' in e['name']]
    topt=bw[0] if bw else None
    print(f"  step {(t1-t0)/1e3:.1f} ms; loss at {(tl-t0)/1e3 if tl else -1:.1f} ms; optimizer at {(topt-t0)/1e3 if topt else -1:.1f} ms -> end")
    # compute-stream idle gaps
    h2d=[e for e in s if 'HtoD' in e['name'] and e['args']['stream']!=cs]
    h2d_end=np.array(sorted(e['ts']+e['dur'] for e in h2d))
    d2h=[e for e in s if 'DtoH' in e['name'] and e['args']['stream']!=cs]
    d2h_end=np.array(sorted(e['ts']+e['dur'] for e in d2h))
    idle=collections.Counter(); prev=None
    phase=lambda t: 'fwd' if tl and t<tl else ('opt' if topt and t>=topt else 'bwd')
    for e in comp:
        if prev is not None:
            gap=e['ts']-prev
            if gap>5:
                cause='host'
                if len(h2d_end) and np.any((h2d_end<=e['ts']+2)&(h2d_end>=e['ts']-15)): cause='h2d'
                elif len(d2h_end) and np.any((d2h_end<=e['ts']+2)&(d2h_end>=e['ts']-15)): cause='d2h'
                idle[(phase(e['ts']),cause)]+=gap
        prev=max(prev or 0, e['ts']+e['dur'])
    print("  compute idle ms:", {k: round(v/1e3,1) for k,v in sorted(idle.items())})
    busyph=collections.Counter()
    for e in comp: busyph[phase(e['ts'])]+=e['dur']
    print("  compute busy ms:", {k: round(v/1e3,1) for k,v in busyph.items()})
    def engine(ev, lo, hi):
        iv=sorted((max(e['ts'],lo),min(e['ts']+e['dur'],hi)) for e in ev if e['ts']<hi and e['ts']+e['dur']>lo)
        b=0; cur=None
        for a,z in iv:
            if cur is None or a>cur[1]:
                if cur: b+=cur[1]-cur[0]
                cur=[a,z]
            else: cur[1]=max(cur[1],z)
        if cur: b+=cur[1]-cur[0]
        return b/1e3, (hi-lo)/1e3
    if tl:
        print("  D2H busy/span fwd: %.1f / %.1f ms"%engine(d2h,t0,tl), " bwd+opt: %.1f / %.1f"%engine(d2h,tl,t1))
        print("  H2D busy/span fwd: %.1f / %.1f ms"%engine(h2d,t0,tl), " bwd+opt: %.1f / %.1f"%engine(h2d,tl,t1))
    for name, v in (("HtoD", h2d), ("DtoH", d2h)):  # copy rates by size, and with the other engine busy or not
        if not v:
            continue
        print(" ", name)
        by = collections.defaultdict(lambda: [0, 0, 0.0])
        for e in v:
            b = e['args']['bytes']; k = by[b >> 20]
            k[0] += 1; k[1] += b; k[2] += e['dur']
        for k in sorted(by):
            n, b, du = by[k]; print(f"   {k:6d} MiB n {n:4d} {b/du/1e3:6.1f} GB/s  total {du/1e3:6.1f} ms")
        oiv = np.array([(e['ts'], e['ts'] + e['dur']) for e in (d2h if name == "HtoD" else h2d)])
        both = [e for e in v if len(oiv) and np.clip(np.minimum(oiv[:, 1], e['ts'] + e['dur']) - np.maximum(oiv[:, 0], e['ts']), 0, None).sum() > 0.5 * e['dur']]
        alone = [e for e in v if e not in both]
        for lab, x in (('alone', alone), ('both', both)):
            if x: print(f"   {lab}: n {len(x)} {sum(e['args']['bytes'] for e in x)/sum(e['dur'] for e in x)/1e3:.1f} GB/s")
    return s
analyse(sys.argv[1], 'base')
analyse(sys.argv[2], 's50')
