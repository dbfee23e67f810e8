"""Can one physical handle back several blocks at offsets (cuMemMap offset != 0, size < the handle)?
If so, the shim could carve its physical memory like a heap and never release it in the steady state
(a cuMemRelease costs the host-to-device engine ~2 ms per GiB, session 20). Measures: the map's
result, aliasing, map+access cost of an extent against a whole handle and of a 4-extent block, and
copies into the device after remapping extents without a release."""
import ctypes as C, os, sys, json, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vmm_ctypes import acc, ck, create, cu, driver_version, reserve  # noqa: E402
M, G = 1 << 20, 1 << 30
res = {}
res["driver"] = driver_version()
def mapat(p, n, off, h, at=0):
    return cu.cuMemMap(C.c_ulonglong(p.value + at), C.c_size_t(n), C.c_size_t(off), h, C.c_ulonglong(0))
def access(p, n): return cu.cuMemSetAccess(p, C.c_size_t(n), C.byref(acc), C.c_size_t(1))
def unmap(p, n): return cu.cuMemUnmap(p, C.c_size_t(n))
s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 1), "stream")
H = create(2 * G)
va, vb, vc = reserve(256 * M), reserve(256 * M), reserve(256 * M)
res["map_offset_512M"] = mapat(va, 256 * M, 512 * M, H)
res["map_offset0_partial"] = mapat(vb, 256 * M, 0, H)
res["map_same_offset_again"] = mapat(vc, 256 * M, 512 * M, H)
ok = res["map_offset_512M"] == 0 and res["map_offset0_partial"] == 0
if ok:
    res["access"] = [access(p, 256 * M) for p in (va, vb, vc)]
    host = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(host), C.c_size_t(128 * M), 0), "hostalloc")
    ck(cu.cuMemsetD8_v2(va, 0xAB, C.c_size_t(256 * M)), "memset a"); ck(cu.cuMemsetD8_v2(vb, 0x11, C.c_size_t(256 * M)), "memset b")
    buf = (C.c_ubyte * 16)()
    def peek(p, at):
        ck(cu.cuMemcpyDtoH_v2(buf, C.c_ulonglong(p.value + at), C.c_size_t(16)), "peek"); return buf[0]
    res["alias"] = {"a": peek(va, 4096), "c_same_offset": peek(vc, 100 * M), "b_offset0": peek(vb, 4096)}
    def elapsed(a, b):
        ms = C.c_float(); ck(cu.cuEventElapsedTime(C.byref(ms), a, b), "elapsed"); return ms.value
    def ev():
        e = C.c_void_p(); ck(cu.cuEventCreate(C.byref(e), 0), "event"); return e
    def copies(dst, n=4):
        evs = [(ev(), ev()) for _ in range(n)]
        for i in range(n):
            cu.cuEventRecord(evs[i][0], s); ck(cu.cuMemcpyHtoDAsync_v2(C.c_ulonglong(dst.value + (i % 2) * 128 * M), host, C.c_size_t(128 * M), s), "h2d"); cu.cuEventRecord(evs[i][1], s)
        ck(cu.cuStreamSynchronize(s), "sync")
        return [round(128 * M / (elapsed(a, b) * 1e6), 1) for a, b in evs]
    res["copies_into_extent"] = copies(va)
    for p in (va, vb, vc): ck(unmap(p, 256 * M), "unmap")
    # map + access of a 512 MiB extent of a 2 GiB handle against a whole 512 MiB handle, and 4 extents
    W = create(512 * M); vd = reserve(512 * M)
    def cycle(maps):
        t = time.perf_counter()
        for h, n, off, at in maps: ck(mapat(vd, n, off, h, at), "map")
        t1 = time.perf_counter(); ck(access(vd, 512 * M), "access"); t2 = time.perf_counter()
        ck(unmap(vd, 512 * M), "unmap"); t3 = time.perf_counter()
        return (t1 - t) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6
    for name, maps in (("whole_512M", [(W, 512 * M, 0, 0)]), ("extent_512M_at_1G", [(H, 512 * M, G, 0)]),
                       ("four_128M_extents", [(H, 128 * M, k * 512 * M, k * 128 * M) for k in range(4)])):
        rows = [cycle(maps) for _ in range(12)][2:]
        res["us_" + name] = {"map": round(statistics.median(r[0] for r in rows), 1), "access": round(statistics.median(r[1] for r in rows), 1),
                             "unmap": round(statistics.median(r[2] for r in rows), 1)}
    # remap extents at new offsets (no release) and copy right after: does anything slow the copy?
    after = []
    for k in range(8):
        ck(mapat(vd, 512 * M, (k % 3) * 512 * M, H), "map"); ck(access(vd, 512 * M), "access")
        after.append(copies(vd, 2)); ck(unmap(vd, 512 * M), "unmap")
    res["copies_after_remap_no_release"] = after
    ck(mapat(vd, 512 * M, 0, W), "map"); ck(access(vd, 512 * M), "access")
    R = create(G); vr = reserve(G); ck(mapat(vr, G, 0, R), "map"); ck(access(vr, G), "access")
    ck(cu.cuMemsetD8_v2(vr, 1, C.c_size_t(G)), "memset"); ck(unmap(vr, G), "unmap"); ck(cu.cuMemRelease(R), "release")
    res["copies_after_1G_release"] = copies(vd, 4)
print(json.dumps(res, indent=1))
