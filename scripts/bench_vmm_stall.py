#!/usr/bin/env python3
"""Do VMM calls (cuMemCreate/Map/SetAccess/Unmap/Release) stall kernels already
queued on another stream, and what do they cost on the host while the GPU computes and copies?

Run: python3 scripts/bench_vmm_stall.py OUT.json (a GPU, torch). Session 10's result:
bench/results/swap_logs/session10/call2_vmm_stall.json (no stall: 600 queued matmuls took 204.6 ms
with or without 200 VMM cycles; one cuMemSetAccess and one cuMemUnmap over a range of four
mappings both succeed).
"""
import ctypes, json, sys, time
import torch

cu = ctypes.CDLL("libcuda.so.1")
P = ctypes.c_void_p
U64 = ctypes.c_uint64

class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]
class Flags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("req", ctypes.c_int), ("location", Loc), ("win32", P), ("allocFlags", Flags)]
class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]

torch.cuda.init(); torch.zeros(1, device="cuda")
dev = torch.cuda.current_device()
prop = Prop(); prop.type = 1; prop.location.type = 1; prop.location.id = dev  # PINNED, DEVICE
acc = Access(); acc.location.type = 1; acc.location.id = dev; acc.flags = 3  # READWRITE
MIB = 1 << 20

def chk(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")

def reserve(n):
    p = U64(0); chk(cu.cuMemAddressReserve(ctypes.byref(p), ctypes.c_size_t(n), ctypes.c_size_t(0), U64(0), U64(0)), "reserve"); return p.value

def create(n):
    h = U64(0); chk(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(n), ctypes.byref(prop), U64(0)), "create"); return h.value

def mapr(va, n, h): return cu.cuMemMap(U64(va), ctypes.c_size_t(n), ctypes.c_size_t(0), U64(h), U64(0))
def setacc(va, n): return cu.cuMemSetAccess(U64(va), ctypes.c_size_t(n), ctypes.byref(acc), ctypes.c_size_t(1))
def unmap(va, n): return cu.cuMemUnmap(U64(va), ctypes.c_size_t(n))
def release(h): return cu.cuMemRelease(U64(h))

out = {}
# 1. one SetAccess / one Unmap over a range mapped by 4 handles
va = reserve(64 * MIB); hs = [create(16 * MIB) for _ in range(4)]
r_map = [mapr(va + i * 16 * MIB, 16 * MIB, h) for i, h in enumerate(hs)]
r_acc = setacc(va, 64 * MIB)
free0 = torch.cuda.mem_get_info()[0]
r_unmap = unmap(va, 64 * MIB)
r_rel = [release(h) for h in hs]
free1 = torch.cuda.mem_get_info()[0]
out["multi_handle"] = {"map": r_map, "setaccess_whole": r_acc, "unmap_whole": r_unmap, "release": r_rel, "freed_mib": (free1 - free0) / MIB}
cu.cuMemAddressFree(U64(va), ctypes.c_size_t(64 * MIB))

a = torch.randn(2048, 2048, device="cuda"); b = torch.randn(2048, 2048, device="cuda")
s = torch.cuda.Stream()
host = torch.empty(256 * MIB, dtype=torch.uint8, pin_memory=True); dsrc = torch.empty(256 * MIB, dtype=torch.uint8, device="cuda")
cs = torch.cuda.Stream()

def gpu_run(n_mm, vmm, size, copies=False, reps=200):
    """Queue n_mm matmuls on s, then do `reps` VMM cycles of `size` bytes on the host (vmm:
    'none', 'create' = create+map+access+unmap+release, 'keep' = map+access+unmap); GPU ms of the queue and host us per call."""
    torch.cuda.synchronize()
    va = reserve(size); hk = create(size)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        e0.record(s)
        for _ in range(n_mm):
            torch.mm(a, b)
        e1.record(s)
    if copies:
        with torch.cuda.stream(cs):
            for _ in range(8):
                host.copy_(dsrc, non_blocking=True)
    times = {"create": [], "map": [], "access": [], "unmap": [], "release": []}
    time.sleep(0.002)
    for _ in range(reps if vmm != "none" else 0):
        t0 = time.perf_counter_ns()
        h = create(size) if vmm == "create" else hk
        t1 = time.perf_counter_ns(); chk(mapr(va, size, h), "map")
        t2 = time.perf_counter_ns(); chk(setacc(va, size), "access")
        t3 = time.perf_counter_ns(); chk(unmap(va, size), "unmap")
        t4 = time.perf_counter_ns()
        if vmm == "create":
            chk(release(h), "release")
        t5 = time.perf_counter_ns()
        for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            times[k].append(v / 1e3)
    busy = not e1.query()
    torch.cuda.synchronize()
    release(hk); cu.cuMemAddressFree(U64(va), ctypes.c_size_t(size))
    med = {k: round(sorted(v)[len(v) // 2], 1) for k, v in times.items() if v}
    return {"gpu_ms": round(e0.elapsed_time(e1), 2), "host_us_median": med, "gpu_busy_after_vmm": busy}

n = 600
for _ in range(2):
    gpu_run(n, "none", 32 * MIB)  # warm
res = []
for size in (4 * MIB, 32 * MIB):
    for vmm in ("none", "keep", "create"):
        for copies in (False, True):
            r = gpu_run(n, vmm, size, copies=copies)
            r.update(size_mib=size // MIB, vmm=vmm, copies=copies); res.append(r)
            print(json.dumps(r), flush=True)
# idle GPU: the calls alone
for size in (4 * MIB, 32 * MIB):
    r = gpu_run(0, "create", size); r.update(size_mib=size // MIB, vmm="create", idle=True); res.append(r); print(json.dumps(r), flush=True)
out["runs"] = res
print(json.dumps(out["multi_handle"]))
json.dump(out, open(sys.argv[1], "w"), indent=1)
