/*
 * Allocation, free, VMM, managed memory, copies and sets.
 *
 * Every wrapper calls the real function first and returns its result unchanged; records are
 * written only when the call succeeded. A free of a pointer the table does not know goes to the
 * real free like any other and is recorded as UNTRACKED (C12).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

static int current_device(void)
{
    CUdevice d = 0;
    if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return 0;
    return (int)d;
}

/* After a successful allocation: the block into the table (and, when the swap executor serves
 * it, its trace id into the executor's). */
static void on_alloc(CUdeviceptr *dptr, size_t size, CUstream s, int kind, int served)
{
    if (!dptr)
        return;
    uint32_t id = blocks_add((uint64_t)*dptr, size, (uint64_t)(uintptr_t)s, kind, current_device());
    if (served)
        swap_bind_id((uint64_t)*dptr, id);
}

/* ---- swap mode (swap*.c): what the op hooks hand the executor ---- */

/* Candidate words of a copy: both ends of each device side. */
static void copy_words(uint64_t w[4], int kind, uint64_t dst, uint64_t src, uint64_t n)
{
    uint64_t last = n ? n - 1 : 0;
    w[0] = kind != PYOBMEM_COPY_DTOH ? dst : 0;
    w[1] = w[0] ? dst + last : 0;
    w[2] = kind != PYOBMEM_COPY_HTOD ? src : 0;
    w[3] = w[2] ? src + last : 0;
}

/* A small host-to-device copy whose words point into live blocks is a pointer table (batched
 * GEMM, pointer arrays, device-side structs: cases.md C08, C09): a kernel may later reach those
 * blocks through it without naming them, so they are never swapped (and come back now). */
#define POINTER_TABLE_MAX 65536
static void pin_pointer_table(const void *src, uint64_t n)
{
    if (!src || n < 8 || n > POINTER_TABLE_MAX || ((uintptr_t)src & 7))
        return;
    const uint64_t *w = src;
    uint64_t hits[16];
    size_t nh = 0, i = 0;
    while (i < n / 8) { /* one lock per batch of hits; swap_never takes the swap lock */
        blocks_read_lock();
        for (; i < n / 8 && nh < 16; i++) {
            const struct block *b = w[i] >= 4096 ? blocks_lookup(w[i]) : NULL;
            if (b && (b->kind == PYOBMEM_ALLOC_DRIVER || b->kind == PYOBMEM_ALLOC_ASYNC)) /* the swappable kinds */
                hits[nh++] = w[i];
        }
        blocks_read_unlock();
        for (size_t k = 0; k < nh; k++)
            swap_never(hits[k]);
        nh = 0;
    }
}

/* The copy and set hooks' one shape: OP_OPEN (shim_begin; in swap mode the op's words -- WORDS
 * fills w_[4] and may set key_ -- and swap_op_begin, returning from the hook with the error when
 * a touched block cannot be brought back), the real call, the record, OP_CLOSE. */
#define OP_OPEN(NAME, KEY, S, WORDS)                                                                   \
    struct swap_op op_;                                                                                \
    op_.active = 0;                                                                                    \
    int rec = shim_begin();                                                                            \
    if (rec && SHIM_UNLIKELY(g_shim.swap)) {                                                           \
        uint64_t w_[4], key_ = (KEY);                                                                  \
        WORDS;                                                                                         \
        CUresult f_ = swap_op_begin(&op_, key_, swap_norm_stream((S), per_thread_name(#NAME)), 0, w_, 4); \
        if (f_ != CUDA_SUCCESS)                                                                        \
            return f_;                                                                                 \
    }
#define OP_CLOSE(R)            \
    if (op_.active)            \
        swap_op_end(&op_, (R));

/* A copy's words (both ends of each device side); a host-to-device one may be a pointer table. */
static void copy_prep(uint64_t w[4], int kind, uint64_t dst, uint64_t src, uint64_t n)
{
    copy_words(w, kind, dst, src, n);
    if (kind == PYOBMEM_COPY_HTOD)
        pin_pointer_table((const void *)(uintptr_t)src, n);
}

/* ---- allocation and free ----
 *
 * One shape for each: in swap mode the executor may serve the call itself (served = 1, then the
 * driver is not called); otherwise the real function runs and its result passes through. */

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    int rec = shim_begin();
    int served = rec && SHIM_UNLIKELY(g_shim.swap) && swap_alloc(dptr, bytesize, NULL, SWAP_ALLOC_DRIVER, 0);
    CUresult r = served ? CUDA_SUCCESS : REAL(cuMemAlloc_v2, (dptr, bytesize));
    if (rec && r == CUDA_SUCCESS)
        on_alloc(dptr, bytesize, 0, PYOBMEM_ALLOC_DRIVER, served);
    return r;
}

CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                    unsigned int ElementSizeBytes)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocPitch_v2, (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
    if (rec && r == CUDA_SUCCESS)
        on_alloc(dptr, (pPitch ? *pPitch : WidthInBytes) * Height, 0, PYOBMEM_ALLOC_PITCH, 0);
    return r;
}

CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocManaged, (dptr, bytesize, flags));
    if (rec && r == CUDA_SUCCESS)
        on_alloc(dptr, bytesize, 0, PYOBMEM_ALLOC_MANAGED, 0);
    return r;
}

/* Stream-ordered allocations: in swap mode a large one on a pool the shim serves is a swap block
 * from the executor's cache (swap.c "the allocator"). */
#define DEF_ALLOC_ORDERED(NAME, PARAMS, ARGS, POOL, KIND)                                                 \
    CUresult CUDAAPI NAME PARAMS                                                                          \
    {                                                                                                     \
        int rec = shim_begin();                                                                           \
        int served = rec && SHIM_UNLIKELY(g_shim.swap) &&                                                 \
                     swap_alloc(dptr, bytesize, POOL, KIND, swap_norm_stream(s, per_thread_name(#NAME)));  \
        CUresult r = served ? CUDA_SUCCESS : REAL(NAME, ARGS);                                            \
        if (rec && r == CUDA_SUCCESS)                                                                     \
            on_alloc(dptr, bytesize, s, PYOBMEM_ALLOC_ASYNC, served);                                     \
        return r;                                                                                         \
    }
DEF_ALLOC_ORDERED(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream s), (dptr, bytesize, s), NULL,
                  SWAP_ALLOC_ASYNC)
DEF_ALLOC_ORDERED(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream s), (dptr, bytesize, s), NULL,
                  SWAP_ALLOC_ASYNC)
DEF_ALLOC_ORDERED(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s),
                  (dptr, bytesize, pool, s), pool, SWAP_ALLOC_FROM_POOL)
DEF_ALLOC_ORDERED(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s),
                  (dptr, bytesize, pool, s), pool, SWAP_ALLOC_FROM_POOL)

/* Before a free: which block (if any) starts at dptr. After a successful free: remove it, or
 * record the pointer as untracked. */
static void after_free(CUdeviceptr dptr, int known, const struct block *b, CUstream s)
{
    if (known)
        blocks_remove(b->start, b->id, (uint64_t)(uintptr_t)s);
    else if (dptr)
        ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_UNTRACKED,
                                            .untracked = {.addr = dptr, .kind = PYOBMEM_UNTRACKED_FREE}}, 1);
}

/* A block the executor serves is freed by it (cuMemFree: after its own last uses; cuMemFreeAsync:
 * at its stream point), never by the driver. */
#define DEF_FREE(NAME, PARAMS, ARGS, S, ORDERED)                                                          \
    CUresult CUDAAPI NAME PARAMS                                                                          \
    {                                                                                                     \
        int rec = shim_begin();                                                                           \
        struct block b;                                                                                   \
        CUresult r = CUDA_SUCCESS;                                                                        \
        int known = rec && blocks_find_start(dptr, &b);                                                   \
        if (!(rec && SHIM_UNLIKELY(g_shim.swap) &&                                                        \
              swap_free(dptr, swap_norm_stream(S, per_thread_name(#NAME)), ORDERED, &r)))                 \
            r = REAL(NAME, ARGS);                                                                         \
        if (rec && r == CUDA_SUCCESS)                                                                     \
            after_free(dptr, known, &b, S);                                                               \
        return r;                                                                                         \
    }
DEF_FREE(cuMemFree_v2, (CUdeviceptr dptr), (dptr), 0, 0)
DEF_FREE(cuMemFreeAsync, (CUdeviceptr dptr, CUstream s), (dptr, s), s, 1)
DEF_FREE(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream s), (dptr, s), s, 1)

/* ---- memory pools: the shim's blocks counted as the pool's (swap mode) ---- */

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemPoolCreate, (pool, poolProps));
    if (rec && SHIM_UNLIKELY(g_shim.swap) && r == CUDA_SUCCESS && pool)
        swap_pool_created(*pool, poolProps);
    return r;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    int rec = shim_begin();
    if (rec && SHIM_UNLIKELY(g_shim.swap))
        swap_pool_destroyed(pool); /* its cached blocks go first */
    return REAL(cuMemPoolDestroy, (pool));
}

CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemPoolGetAttribute, (pool, attr, value));
    if (rec && SHIM_UNLIKELY(g_shim.swap) && r == CUDA_SUCCESS)
        swap_pool_attr(pool, attr, value);
    return r;
}

CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemPoolSetAttribute, (pool, attr, value));
    if (rec && SHIM_UNLIKELY(g_shim.swap) && r == CUDA_SUCCESS)
        swap_pool_reset_high(pool, attr); /* the only settable used/reserved attributes: high marks to 0 */
    return r;
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemPoolTrimTo, (pool, minBytesToKeep));
    if (rec && SHIM_UNLIKELY(g_shim.swap) && r == CUDA_SUCCESS)
        swap_pool_trim(pool, minBytesToKeep);
    return r;
}

/* ---- pinned and mapped host memory: host blocks (never swapped, not device memory) ----
 * A kernel may read pinned host memory through its host address (unified addressing) or through
 * the device pointer cuMemHostGetDevicePointer gives; when that differs, it is a second host
 * block, removed with the first. */

#define HOST_ALIAS_MAX 256
static pthread_mutex_t g_alias_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t host, dev, size;
} g_alias[HOST_ALIAS_MAX];
static unsigned g_alias_n;
static uint32_t g_alias_pid; /* the process the table is of: a fork child starts empty, as its blocks do */

/* Fork: the table's lock is taken around fork (before the blocks lock, as host_free takes them),
 * so that a child never starts with it held by a thread it does not have. */
void host_alias_atfork_prepare(void) { pthread_mutex_lock(&g_alias_mu); }
void host_alias_atfork_parent(void) { pthread_mutex_unlock(&g_alias_mu); }
void host_alias_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_alias_mu = fresh;
}

/* Under g_alias_mu. */
static void alias_own(void)
{
    if (g_alias_pid != g_shim.pid) {
        g_alias_pid = g_shim.pid;
        g_alias_n = 0;
    }
}

static void host_alloc(const void *p, size_t size)
{
    if (p)
        blocks_add((uint64_t)(uintptr_t)p, size, 0, PYOBMEM_ALLOC_HOST, current_device());
}

/* After a successful cuMemFreeHost / cuMemHostUnregister of p: the block and its aliases. */
static void host_free(const void *p, int known, const struct block *b)
{
    uint64_t h = (uint64_t)(uintptr_t)p;
    after_free(h, known, b, 0);
    pthread_mutex_lock(&g_alias_mu);
    alias_own();
    for (unsigned i = 0; i < g_alias_n;) {
        if (g_alias[i].host == h) {
            blocks_remove_range(g_alias[i].dev, g_alias[i].dev + g_alias[i].size, 0);
            g_alias[i] = g_alias[--g_alias_n];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&g_alias_mu);
}

/* The host block holding p, if p lies in one. */
static int host_block_of(uint64_t p, struct block *out)
{
    int found = 0;
    blocks_read_lock();
    const struct block *b = blocks_lookup(p);
    if (b && b->kind == PYOBMEM_ALLOC_HOST) {
        *out = *b;
        found = 1;
    }
    blocks_read_unlock();
    return found;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemHostAlloc, (pp, bytesize, Flags));
    if (rec && r == CUDA_SUCCESS && pp)
        host_alloc(*pp, bytesize);
    return r;
}

CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocHost_v2, (pp, bytesize));
    if (rec && r == CUDA_SUCCESS && pp)
        host_alloc(*pp, bytesize);
    return r;
}

CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocHost, (pp, bytesize));
    if (rec && r == CUDA_SUCCESS && pp)
        host_alloc(*pp, bytesize);
    return r;
}

#define DEF_HOST_REGISTER(NAME)                                             \
    CUresult CUDAAPI NAME(void *p, size_t bytesize, unsigned int Flags)     \
    {                                                                       \
        int rec = shim_begin();                                             \
        CUresult r = REAL(NAME, (p, bytesize, Flags));                      \
        if (rec && r == CUDA_SUCCESS)                                       \
            host_alloc(p, bytesize);                                        \
        return r;                                                           \
    }
DEF_HOST_REGISTER(cuMemHostRegister_v2)
DEF_HOST_REGISTER(cuMemHostRegister)

CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemHostGetDevicePointer_v2, (pdptr, p, Flags));
    struct block hb;
    uint64_t h = (uint64_t)(uintptr_t)p;
    if (rec && r == CUDA_SUCCESS && pdptr && *pdptr && *pdptr != h && host_block_of(h, &hb) &&
        !blocks_access_word(*pdptr)) {
        /* the device-side view of the whole host block, from its start */
        uint64_t dev = *pdptr - (h - hb.start), size = hb.end - hb.start;
        pthread_mutex_lock(&g_alias_mu);
        alias_own();
        int room = g_alias_n < HOST_ALIAS_MAX;
        if (room)
            g_alias[g_alias_n++] = (__typeof__(g_alias[0])){hb.start, dev, size};
        pthread_mutex_unlock(&g_alias_mu);
        if (room)
            blocks_add(dev, size, 0, PYOBMEM_ALLOC_HOST, hb.device);
    }
    return r;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    int rec = shim_begin();
    struct block b;
    int known = rec && blocks_find_start((uint64_t)(uintptr_t)p, &b);
    CUresult r = REAL(cuMemFreeHost, (p));
    if (rec && r == CUDA_SUCCESS)
        host_free(p, known, &b);
    return r;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    int rec = shim_begin();
    struct block b;
    int known = rec && blocks_find_start((uint64_t)(uintptr_t)p, &b);
    CUresult r = REAL(cuMemHostUnregister, (p));
    if (rec && r == CUDA_SUCCESS)
        host_free(p, known, &b);
    return r;
}

/* ---- virtual memory management: a mapping is a block ---- */

CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                     unsigned long long flags)
{
    shim_begin();
    return REAL(cuMemAddressReserve, (ptr, size, alignment, addr, flags));
}

CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    shim_begin();
    return REAL(cuMemAddressFree, (ptr, size));
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                             unsigned long long flags)
{
    shim_begin();
    return REAL(cuMemCreate, (handle, size, prop, flags));
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    shim_begin();
    return REAL(cuMemRelease, (handle));
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    int rec = shim_begin();
    CUresult r;
    /* on a VMM-backed block: recorded, and granted again at every remap (C17) */
    if (SHIM_UNLIKELY(g_shim.swap) && rec && swap_set_access(ptr, size, desc, count, &r))
        return r;
    return REAL(cuMemSetAccess, (ptr, size, desc, count));
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    int rec = shim_begin();
    if (SHIM_UNLIKELY(g_shim.swap) && rec)
        swap_never(dptr); /* another process may map it: never swapped from now on */
    return REAL(cuIpcGetMemHandle, (pHandle, dptr));
}

/* Pointer queries (Triton checks every pointer argument with cuPointerGetAttribute before a
 * launch): a swap block that is out has no mapping, and the driver would refuse the pointer. */
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    int rec = shim_begin(); /* also the shim's lazy init, when this is the first call */
    if (SHIM_UNLIKELY(g_shim.swap) && rec)
        swap_touch(ptr);
    return REAL(cuPointerGetAttribute, (data, attribute, ptr));
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
                                        CUdeviceptr ptr)
{
    int rec = shim_begin();
    if (SHIM_UNLIKELY(g_shim.swap) && rec)
        swap_touch(ptr);
    return REAL(cuPointerGetAttributes, (numAttributes, attributes, data, ptr));
}

CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    int rec = shim_begin();
    if (SHIM_UNLIKELY(g_shim.swap) && rec)
        swap_touch(dptr);
    return REAL(cuMemGetAddressRange_v2, (pbase, psize, dptr));
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemMap, (ptr, size, offset, handle, flags));
    if (rec && r == CUDA_SUCCESS) {
        int device = -1;
        CUmemAllocationProp prop;
        if (real_cuMemGetAllocationPropertiesFromHandle &&
            real_cuMemGetAllocationPropertiesFromHandle(&prop, handle) == CUDA_SUCCESS &&
            prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            device = prop.location.id;
        blocks_add(ptr, size, 0, PYOBMEM_ALLOC_VMM, device >= 0 ? device : current_device());
    }
    return r;
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemUnmap, (ptr, size));
    if (rec && r == CUDA_SUCCESS && blocks_remove_range(ptr, ptr + size, 0) == 0)
        ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_UNTRACKED,
                                            .untracked = {.addr = ptr, .kind = PYOBMEM_UNTRACKED_UNMAP}}, 1);
    return r;
}

/* ---- copies and sets: an op seq each, shared with launches ---- */

static void emit_copy(int kind, int async, uint64_t dst, uint64_t src, uint64_t bytes, CUstream s)
{
    uint64_t dw = kind == PYOBMEM_COPY_DTOH ? 0 : blocks_access_word(dst);
    uint64_t sw = kind == PYOBMEM_COPY_HTOD ? 0 : blocks_access_word(src);
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMCPY, .flags = (uint16_t)(kind | (async ? PYOBMEM_COPY_ASYNC : 0)),
                                        .memcpy = {.op = shim_next_op(), .dst = dw, .src = sw, .bytes = bytes,
                                                   .stream = (uint64_t)(uintptr_t)s}}, 1);
}

static void emit_set(int async, uint64_t dst, uint64_t value, uint64_t bytes, CUstream s)
{
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMSET, .flags = async ? PYOBMEM_COPY_ASYNC : 0,
                                        .memset = {.op = shim_next_op(), .dst = blocks_access_word(dst), .value = value,
                                                   .bytes = bytes, .stream = (uint64_t)(uintptr_t)s}}, 1);
}

#define DEF_COPY(NAME, KIND, DT, ST, DARG, SARG)                                        \
    CUresult CUDAAPI NAME(DT dst, ST src, size_t n)                                     \
    {                                                                                   \
        OP_OPEN(NAME, SWAP_KEY_COPY(KIND), 0, copy_prep(w_, KIND, DARG, SARG, n))       \
        CUresult r = REAL(NAME, (dst, src, n));                                         \
        if (rec && r == CUDA_SUCCESS)                                                   \
            emit_copy(KIND, 0, DARG, SARG, n, 0);                                       \
        OP_CLOSE(r)                                                                     \
        GPUCLOCK(NAME, 0, r);                                                           \
        return r;                                                                       \
    }
#define DEF_COPY_ASYNC(NAME, KIND, DT, ST, DARG, SARG)                                  \
    CUresult CUDAAPI NAME(DT dst, ST src, size_t n, CUstream s)                         \
    {                                                                                   \
        OP_OPEN(NAME, SWAP_KEY_COPY(KIND), s, copy_prep(w_, KIND, DARG, SARG, n))       \
        CUresult r = REAL(NAME, (dst, src, n, s));                                      \
        if (rec && r == CUDA_SUCCESS)                                                   \
            emit_copy(KIND, 1, DARG, SARG, n, s);                                       \
        OP_CLOSE(r)                                                                     \
        GPUCLOCK(NAME, s, r);                                                           \
        return r;                                                                       \
    }
#define DPTR(x) ((uint64_t)(x))
#define HPTR(x) ((uint64_t)(uintptr_t)(x))
DEF_COPY(cuMemcpy, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpy_ptds, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyHtoD_v2, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY(cuMemcpyHtoD_v2_ptds, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY(cuMemcpyDtoH_v2, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoH_v2_ptds, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoD_v2, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoD_v2_ptds, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyAsync, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyAsync_ptsz, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyHtoDAsync_v2, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoHAsync_v2, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoDAsync_v2, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))

#define DEF_PEER(NAME)                                                                                   \
    CUresult CUDAAPI NAME(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n)    \
    {                                                                                                    \
        OP_OPEN(NAME, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER), 0, copy_words(w_, PYOBMEM_COPY_OTHER, dst, src, n)) \
        CUresult r = REAL(NAME, (dst, dctx, src, sctx, n));                                              \
        if (rec && r == CUDA_SUCCESS)                                                                    \
            emit_copy(PYOBMEM_COPY_OTHER, 0, dst, src, n, 0);                                            \
        OP_CLOSE(r)                                                                                      \
        GPUCLOCK(NAME, 0, r);                                                                            \
        return r;                                                                                        \
    }
#define DEF_PEER_ASYNC(NAME)                                                                                      \
    CUresult CUDAAPI NAME(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s) \
    {                                                                                                             \
        OP_OPEN(NAME, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER), s, copy_words(w_, PYOBMEM_COPY_OTHER, dst, src, n))      \
        CUresult r = REAL(NAME, (dst, dctx, src, sctx, n, s));                                                    \
        if (rec && r == CUDA_SUCCESS)                                                                             \
            emit_copy(PYOBMEM_COPY_OTHER, 1, dst, src, n, s);                                                     \
        OP_CLOSE(r)                                                                                               \
        GPUCLOCK(NAME, s, r);                                                                                     \
        return r;                                                                                                 \
    }
DEF_PEER(cuMemcpyPeer)
DEF_PEER(cuMemcpyPeer_ptds)
DEF_PEER_ASYNC(cuMemcpyPeerAsync)
DEF_PEER_ASYNC(cuMemcpyPeerAsync_ptsz)

/* 2D/3D copies: kind from the memory types, device sides at their first byte. */
static int side_is_device(CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; }

static int nd_kind(CUmemorytype st, CUmemorytype dt)
{
    if (st == CU_MEMORYTYPE_HOST && dt == CU_MEMORYTYPE_DEVICE)
        return PYOBMEM_COPY_HTOD;
    if (st == CU_MEMORYTYPE_DEVICE && dt == CU_MEMORYTYPE_HOST)
        return PYOBMEM_COPY_DTOH;
    if (st == CU_MEMORYTYPE_DEVICE && dt == CU_MEMORYTYPE_DEVICE)
        return PYOBMEM_COPY_DTOD;
    return PYOBMEM_COPY_OTHER;
}

static void emit_copy_nd(CUmemorytype st, uint64_t src, CUmemorytype dt, uint64_t dst, uint64_t bytes, int async,
                         CUstream s)
{
    int kind = nd_kind(st, dt);
    uint64_t dw = side_is_device(dt) ? blocks_access_word(dst) : 0;
    uint64_t sw = side_is_device(st) ? blocks_access_word(src) : 0;
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMCPY, .flags = (uint16_t)(kind | (async ? PYOBMEM_COPY_ASYNC : 0)),
                                        .memcpy = {.op = shim_next_op(), .dst = dw, .src = sw, .bytes = bytes,
                                                   .stream = (uint64_t)(uintptr_t)s}}, 1);
}

static void emit_copy2d(const CUDA_MEMCPY2D *p, int async, CUstream s)
{
    if (!p)
        return;
    uint64_t src = p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes;
    uint64_t dst = p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes;
    emit_copy_nd(p->srcMemoryType, src, p->dstMemoryType, dst, (uint64_t)p->WidthInBytes * p->Height, async, s);
}

static void emit_copy3d(const CUDA_MEMCPY3D *p, int async, CUstream s)
{
    if (!p)
        return;
    uint64_t src = p->srcDevice + (p->srcZ * p->srcHeight + p->srcY) * p->srcPitch + p->srcXInBytes;
    uint64_t dst = p->dstDevice + (p->dstZ * p->dstHeight + p->dstY) * p->dstPitch + p->dstXInBytes;
    emit_copy_nd(p->srcMemoryType, src, p->dstMemoryType, dst, (uint64_t)p->WidthInBytes * p->Height * p->Depth,
                 async, s);
}

/* Swap mode: an N-D copy's key and words (first and last byte of each device side). */
static uint64_t nd_words2d(const CUDA_MEMCPY2D *p, uint64_t w[4])
{
    memset(w, 0, 4 * sizeof *w);
    if (!p)
        return SWAP_KEY_COPY(PYOBMEM_COPY_OTHER);
    uint64_t span = p->Height ? (p->Height - 1) : 0;
    if (side_is_device(p->dstMemoryType)) {
        w[0] = p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes;
        w[1] = w[0] + span * p->dstPitch + (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    if (side_is_device(p->srcMemoryType)) {
        w[2] = p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes;
        w[3] = w[2] + span * p->srcPitch + (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    return SWAP_KEY_COPY(nd_kind(p->srcMemoryType, p->dstMemoryType));
}

static uint64_t nd_words3d(const CUDA_MEMCPY3D *p, uint64_t w[4])
{
    memset(w, 0, 4 * sizeof *w);
    if (!p)
        return SWAP_KEY_COPY(PYOBMEM_COPY_OTHER);
    if (side_is_device(p->dstMemoryType)) {
        w[0] = p->dstDevice + (p->dstZ * p->dstHeight + p->dstY) * p->dstPitch + p->dstXInBytes;
        w[1] = w[0] + ((p->Depth ? p->Depth - 1 : 0) * p->dstHeight + (p->Height ? p->Height - 1 : 0)) * p->dstPitch +
               (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    if (side_is_device(p->srcMemoryType)) {
        w[2] = p->srcDevice + (p->srcZ * p->srcHeight + p->srcY) * p->srcPitch + p->srcXInBytes;
        w[3] = w[2] + ((p->Depth ? p->Depth - 1 : 0) * p->srcHeight + (p->Height ? p->Height - 1 : 0)) * p->srcPitch +
               (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    return SWAP_KEY_COPY(nd_kind(p->srcMemoryType, p->dstMemoryType));
}
#define nd_words_CUDA_MEMCPY2D nd_words2d
#define nd_words_CUDA_MEMCPY3D nd_words3d

#define DEF_COPY_ND(NAME, T, EMIT)                                                \
    CUresult CUDAAPI NAME(const T *p)                                             \
    {                                                                             \
        OP_OPEN(NAME, 0, 0, key_ = nd_words_##T(p, w_))                           \
        CUresult r = REAL(NAME, (p));                                             \
        if (rec && r == CUDA_SUCCESS)                                             \
            EMIT(p, 0, 0);                                                        \
        OP_CLOSE(r)                                                               \
        GPUCLOCK(NAME, 0, r);                                                     \
        return r;                                                                 \
    }
#define DEF_COPY_ND_ASYNC(NAME, T, EMIT)                                          \
    CUresult CUDAAPI NAME(const T *p, CUstream s)                                 \
    {                                                                             \
        OP_OPEN(NAME, 0, s, key_ = nd_words_##T(p, w_))                           \
        CUresult r = REAL(NAME, (p, s));                                          \
        if (rec && r == CUDA_SUCCESS)                                             \
            EMIT(p, 1, s);                                                        \
        OP_CLOSE(r)                                                               \
        GPUCLOCK(NAME, s, r);                                                     \
        return r;                                                                 \
    }
DEF_COPY_ND(cuMemcpy2D_v2, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND(cuMemcpy2D_v2_ptds, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND_ASYNC(cuMemcpy2DAsync_v2, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND_ASYNC(cuMemcpy2DAsync_v2_ptsz, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND(cuMemcpy3D_v2, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND(cuMemcpy3D_v2_ptds, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND_ASYNC(cuMemcpy3DAsync_v2, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND_ASYNC(cuMemcpy3DAsync_v2_ptsz, CUDA_MEMCPY3D, emit_copy3d)

/* ---- batched copies: cuMemcpyBatchAsync and cuMemcpy3DBatchAsync ----
 *
 * Two shapes: CUDA 12.8's (cuMemcpyBatchAsync, _ptsz: a `size_t *failIdx` before the stream) and
 * 13.0's (_v2, _v2_ptsz: none). Each wrapper passes its own arguments through untouched.
 *
 * A batch is one op: one op seq and one MEMCPY record, kind OTHER | ASYNC as for cuMemcpyAsync
 * (the pointers are unified), b and c = the first copy's destination and source words, d = bytes
 * of all copies, e = stream; in the same ring group, ACCESS records with the same op seq name the
 * other blocks the batch touches (each once, at the first offset seen). In swap mode it is one swap
 * op (one plan position, as the planner counts one op seq) whose words are both ends of every
 * pointer operand of every copy: every block any copy touches is resident before the real call.
 *
 * 3D batches: extents are in elements; between two pointers an element is a byte. When one side
 * is a CUDA array, its element size is not queried: the bytes recorded and the pointer side's last
 * word use 1 (a lower bound; the first byte still names the block, and a copy never spans two
 * allocations). Array operands are not blocks. */
#define BATCH_STACK_OPS 64

/* Swap mode: the candidate words of a batch (4 per copy). */
struct batch_words {
    uint64_t *w;
    size_t n;
    int how; /* SWAP_OP_INCOMPLETE when they could not be listed: everything comes back first */
    uint64_t stack[4 * BATCH_STACK_OPS];
};

static int batch_words_init(struct batch_words *bw, size_t ops, int readable)
{
    bw->w = bw->stack;
    bw->n = 0;
    bw->how = 0;
    if (ops == 0)
        return 0;
    if (!readable) { /* arrays the driver will refuse: name nothing, assume anything */
        bw->how = SWAP_OP_INCOMPLETE;
        return 0;
    }
    if (ops <= BATCH_STACK_OPS)
        return 1;
    uint64_t *w = ops <= SIZE_MAX / (4 * sizeof *w) ? malloc(ops * 4 * sizeof *w) : NULL;
    if (!w) {
        bw->how = SWAP_OP_INCOMPLETE;
        return 0;
    }
    bw->w = w;
    return 1;
}

static void batch_words_free(struct batch_words *bw)
{
    if (bw->w != bw->stack)
        free(bw->w);
}

static void batch_words_1d(struct batch_words *bw, const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                           const size_t *sizes, size_t count)
{
    if (!batch_words_init(bw, count, dsts && srcs && sizes))
        return;
    for (size_t i = 0; i < count; i++)
        copy_words(bw->w + 4 * i, PYOBMEM_COPY_OTHER, dsts[i], srcs[i], sizes[i]);
    bw->n = 4 * count;
}

/* First and last byte of a 3D batch operand (0, 0 for a CUDA array). */
static void operand_words(const CUmemcpy3DOperand *o, const CUextent3D *e, uint64_t w[2])
{
    w[0] = w[1] = 0;
    if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER || !o->op.ptr.ptr)
        return;
    uint64_t row = o->op.ptr.rowLength ? o->op.ptr.rowLength : e->width;
    uint64_t layer = o->op.ptr.layerHeight ? o->op.ptr.layerHeight : e->height;
    uint64_t h = e->height ? e->height - 1 : 0, d = e->depth ? e->depth - 1 : 0;
    w[0] = o->op.ptr.ptr;
    w[1] = w[0] + (d * layer + h) * row + (e->width ? e->width - 1 : 0);
}

static void batch_words_3d(struct batch_words *bw, const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n)
{
    if (!batch_words_init(bw, n, ops != NULL))
        return;
    for (size_t i = 0; i < n; i++) {
        operand_words(&ops[i].dst, &ops[i].extent, bw->w + 4 * i);
        operand_words(&ops[i].src, &ops[i].extent, bw->w + 4 * i + 2);
    }
    bw->n = 4 * n;
}

/* Access word of addr; the caller holds the blocks read lock. */
static uint64_t word_locked(uint64_t addr)
{
    const struct block *b = addr ? blocks_lookup(addr) : NULL;
    return b ? PYOBMEM_ACCESS_WORD(b->id, addr - b->start) : 0;
}

/* The batch's MEMCPY record and its ACCESS records (t->words[n0..]), one ring group. */
static void emit_batch(uint64_t b, uint64_t c, uint64_t bytes, CUstream s, const struct touched *t, uint32_t n0)
{
    static int noted;
    struct pyobmem_record recs[1 + (SHIM_MAX_TOUCHED + 3) / 4];
    memset(recs, 0, sizeof recs);
    uint64_t seq = shim_next_op();
    recs[0].type = PYOBMEM_EV_MEMCPY;
    recs[0].flags = PYOBMEM_COPY_OTHER | PYOBMEM_COPY_ASYNC;
    recs[0].memcpy.op = seq;
    recs[0].memcpy.dst = b;
    recs[0].memcpy.src = c;
    recs[0].memcpy.bytes = bytes;
    recs[0].memcpy.stream = (uint64_t)(uintptr_t)s;
    ring_write(recs, 1 + pack_accesses(recs + 1, seq, t->words + n0, t->n > n0 ? t->n - n0 : 0));
    if (t->truncated && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))
        ring_note("batch copy touched more than %d blocks: the others are not recorded", SHIM_MAX_TOUCHED);
}

static void emit_batch_1d(const CUdeviceptr *dsts, const CUdeviceptr *srcs, const size_t *sizes, size_t count,
                          CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint64_t b = 0, c = 0, bytes = 0;
    uint32_t n0 = 0;
    if (count && dsts && srcs && sizes) {
        blocks_read_lock();
        b = word_locked(dsts[0]);
        c = word_locked(srcs[0]);
        touched_add(&t, dsts[0]);
        touched_add(&t, srcs[0]);
        n0 = t.n; /* named by b and c */
        for (size_t i = 0; i < count; i++) {
            touched_add(&t, dsts[i]);
            touched_add(&t, srcs[i]);
            bytes += sizes[i];
        }
        blocks_read_unlock();
    }
    emit_batch(b, c, bytes, s, &t, n0);
}

static void emit_batch_3d(const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n, CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint64_t b = 0, c = 0, bytes = 0, w[4];
    uint32_t n0 = 0;
    if (n && ops) {
        blocks_read_lock();
        for (size_t i = 0; i < n; i++) {
            operand_words(&ops[i].dst, &ops[i].extent, w);
            operand_words(&ops[i].src, &ops[i].extent, w + 2);
            if (i == 0) {
                b = word_locked(w[0]);
                c = word_locked(w[2]);
            }
            if (w[0])
                touched_add(&t, w[0]);
            if (w[2])
                touched_add(&t, w[2]);
            if (i == 0)
                n0 = t.n;
            bytes += (uint64_t)ops[i].extent.width * ops[i].extent.height * ops[i].extent.depth;
        }
        blocks_read_unlock();
    }
    emit_batch(b, c, bytes, s, &t, n0);
}

/* One hook: the swap op around the real call (swap mode), the record after a success. */
#define DEF_BATCH(NAME, PARAMS, ARGS, WORDS, EMIT)                                                        \
    CUresult CUDAAPI NAME PARAMS                                                                          \
    {                                                                                                     \
        int rec = shim_begin();                                                                           \
        int sw = rec && SHIM_UNLIKELY(g_shim.swap);                                                       \
        struct swap_op op;                                                                                \
        op.active = 0;                                                                                    \
        if (sw) {                                                                                         \
            struct batch_words bw;                                                                        \
            WORDS;                                                                                        \
            CUresult f = swap_op_begin(&op, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER),                           \
                                       swap_norm_stream(hStream, per_thread_name(#NAME)), bw.how, bw.w, bw.n); \
            batch_words_free(&bw);                                                                        \
            if (f != CUDA_SUCCESS)                                                                        \
                return f;                                                                                 \
        }                                                                                                 \
        CUresult r = REAL(NAME, ARGS);                                                                    \
        if (rec && r == CUDA_SUCCESS)                                                                     \
            EMIT;                                                                                         \
        if (sw)                                                                                           \
            swap_op_end(&op, r);                                                                          \
        GPUCLOCK(NAME, hStream, r);  \
        return r;                                                                                         \
    }
#define BATCH_1D_PARAMS CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, \
                        size_t *attrsIdxs, size_t numAttrs
#define BATCH_1D_ARGS dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs
#define BATCH_1D_WORDS batch_words_1d(&bw, dsts, srcs, sizes, count)
#define BATCH_1D_EMIT emit_batch_1d(dsts, srcs, sizes, count, hStream)
#define BATCH_3D_WORDS batch_words_3d(&bw, opList, numOps)
#define BATCH_3D_EMIT emit_batch_3d(opList, numOps, hStream)
DEF_BATCH(cuMemcpyBatchAsync, (BATCH_1D_PARAMS, size_t *failIdx, CUstream hStream),
          (BATCH_1D_ARGS, failIdx, hStream), BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_ptsz, (BATCH_1D_PARAMS, size_t *failIdx, CUstream hStream),
          (BATCH_1D_ARGS, failIdx, hStream), BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_v2, (BATCH_1D_PARAMS, CUstream hStream), (BATCH_1D_ARGS, hStream), BATCH_1D_WORDS,
          BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_v2_ptsz, (BATCH_1D_PARAMS, CUstream hStream), (BATCH_1D_ARGS, hStream),
          BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags, CUstream hStream),
          (numOps, opList, failIdx, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_ptsz,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags, CUstream hStream),
          (numOps, opList, failIdx, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_v2, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags, CUstream hStream),
          (numOps, opList, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_v2_ptsz,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags, CUstream hStream),
          (numOps, opList, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)

/* Sets: MEMSET d = bytes written (elements x element size); flags = PYOBMEM_COPY_ASYNC for the
 * stream-ordered variants. */
/* Swap mode: a set's words (its first and last byte). */
static void set_words(uint64_t w[4], uint64_t dst, uint64_t extent)
{
    w[0] = dst;
    w[1] = extent ? dst + extent - 1 : dst;
    w[2] = w[3] = 0;
}
#define DEF_SET_OP(NAME, PARAMS, ARGS, S, EXTENT, ASYNC, BYTES)                                  \
    CUresult CUDAAPI NAME PARAMS                                                                  \
    {                                                                                             \
        OP_OPEN(NAME, SWAP_KEY_SET, S, set_words(w_, dst, (EXTENT)))                              \
        CUresult r = REAL(NAME, ARGS);                                                            \
        if (rec && r == CUDA_SUCCESS)                                                             \
            emit_set(ASYNC, dst, v, (BYTES), S);                                                  \
        OP_CLOSE(r)                                                                               \
        GPUCLOCK(NAME, S, r);                                                                     \
        return r;                                                                                 \
    }
#define DEF_SET(NAME, VT, ESZ) \
    DEF_SET_OP(NAME, (CUdeviceptr dst, VT v, size_t n), (dst, v, n), 0, (uint64_t)n * ESZ, 0, (uint64_t)n * ESZ)
#define DEF_SET_ASYNC(NAME, VT, ESZ)                                                                      \
    DEF_SET_OP(NAME, (CUdeviceptr dst, VT v, size_t n, CUstream s), (dst, v, n, s), s, (uint64_t)n * ESZ, 1, \
               (uint64_t)n * ESZ)
#define SET2D_EXTENT(pitch, w, h, ESZ) ((h) ? ((uint64_t)(h) - 1) * (pitch) + (uint64_t)(w) * (ESZ) : 0)
#define DEF_SET2D(NAME, VT, ESZ)                                                                       \
    DEF_SET_OP(NAME, (CUdeviceptr dst, size_t pitch, VT v, size_t w, size_t h), (dst, pitch, v, w, h), 0, \
               SET2D_EXTENT(pitch, w, h, ESZ), 0, (uint64_t)w * h * ESZ)
#define DEF_SET2D_ASYNC(NAME, VT, ESZ)                                                                 \
    DEF_SET_OP(NAME, (CUdeviceptr dst, size_t pitch, VT v, size_t w, size_t h, CUstream s),            \
               (dst, pitch, v, w, h, s), s, SET2D_EXTENT(pitch, w, h, ESZ), 1, (uint64_t)w * h * ESZ)
DEF_SET(cuMemsetD8_v2, unsigned char, 1)
DEF_SET(cuMemsetD8_v2_ptds, unsigned char, 1)
DEF_SET(cuMemsetD16_v2, unsigned short, 2)
DEF_SET(cuMemsetD16_v2_ptds, unsigned short, 2)
DEF_SET(cuMemsetD32_v2, unsigned int, 4)
DEF_SET(cuMemsetD32_v2_ptds, unsigned int, 4)
DEF_SET_ASYNC(cuMemsetD8Async, unsigned char, 1)
DEF_SET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1)
DEF_SET_ASYNC(cuMemsetD16Async, unsigned short, 2)
DEF_SET_ASYNC(cuMemsetD16Async_ptsz, unsigned short, 2)
DEF_SET_ASYNC(cuMemsetD32Async, unsigned int, 4)
DEF_SET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4)
DEF_SET2D(cuMemsetD2D8_v2, unsigned char, 1)
DEF_SET2D(cuMemsetD2D8_v2_ptds, unsigned char, 1)
DEF_SET2D(cuMemsetD2D32_v2, unsigned int, 4)
DEF_SET2D(cuMemsetD2D32_v2_ptds, unsigned int, 4)
DEF_SET2D_ASYNC(cuMemsetD2D8Async, unsigned char, 1)
DEF_SET2D_ASYNC(cuMemsetD2D8Async_ptsz, unsigned char, 1)
DEF_SET2D_ASYNC(cuMemsetD2D32Async, unsigned int, 4)
DEF_SET2D_ASYNC(cuMemsetD2D32Async_ptsz, unsigned int, 4)
