"""Can a block's physical memory be several whole handles (chunks) mapped side by side, and does
moving chunks between blocks (unmap, map elsewhere: no cuMemRelease) spare the host-to-device
engine the ~2 ms per GiB a release costs it (session 20)? If so the shim can keep its physical
memory as interchangeable chunks and stop releasing in the steady state. Measures: one
cuMemSetAccess / cuMemUnmap over a range of several mappings (their results), the data through
it, per-call costs, and copies into the device after chunks are moved against after a release."""
import ctypes as C, os, sys, json, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vmm_ctypes import acc, ck, create, cu, driver_version, reserve  # noqa: E402
M, G = 1 << 20, 1 << 30
res = {}
res["driver"] = driver_version()
def mapat(p, at, n, h): return cu.cuMemMap(C.c_ulonglong(p.value + at), C.c_size_t(n), C.c_size_t(0), h, C.c_ulonglong(0))
def access(p, n, at=0): return cu.cuMemSetAccess(C.c_ulonglong(p.value + at), C.c_size_t(n), C.byref(acc), C.c_size_t(1))
def unmap(p, n, at=0): return cu.cuMemUnmap(C.c_ulonglong(p.value + at), C.c_size_t(n))
s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 1), "stream")
def ev():
    e = C.c_void_p(); ck(cu.cuEventCreate(C.byref(e), 0), "event"); return e
def us(f):
    t = time.perf_counter(); r = f(); return r, round((time.perf_counter() - t) * 1e6, 1)
# 1. a 128 MiB range of 4 x 32 MiB chunks: one access call, one unmap call
va = reserve(128 * M); hs = [create(32 * M) for _ in range(4)]
res["map4"] = [mapat(va, i * 32 * M, 32 * M, h) for i, h in enumerate(hs)]
res["access_whole_4chunks"] = access(va, 128 * M)
ck(cu.cuMemsetD8_v2(va, 0x5A, C.c_size_t(128 * M)), "memset whole")
host = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(host), C.c_size_t(128 * M), 0), "hostalloc")
ck(cu.cuMemcpyDtoH_v2(host, va, C.c_size_t(128 * M)), "dtoh")
b = (C.c_ubyte * (128 * M)).from_address(host.value)
res["data_whole_ok"] = all(b[i] == 0x5A for i in range(0, 128 * M, 4 * M + 4097))
res["unmap_whole_4chunks"] = unmap(va, 128 * M)
if res["unmap_whole_4chunks"]:
    res["unmap_per_chunk"] = [unmap(va, 32 * M, i * 32 * M) for i in range(4)]
# the chunks mapped again elsewhere, in another order: the data stays with its chunk
vb = reserve(128 * M)
res["remap"] = [mapat(vb, i * 32 * M, 32 * M, h) for i, h in enumerate(reversed(hs))]
res["access_remap"] = access(vb, 128 * M)
C.memset(host, 0, 128 * M); ck(cu.cuMemcpyDtoH_v2(host, vb, C.c_size_t(128 * M)), "dtoh2")
res["data_after_remap_ok"] = all(b[i] == 0x5A for i in range(0, 128 * M, 4 * M + 4097))
unmap(vb, 128 * M) and [unmap(vb, 32 * M, i * 32 * M) for i in range(4)]
# 2. costs: a 512 MiB block as one handle, 16 x 32 MiB, 256 x 2 MiB (map all + one access; one unmap)
cost = {}
for n, sz in ((1, 512 * M), (16, 32 * M), (64, 8 * M), (256, 2 * M)):
    hh = [create(sz) for _ in range(n)]; vr = reserve(512 * M)
    rows = []
    for rep in range(5):
        t = time.perf_counter()
        for i, h in enumerate(hh): ck(mapat(vr, i * sz, sz, h), "map")
        t1 = time.perf_counter(); r = access(vr, 512 * M); t2 = time.perf_counter()
        u = unmap(vr, 512 * M); t3 = time.perf_counter()
        if u:
            for i in range(n): ck(unmap(vr, sz, i * sz), "unmap chunk")
            t3 = time.perf_counter()
        rows.append(((t1 - t) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, r, u))
    cost[f"{n}x{sz // M}MiB"] = {"map_us": round(statistics.median(r[0] for r in rows), 1), "access_us": round(statistics.median(r[1] for r in rows), 1),
                                 "unmap_us": round(statistics.median(r[2] for r in rows), 1), "access_rc": rows[0][3], "unmap_whole_rc": rows[0][4]}
    for h in hh: cu.cuMemRelease(h)
res["cost_512MiB"] = cost
# 3. copies into the device after moving 1 GiB of chunks (no release) against after a release
S = 128 * M
dst = reserve(8 * S); dh = [create(S) for _ in range(8)]
for i, h in enumerate(dh): ck(mapat(dst, i * S, S, h), "map dst")
ck(access(dst, 8 * S), "access dst")
def copies(n=16):
    evs = [(ev(), ev()) for _ in range(n)]
    for i in range(n):
        cu.cuEventRecord(evs[i][0], s)
        ck(cu.cuMemcpyHtoDAsync_v2(C.c_ulonglong(dst.value + (i % 8) * S), host, C.c_size_t(S), s), "h2d")
        cu.cuEventRecord(evs[i][1], s)
    ck(cu.cuStreamSynchronize(s), "sync")
    out = []
    for a, e in evs:
        ms = C.c_float(); ck(cu.cuEventElapsedTime(C.byref(ms), a, e), "el"); out.append(round(S / (ms.value * 1e6), 1))
    return out
def junk_chunks(total, sz):
    vr = reserve(total); hh = [create(sz) for _ in range(total // sz)]
    for i, h in enumerate(hh): ck(mapat(vr, i * sz, sz, h), "map junk")
    ck(access(vr, total), "access junk"); ck(cu.cuMemsetD8Async(vr, 7, C.c_size_t(total), s), "memset junk"); ck(cu.cuStreamSynchronize(s), "sync")
    return vr, hh
copies(); res["alone"] = copies()
for sz in (32 * M, 2 * M):
    vr, hh = junk_chunks(G, sz)
    vt = reserve(G)
    def move():
        if unmap(vr, G):
            for i in range(len(hh)): ck(unmap(vr, sz, i * sz), "unmap")
        for i, h in enumerate(hh): ck(mapat(vt, i * sz, sz, h), "map moved")
        ck(access(vt, G), "access moved")
    _, t = us(move)
    res[f"after_1GiB_moved_{sz // M}MiB_chunks"] = {"move_us": t, "copies": copies()}
    # and then the same chunks released (the control: ~30 GB/s first copies, session 20)
    def rel():
        if unmap(vt, G):
            for i in range(len(hh)): ck(unmap(vt, sz, i * sz), "unmap")
        for h in hh: ck(cu.cuMemRelease(h), "release")
    _, t = us(rel)
    res[f"after_1GiB_released_{sz // M}MiB_chunks"] = {"release_us": t, "copies": copies()}
# moved while copies run (a release 10 ms into 16 copies slowed the two running to ~35, session 20)
vr, hh = junk_chunks(G, 32 * M); vt = reserve(G)
evs = [(ev(), ev()) for _ in range(16)]
for i in range(16):
    cu.cuEventRecord(evs[i][0], s); ck(cu.cuMemcpyHtoDAsync_v2(C.c_ulonglong(dst.value + (i % 8) * S), host, C.c_size_t(S), s), "h2d"); cu.cuEventRecord(evs[i][1], s)
time.sleep(0.01)
if unmap(vr, G):
    for i in range(len(hh)): unmap(vr, 32 * M, i * 32 * M)
for i, h in enumerate(hh): ck(mapat(vt, i * 32 * M, 32 * M, h), "map")
ck(access(vt, G), "access")
ck(cu.cuStreamSynchronize(s), "sync")
def el(a, e):
    ms = C.c_float(); cu.cuEventElapsedTime(C.byref(ms), a, e); return round(S / (ms.value * 1e6), 1)
res["moved_10ms_into_16_copies"] = [el(a, e) for a, e in evs]
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "chunk_probe.json"), "w"), indent=1)
