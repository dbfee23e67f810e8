/*
 * Allocation, free, memory pools, pinned host memory, VMM and managed memory (copies and sets:
 * copy.c).
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
        if (rec && r == CUDA_SUCCESS && !served && SHIM_UNLIKELY(g_shim.swap))                            \
            swap_counted_elsewhere(bytesize);                                                             \
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

/* Fork: the table's lock is taken around fork (before the blocks lock, as host_block_free takes them),
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

static void host_block_alloc(const void *p, size_t size)
{
    if (p)
        blocks_add((uint64_t)(uintptr_t)p, size, 0, PYOBMEM_ALLOC_HOST, current_device());
}

/* After a successful cuMemFreeHost / cuMemHostUnregister of p: the block and its aliases. */
static void host_block_free(const void *p, int known, const struct block *b)
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
        host_block_alloc(*pp, bytesize);
    return r;
}

CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocHost_v2, (pp, bytesize));
    if (rec && r == CUDA_SUCCESS && pp)
        host_block_alloc(*pp, bytesize);
    return r;
}

CUresult CUDAAPI cuMemAllocHost(void **pp, unsigned int bytesize)
{
    int rec = shim_begin();
    CUresult r = REAL(cuMemAllocHost, (pp, bytesize));
    if (rec && r == CUDA_SUCCESS && pp)
        host_block_alloc(*pp, bytesize);
    return r;
}

#define DEF_HOST_REGISTER(NAME)                                             \
    CUresult CUDAAPI NAME(void *p, size_t bytesize, unsigned int Flags)     \
    {                                                                       \
        int rec = shim_begin();                                             \
        CUresult r = REAL(NAME, (p, bytesize, Flags));                      \
        if (rec && r == CUDA_SUCCESS)                                       \
            host_block_alloc(p, bytesize);                                        \
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
        host_block_free(p, known, &b);
    return r;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    int rec = shim_begin();
    struct block b;
    int known = rec && blocks_find_start((uint64_t)(uintptr_t)p, &b);
    CUresult r = REAL(cuMemHostUnregister, (p));
    if (rec && r == CUDA_SUCCESS)
        host_block_free(p, known, &b);
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
