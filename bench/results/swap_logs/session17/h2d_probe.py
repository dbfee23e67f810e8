import os, subprocess, torch, time, json
print(subprocess.run("lscpu | grep -i -E 'numa|socket|model name'; nvidia-smi topo -m | head -5; cat /proc/self/status | grep -i cpus_allowed_list", shell=True, capture_output=True, text=True).stdout)
dev = torch.device("cuda")
S = 128 << 20
def rate(src, dst, n=20, side=None):
    st = torch.cuda.Stream()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(st):
        a.record(st)
        for _ in range(n): dst.copy_(src, non_blocking=True)
        b.record(st)
    if side: side()
    b.synchronize()
    return n * src.numel() * src.element_size() / (a.elapsed_time(b) * 1e6)
h = torch.empty(S, dtype=torch.uint8).pin_memory(); d = torch.empty(S, dtype=torch.uint8, device=dev)
res = {}
res["h2d_alone"] = rate(h, d); res["d2h_alone"] = rate(d, h)
A = torch.randn(8192, 8192, device=dev); B = torch.randn(8192, 8192, device=dev)
X = torch.randn(1 << 30, device=dev)  # 4 GiB
def gemm():
    for _ in range(30): A @ B
def elem():
    for _ in range(30): X.mul_(1.0000001)
res["h2d_with_gemm"] = rate(h, d, side=gemm); torch.cuda.synchronize()
res["h2d_with_elementwise"] = rate(h, d, side=elem); torch.cuda.synchronize()
res["d2h_with_gemm"] = rate(d, h, side=gemm); torch.cuda.synchronize()
res["d2h_with_elementwise"] = rate(d, h, side=elem); torch.cuda.synchronize()
# pinned buffers allocated from each CPU in turn (NUMA first touch)
cpus = sorted(os.sched_getaffinity(0))
for c in (cpus[0], cpus[len(cpus)//2], cpus[-1]):
    os.sched_setaffinity(0, {c})
    hh = torch.empty(S, dtype=torch.uint8).pin_memory()
    os.sched_setaffinity(0, set(cpus))
    res[f"h2d_pinned_on_cpu{c}"] = rate(hh, d)
# destination freshly mapped each time: a new device tensor per copy (caching allocator off-path: empty_cache)
fresh = []
for i in range(5):
    torch.cuda.empty_cache()
    dd = torch.empty(S, dtype=torch.uint8, device=dev)
    fresh.append(rate(h, dd, n=1)); del dd
res["h2d_fresh_dst"] = fresh
print(json.dumps({k: (round(v, 2) if isinstance(v, float) else [round(x, 2) for x in v]) for k, v in res.items()}, indent=1))
