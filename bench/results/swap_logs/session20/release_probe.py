"""What a cuMemRelease does to copies into the device that follow it (H200), by ctypes.
Is the slowdown transient (a scrub after the release, on a copy engine) and does a second stream escape it?"""
import ctypes as C, os, sys, json, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vmm_ctypes import ck, create, cu, mapped, unmap  # noqa: E402
def mkstream():
    s = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(s), 1), "stream"); return s
s1, s2 = mkstream(), mkstream()
def ev():
    e = C.c_void_p(); ck(cu.cuEventCreate(C.byref(e), 0), "event"); return e
S = 128 << 20; G = 1 << 30
host = C.c_void_p(); ck(cu.cuMemHostAlloc(C.byref(host), C.c_size_t(S), 0), "hostalloc"); C.memset(host, 1, S)
dst = mapped(create(8 * S), 8 * S)
def elapsed(a, b):
    ms = C.c_float(); ck(cu.cuEventElapsedTime(C.byref(ms), a, b), "elapsed"); return ms.value
def copies(n=8, streams=(s1,), d2h=False):
    """n copies of 128 MiB spread over streams; per-copy GB/s in issue order, and the whole's."""
    evs = [(ev(), ev()) for _ in range(n)]
    t0 = ev(); cu.cuEventRecord(t0, streams[0])
    for s in streams[1:]: cu.cuStreamWaitEvent(s, t0, 0)
    for i in range(n):
        s = streams[i % len(streams)]
        cu.cuEventRecord(evs[i][0], s)
        if d2h: ck(cu.cuMemcpyDtoHAsync_v2(host, C.c_ulonglong(dst.value + (i % 8) * S), C.c_size_t(S), s), "d2h")
        else: ck(cu.cuMemcpyHtoDAsync_v2(C.c_ulonglong(dst.value + (i % 8) * S), host, C.c_size_t(S), s), "h2d")
        cu.cuEventRecord(evs[i][1], s)
    for s in streams: ck(cu.cuStreamSynchronize(s), "sync")
    per = [round(S / (elapsed(a, b) * 1e6), 1) for a, b in evs]
    end = max(evs, key=lambda e: elapsed(t0, e[1]))[1]
    return per, round(n * S / (elapsed(t0, end) * 1e6), 1)
def junk(total, size=S, touch=True):
    hs = [create(size) for _ in range(total // size)]
    ps = [mapped(h, size) for h in hs]
    if touch:
        for p in ps: ck(cu.cuMemsetD8Async(p, 7, C.c_size_t(size), s1), "memset")
        ck(cu.cuStreamSynchronize(s1), "sync")
    for p in ps: unmap(p, size)
    return hs
def release(hs):
    t = time.perf_counter()
    for h in hs: ck(cu.cuMemRelease(h), "release")
    return round((time.perf_counter() - t) * 1e6)
res = {}
copies(); res["alone"] = copies()
res["alone_d2h"] = copies(d2h=True)
res["alone_2streams"] = copies(streams=(s1, s2))
for sleep_ms in (0, 2, 10, 50):
    hs = junk(G); us = release(hs); time.sleep(sleep_ms / 1e3)
    res[f"after_1GiB_released_sleep{sleep_ms}ms"] = {"release_us": us, "copies": copies(16)}
hs = junk(G, size=G); us = release(hs)
res["after_1GiB_one_handle_released"] = {"release_us": us, "copies": copies(16)}
hs = junk(4 * G); us = release(hs)
res["after_4GiB_released"] = {"release_us": us, "copies": copies(32)}
hs = junk(G); us = release(hs)
res["after_1GiB_released_2streams"] = {"release_us": us, "copies": copies(16, streams=(s1, s2))}
hs = junk(G); us = release(hs)
res["after_1GiB_released_d2h"] = {"release_us": us, "copies": copies(16, d2h=True)}
hs = junk(G, touch=False); us = release(hs)
res["after_1GiB_untouched_released"] = {"release_us": us, "copies": copies(16)}
hs = [create(S) for _ in range(8)]
res["after_1GiB_created"] = {"copies": copies(16)}
release(hs); time.sleep(0.1)
# a release while copies run: does it slow copies already on the engine?
hs = junk(G)
evs_start = ev(); cu.cuEventRecord(evs_start, s1)
per_all = []
a = [(ev(), ev()) for _ in range(16)]
for i in range(16):
    cu.cuEventRecord(a[i][0], s1); cu.cuMemcpyHtoDAsync_v2(C.c_ulonglong(dst.value + (i % 8) * S), host, C.c_size_t(S), s1); cu.cuEventRecord(a[i][1], s1)
time.sleep(0.01); us = release(hs); cu.cuStreamSynchronize(s1)
res["release_during_copies_10ms_in"] = {"release_us": us, "copies": [round(S / (elapsed(x, y) * 1e6), 1) for x, y in a]}
print(json.dumps(res, indent=1))
