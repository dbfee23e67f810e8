"""Copy rates by size and direction in the second profiled step: usage prof_h2d.py SWAP.json.gz."""
import json, gzip, collections, sys, numpy as np
d=json.load(gzip.open(sys.argv[1])); g=[e for e in d['traceEvents'] if e.get('cat')=='gpu_memcpy']
g.sort(key=lambda e:e['ts'])
ends=[e['ts']+e['dur'] for e in g if 'DtoH' in e['name'] and e['args']['stream']==7]
t0,t1=ends[0],ends[1]
for name in ('HtoD','DtoH'):
    v=[e for e in g if name in e['name'] and e['args']['stream']!=7 and t0<=e['ts']<t1]
    by=collections.defaultdict(lambda:[0,0,0.0])
    for e in v:
        b=e['args']['bytes']; k=b>>20
        by[k][0]+=1; by[k][1]+=b; by[k][2]+=e['dur']
    print(name, e['name'])
    for k in sorted(by): n,b,du=by[k]; print(f"   {k:6d} MiB n {n:4d} {b/du/1e3:6.1f} GB/s  total {du/1e3:6.1f} ms")
    # overlap with other engine
    other=[e for e in g if (('DtoH' if name=='HtoD' else 'HtoD') in e['name']) and e['args']['stream']!=7 and t0<=e['ts']<t1]
    oiv=np.array([(e['ts'],e['ts']+e['dur']) for e in other])
    alone=[];both=[]
    for e in v:
        a,z=e['ts'],e['ts']+e['dur']
        ov=np.clip(np.minimum(oiv[:,1],z)-np.maximum(oiv[:,0],a),0,None).sum() if len(oiv) else 0
        (both if ov>0.5*(z-a) else alone).append(e)
    for lab,x in (('alone',alone),('both',both)):
        if x: print(f"   {lab}: n {len(x)} {sum(e['args']['bytes'] for e in x)/sum(e['dur'] for e in x)/1e3:.1f} GB/s")
