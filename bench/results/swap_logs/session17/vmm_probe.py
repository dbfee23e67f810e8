"""H2D copy rate into VMM memory: warm mapping, fresh cuMemCreate per copy (released after / kept), reused handle remapped."""
import ctypes as C, os, sys, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from vmm_ctypes import ck, create, cu, mapped, unmap  # noqa: E402
stream = C.c_void_p(); ck(cu.cuStreamCreate(C.byref(stream), 1), "stream")
def ev():
    e = C.c_void_p(); ck(cu.cuEventCreate(C.byref(e), 0), "event"); return e
host = C.c_void_p(); S_MAX = 128 << 20
ck(cu.cuMemHostAlloc(C.byref(host), C.c_size_t(S_MAX), 0), "hostalloc")
C.memset(host, 1, S_MAX)
def copy_rate(p, S):
    a, b = ev(), ev()
    cu.cuEventRecord(a, stream); ck(cu.cuMemcpyHtoDAsync_v2(p, host, C.c_size_t(S), stream), "copy"); cu.cuEventRecord(b, stream)
    ck(cu.cuEventSynchronize(b), "sync"); ms = C.c_float(); cu.cuEventElapsedTime(C.byref(ms), a, b)
    return S / (ms.value * 1e6)
res = {}
for S in (128 << 20, 32 << 20):
    k = f"{S>>20}MiB"
    h = create(S); p = mapped(h, S)
    copy_rate(p, S); res[k + "_warm"] = [round(copy_rate(p, S), 1) for _ in range(5)]
    unmap(p, S); cu.cuMemRelease(h)
    r = []
    for _ in range(8):
        h = create(S); p = mapped(h, S); r.append(round(copy_rate(p, S), 1)); unmap(p, S); cu.cuMemRelease(h)
    res[k + "_fresh_released_after"] = r
    kept, r = [], []
    for _ in range(8):
        h = create(S); p = mapped(h, S); r.append(round(copy_rate(p, S), 1)); kept.append((h, p))
    res[k + "_fresh_kept"] = r
    r = []
    h0 = kept[0][0]
    for h, p in kept: unmap(p, S)
    for hh, _ in kept[1:]: cu.cuMemRelease(hh)
    for _ in range(8):
        p = mapped(h0, S); r.append(round(copy_rate(p, S), 1)); unmap(p, S)
    res[k + "_same_handle_remapped"] = r
    cu.cuMemRelease(h0)
    # fresh while 1 GiB of other handles is released just before each copy
    r = []
    for _ in range(6):
        junk = [create(S) for _ in range((1 << 30) // S)]
        jp = [mapped(j, S) for j in junk]
        for j, q in zip(junk, jp): copy_rate(q, S)  # touched
        h = create(S); p = mapped(h, S)
        for j, q in zip(junk, jp): unmap(q, S); cu.cuMemRelease(j)
        r.append(round(copy_rate(p, S), 1)); unmap(p, S); cu.cuMemRelease(h)
    res[k + "_fresh_after_1GiB_released"] = r
    hw = create(S); pw = mapped(hw, S); copy_rate(pw, S); r = []
    for _ in range(6):
        junk = [create(S) for _ in range((1 << 30) // S)]
        jp = [mapped(j, S) for j in junk]
        for j, q in zip(junk, jp): copy_rate(q, S)
        for j, q in zip(junk, jp): unmap(q, S); cu.cuMemRelease(j)
        r.append(round(copy_rate(pw, S), 1))
    res[k + "_warm_after_1GiB_released"] = r
    unmap(pw, S); cu.cuMemRelease(hw)
print(json.dumps(res, indent=1))
