/*
 * The allocator of swap mode (swap_state.h; docs/swap.md "Stream-ordered blocks"). cuMemAlloc_v2
 * blocks and stream-ordered ones (cuMemAllocAsync, cuMemAllocFromPoolAsync on a pool the shim
 * serves) of at least min_swap_bytes are swap blocks: a reservation, physical memory mapped at it.
 *
 * A stream-ordered block freed by cuMemFreeAsync stays cached by size class (its reserved bytes),
 * its reservation and physical memory kept: reused on the stream that freed it at once (stream
 * order), on another only once the event recorded at the free has completed (C20). The steady
 * state of a training loop then makes no cuMemCreate, cuMemRelease, cuMemAddressReserve or
 * cuMemMap. Cached memory counts against the budget, and is trimmed first (cache_trim,
 * swap_cache.c) when the device would pass it, on cuMemPoolTrimTo of its pool, and when the
 * device is out of memory.
 * A cuMemAlloc block is given back whole at its free, as the real cuMemFree does.
 *
 * Pools: the default pool of a device and pools made by cuMemPoolCreate device-located and not
 * exportable are served; the used/reserved attributes of such a pool count the shim's blocks as
 * its own (torch.cuda.memory_allocated() under backend:cudaMallocAsync reads them).
 */
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

/* ---- pools whose blocks the shim serves (default pools, and pools created device-located and
 * not exportable), and what their queries add for the shim's blocks ---- */
#define MAX_POOLS 32
struct pool_acct {
    CUmemoryPool pool;
    int device;
    int eligible;
    uint64_t used, reserved, used_high, reserved_high; /* the shim's blocks of this pool, bytes */
};
static struct pool_acct g_pools[MAX_POOLS];
static int g_npools;
static int g_noted_nogrow, g_noted_capfree, g_noted_pool;

static struct pool_acct *pool_find(CUmemoryPool pool)
{
    for (int i = 0; i < g_npools; i++)
        if (g_pools[i].pool == pool)
            return &g_pools[i];
    return NULL;
}

static struct pool_acct *pool_add(CUmemoryPool pool, int device, int eligible)
{
    struct pool_acct *p = pool_find(pool);
    if (!p && g_npools < MAX_POOLS) {
        p = &g_pools[g_npools++];
        memset(p, 0, sizeof *p);
        p->pool = pool;
    }
    if (p) {
        p->device = device;
        p->eligible = eligible;
    }
    return p;
}

/* The pool a stream-ordered allocation on device dev is served for, when the shim may serve it
 * (the device's default pool, or one created device-located and not exportable), else NULL. */
static struct pool_acct *pool_eligible(CUmemoryPool pool, int from_pool, int dev)
{
    if (!from_pool && (!real_cuDeviceGetMemPool || real_cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS))
        return NULL;
    struct pool_acct *p = pool_find(pool);
    if (p)
        return p->eligible && p->device == dev ? p : NULL;
    CUmemoryPool def = NULL;
    if (!real_cuDeviceGetDefaultMemPool || real_cuDeviceGetDefaultMemPool(&def, dev) != CUDA_SUCCESS || def != pool)
        return NULL;
    return pool_add(pool, dev, 1);
}

void pool_count(CUmemoryPool pool, int64_t used, int64_t reserved)
{
    struct pool_acct *p = pool ? pool_find(pool) : NULL;
    if (!p)
        return;
    p->used += (uint64_t)used;
    p->reserved += (uint64_t)reserved;
    if (p->used > p->used_high)
        p->used_high = p->used;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
}

static void destroy_block(struct sblock *b)
{
    for (int i = 0; i < MAX_USES; i++)
        if (b->uses[i].ev)
            real_cuEventDestroy_v2(b->uses[i].ev);
    if (b->copy_ev)
        real_cuEventDestroy_v2(b->copy_ev);
    if (b->free_ev)
        real_cuEventDestroy_v2(b->free_ev);
    free(b);
}

/* The device and granularity of the current context, the copy streams made: 0 when the shim
 * cannot serve blocks here (another context than the one its streams were first made in, or a
 * query failed). */
static int alloc_setup(CUdevice *dev)
{
    CUcontext ctx = NULL;
    if (real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || real_cuCtxGetDevice(dev) != CUDA_SUCCESS || *dev < 0 ||
        *dev >= MAX_DEVICES || (g_ctx && g_ctx != ctx))
        return 0;
    if (!g_gran[*dev]) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = *dev;
        size_t g = 0;
        if (real_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
            return 0;
        g_gran[*dev] = g;
    }
    /* the copy streams and the swap-in events, made once (kept across a failure to retry, in the
     * same context only: a stream is its context's) */
    if (!g_d2h && real_cuStreamCreate(&g_d2h, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        g_d2h = NULL;
    if (!g_h2d && real_cuStreamCreate(&g_h2d, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        g_h2d = NULL;
    if (!g_h2d_handoff && real_cuStreamCreate(&g_h2d_handoff, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        g_h2d_handoff = NULL;
    if (!g_h2d_ev)
        g_h2d_ev = ev_new();
    if (!g_handoff_ev)
        g_handoff_ev = ev_new();
    if (g_d2h || g_h2d || g_h2d_handoff || g_h2d_ev || g_handoff_ev)
        g_ctx = ctx;
    return g_d2h && g_h2d && g_h2d_handoff && g_h2d_ev && g_handoff_ev;
}

/* A cached block made live again for `size` bytes (g_mu held). Its access is the default again;
 * a free still pending on s becomes its first use, so a swap-out of it waits for that too. */
static void revive(struct sblock *b, uint64_t size, uint64_t stamp)
{
    uint64_t rw = (1ull << b->device) | g_peers[b->device];
    b->size = size;
    b->id = 0;
    b->flags = 0;
    b->state = SB_RESIDENT;
    b->lru = stamp;
    b->stamp = b->tried = 0;
    b->inflight = 0;
    b->site = 0;
    forget_uses(b);
    if (b->free_live) {
        CUevent e = b->uses[0].ev;
        b->uses[0] = (struct use){b->free_stream, b->free_ev, 1};
        b->free_ev = e;
        b->free_live = 0;
    }
    if (b->handle && (b->rw != rw || b->ro)) {
        b->rw = rw;
        b->ro = 0;
        grant(b);
    }
    b->rw = rw;
    b->ro = 0;
}

/* Serve `size` bytes (g_mu held, setup done): a cached block of its class when one is ready on
 * stream s (ordered blocks only), else a new reservation; physical memory from a spare handle,
 * (ordered blocks) a cached block of another pool or a swap-out still copying, or cuMemCreate,
 * under the budget. NULL: the caller uses the driver's allocator. */
static struct sblock *serve(uint64_t size, int dev, struct pool_acct *pool, CUstream s)
{
    size_t gran = g_gran[dev];
    if (size > SIZE_MAX - gran)
        return NULL;
    uint64_t vsize = (size + gran - 1) / gran * gran, stamp = ++g_tick;
    peers_of(dev);
    struct sblock *b = pool ? cache_take(vsize, dev, pool->pool, s) : NULL;
    if (b && b->handle) { /* already mapped and counted: the steady state */
        revive(b, size, stamp);
        if (!table_add(b)) {
            cache_put(b);
            return NULL;
        }
        pool_count(b->pool, (int64_t)size, 0); /* counted once it is the application's */
        return b;
    }
    /* a stream-ordered block may take a swap-out's memory still copying: s waits for the copy */
    hold_budget(vsize, pool ? dev : -1, stamp);
    CUdeviceptr va = b ? b->addr : 0;
    if (!b) {
        if (!(b = calloc(1, sizeof *b)))
            return NULL;
        if (real_cuMemAddressReserve(&va, vsize, gran, 0, 0) != CUDA_SUCCESS || !va) {
            free(b);
            return NULL;
        }
        b->addr = va;
        b->vsize = vsize;
        b->device = dev;
        b->ordered = pool != NULL;
        b->pool = pool ? pool->pool : NULL;
    }
    revive(b, size, stamp);
    CUevent after = NULL;
    CUresult r = map_block(b, pool ? &after : NULL);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        cache_trim(UINT64_MAX, NULL);
        drain_outs();
        r = map_block(b, pool ? &after : NULL);
    }
    if (r == CUDA_SUCCESS && after && real_cuStreamWaitEvent(s, after, 0) != CUDA_SUCCESS)
        real_cuEventSynchronize(after); /* the stream cannot wait: the host does */
    if (r == CUDA_SUCCESS && table_add(b)) {
        pool_count(b->pool, (int64_t)size, (int64_t)vsize);
        return b;
    }
    if (r == CUDA_SUCCESS)
        unmap_block(b);
    if (r != CUDA_SUCCESS && !g_noted_nogrow) {
        g_noted_nogrow = 1;
        ring_note("swap.warn=device memory for the shim's blocks cannot grow (CUresult %d at %llu bytes); "
                  "new blocks go to the driver's allocator and cannot be swapped",
                  (int)r, (unsigned long long)vsize);
    }
    if (b->ordered && cache_put(b))
        return NULL; /* its reservation stays cached */
    real_cuMemAddressFree(b->addr, b->vsize);
    destroy_block(b);
    return NULL;
}

int swap_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, int kind, CUstream s)
{
    uint64_t min = __atomic_load_n(&g_ctl->min_swap_bytes, __ATOMIC_RELAXED);
    if (!dptr || size == 0 || size < min)
        return 0;
    int unknown = 0;
    /* a graph's allocation node belongs to the driver's pool */
    int captured = kind != SWAP_ALLOC_DRIVER && (capturing(s, &unknown) || unknown);
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    struct slow_mark slow;
    slow_begin(&slow);
    swap_lock();
    slow_waits(&slow);
    uint64_t t0 = shim_now_ns();
    CUdevice dev = 0;
    struct sblock *b = NULL;
    if (!captured && alloc_setup(&dev)) {
        struct pool_acct *p = NULL;
        if (kind == SWAP_ALLOC_DRIVER || (p = pool_eligible(pool, kind == SWAP_ALLOC_FROM_POOL, (int)dev)))
            b = serve(size, (int)dev, p, s);
        else if (!g_noted_pool) {
            g_noted_pool = 1;
            ring_note("swap: large stream-ordered blocks of a pool the shim does not serve (exportable, host-located "
                      "or not made by cuMemPoolCreate) stay the driver's: not swappable");
        }
    }
    if (b && kind != SWAP_ALLOC_DRIVER)
        plan_allocation(b, size); /* the driver's own: swap_counted_elsewhere, once it succeeded */
    if (b)
        *dptr = b->addr;
    g_waits.alloc_ns += shim_now_ns() - t0;
    g_waits.allocs++;
    slow_end(&slow, b ? "alloc" : "alloc_not_served", plan_hint_position(), size);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
    return b != NULL;
}

void swap_counted_elsewhere(size_t size)
{
    if (size < __atomic_load_n(&g_ctl->min_swap_bytes, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&g_mu);
    plan_allocation(NULL, size); /* the planner counts the trace's allocations: this one is there */
    pthread_mutex_unlock(&g_mu);
}

void swap_bind_id(uint64_t addr, uint32_t id)
{
    pthread_mutex_lock(&g_mu);
    struct sblock *b = block_at(addr);
    if (b && b->addr == addr)
        b->id = id;
    pthread_mutex_unlock(&g_mu);
}

/* Everything of b back to the driver, as the real cuMemFree does. Returns 0 (b untouched) when
 * its memory cannot be unmapped. */
static int release_block(struct sblock *b, CUresult *rc)
{
    if (b->handle && (*rc = unmap_block(b)) != CUDA_SUCCESS) /* a cached reservation has none */
        return 0;
    *rc = real_cuMemAddressFree(b->addr, b->vsize);
    destroy_block(b);
    return 1;
}

int swap_free(CUdeviceptr dptr, CUstream s, int ordered, CUresult *rc)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    struct slow_mark slow;
    slow_begin(&slow);
    swap_lock();
    slow_waits(&slow);
    struct sblock *b = block_at(dptr);
    if (!b || b->addr != dptr) {
        pthread_mutex_unlock(&g_mu);
        unrelax(relaxed, old);
        return 0;
    }
    uint64_t t0 = shim_now_ns(), bytes = b->size; /* b may be gone by the end */
    int pushed = ctx_enter();
    int unknown = 0;
    CUresult r = CUDA_SUCCESS;
    if (ordered && (capturing(s, &unknown) || unknown)) {
        /* A free captured into a graph runs at each replay, which the shim cannot follow: the
         * block stays allocated, resident and never swapped (the trace forgets it: the graph's
         * kernels that use it would not name it) for the rest of the run. */
        if (!g_noted_capfree) {
            g_noted_capfree = 1;
            ring_note("swap: a shim block freed inside a stream capture stays allocated, never swapped");
        }
        b->flags |= SBF_NEVER;
        bring_back(b);
        pool_count(b->pool, -(int64_t)b->size, 0); /* freed for the application, still reserved */
        goto out;
    }
    table_remove(b);
    /* Its memory went to another block while its copy out runs: a cuMemFree waits for the copy
     * (as for its last uses), a cuMemFreeAsync does not (free_finish, once the copy has ended). */
    if (!(ordered && b->ordered))
        settle_out(b);
    if (b->state == SB_OUT_PENDING && !(b->flags & SBF_GIVEN))
        cancel_out(b); /* its copy goes on; reuse is ordered after it below */
    int copying = b->copy_ev && b->state != SB_OUT && real_cuEventQuery(b->copy_ev) == CUDA_ERROR_NOT_READY;
    if (ordered && b->ordered && (b->free_ev || (b->free_ev = ev_new())) &&
        (!copying || real_cuStreamWaitEvent(s, b->copy_ev, 0) == CUDA_SUCCESS) &&
        real_cuEventRecord(b->free_ev, s) == CUDA_SUCCESS) {
        /* free at its stream point: reusable on s at once, elsewhere once the event completes */
        b->free_live = 1;
        b->free_stream = s;
        b->freed_at = ++g_tick;
    } else {
        /* Wait for what may still use it: its own last uses, opaque ops, our copy. Never a
         * device or application-stream synchronisation (C16). */
        uses_sync(b->uses, MAX_USES);
        uses_sync(g_fences, MAX_FENCES);
        if (copying)
            real_cuEventSynchronize(b->copy_ev);
        b->free_live = 0;
    }
    host_free(b->host, b->size); /* later copies into the slot are ordered after its last one */
    b->host = NULL;
    forget_uses(b);
    if ((b->flags & SBF_GIVEN) && !given_freed(b))
        settle_out(b); /* no room to defer it: the host waits */
    if (b->flags & SBF_GIVEN) { /* its range still maps the other block's memory */
        if (b->ordered)
            pool_count(b->pool, -(int64_t)b->size, -(int64_t)b->vsize);
        goto out;
    }
    if (b->ordered) {
        pool_count(b->pool, -(int64_t)b->size, b->state == SB_OUT ? -(int64_t)b->vsize : 0);
        b->state = SB_RESIDENT;
        if (!cache_put(b)) {
            if (b->free_live)
                real_cuEventSynchronize(b->free_ev);
            b->free_live = 0;
            if (!release_block(b, &r))
                pool_count(b->pool, 0, -(int64_t)b->vsize); /* leaked: still mapped, out of every table */
        }
    } else if (!release_block(b, &r)) {
        table_add(b); /* still mapped: keep it, resident */
        b->state = SB_RESIDENT;
    }
out:
    ctx_leave(pushed);
    g_waits.free_ns += shim_now_ns() - t0;
    g_waits.frees++;
    slow_end(&slow, "free", plan_hint_position(), bytes);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
    *rc = r;
    return 1;
}

void free_finish(struct sblock *b)
{
    CUresult r;
    struct pool_acct *p = pool_find(b->pool);
    b->state = SB_RESIDENT;
    if (b->ordered && p && p->eligible && cache_put(b))
        return; /* its reservation, reused at its free's stream point (C20); not a destroyed pool's */
    if (b->free_live)
        real_cuEventSynchronize(b->free_ev);
    b->free_live = 0;
    release_block(b, &r);
}

/* ---- pool queries ---- */

/* The driver's own memory in the served pools beyond its live blocks (those under
 * --min-swap-bytes, counted at their live size in g_shim.device_bytes): PyTorch's cudaMallocAsync
 * backend keeps what it frees reserved, and the device holds it. Counted in resident_bytes. */
uint64_t g_pool_slack;
static uint64_t g_pool_slack_high, g_pool_trimmed;

static int pool_real(const struct pool_acct *p, cuuint64_t *reserved, cuuint64_t *used)
{
    return p->eligible && real_cuMemPoolGetAttribute &&
           real_cuMemPoolGetAttribute(p->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, reserved) == CUDA_SUCCESS &&
           real_cuMemPoolGetAttribute(p->pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, used) == CUDA_SUCCESS;
}

void pools_refresh(void)
{
    uint64_t slack = 0;
    for (int i = 0; i < g_npools; i++) {
        cuuint64_t r = 0, u = 0;
        if (pool_real(&g_pools[i], &r, &u) && r > u)
            slack += r - u;
    }
    g_pool_slack = slack;
    if (slack > g_pool_slack_high)
        g_pool_slack_high = slack;
}

uint64_t pools_trim(uint64_t want)
{
    uint64_t got = 0;
    for (int i = 0; i < g_npools && got < want; i++) {
        cuuint64_t r = 0, u = 0, after = 0;
        if (!pool_real(&g_pools[i], &r, &u) || r <= u || !real_cuMemPoolTrimTo)
            continue;
        uint64_t give = r - u < want - got ? r - u : want - got;
        /* releases only memory no allocation holds, without waiting (cuMemPoolTrimTo) */
        if (real_cuMemPoolTrimTo(g_pools[i].pool, (size_t)(r - give)) == CUDA_SUCCESS && pool_real(&g_pools[i], &after, &u) &&
            after < r)
            got += r - after;
    }
    pools_refresh();
    g_pool_trimmed += got;
    return got;
}

/* At exit: the most the driver's pools held beyond their live blocks, and what pools_trim gave back
 * (counters only: the driver may be gone by then). */
void swap_pools_note(void)
{
    pthread_mutex_lock(&g_mu);
    uint64_t high = g_pool_slack_high, trimmed = g_pool_trimmed;
    pthread_mutex_unlock(&g_mu);
    ring_note("swap.driver_pool=slack_high=%llu trimmed=%llu", (unsigned long long)high, (unsigned long long)trimmed);
}

void swap_pool_created(CUmemoryPool pool, const CUmemPoolProps *props)
{
    /* served by the shim: device memory no other process can import (XLA's own pool, a user's) */
    int ok = props && props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
             props->location.type == CU_MEM_LOCATION_TYPE_DEVICE && props->handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
             props->location.id >= 0 && props->location.id < MAX_DEVICES;
    pthread_mutex_lock(&g_mu);
    pool_add(pool, ok ? props->location.id : -1, ok);
    pthread_mutex_unlock(&g_mu);
}

void swap_pool_destroyed(CUmemoryPool pool)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    struct pool_acct *p = pool_find(pool);
    if (p) {
        p->eligible = 0;
        int pushed = ctx_enter();
        for (size_t i = g_ncache; i-- > 0;) {
            struct sblock *c = g_cache[i];
            if (c->pool != pool)
                continue;
            if (c->free_live)
                real_cuEventSynchronize(c->free_ev);
            c->free_live = 0;
            CUresult r;
            cache_drop(i);
            if (!release_block(c, &r))
                cache_put(c);
        }
        ctx_leave(pushed);
    }
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}

void swap_pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    pthread_mutex_lock(&g_mu);
    struct pool_acct *p = pool_find(pool);
    cuuint64_t *v = value;
    if (p && v) {
        /* the shim's blocks counted as the pool's; a high mark is the sum of both marks (an upper
         * bound: the two need not peak at once) */
        if (attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
            *v += p->used;
        else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
            *v += p->used_high;
        else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            *v += p->reserved;
        else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            *v += p->reserved_high;
    }
    pthread_mutex_unlock(&g_mu);
}

void swap_pool_reset_high(CUmemoryPool pool, CUmemPool_attribute attr)
{
    pthread_mutex_lock(&g_mu);
    struct pool_acct *p = pool_find(pool);
    if (p && attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        p->used_high = p->used;
    else if (p && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        p->reserved_high = p->reserved;
    pthread_mutex_unlock(&g_mu);
}

void swap_pool_trim(CUmemoryPool pool, size_t keep)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    struct pool_acct *p = pool_find(pool);
    uint64_t cached = 0;
    for (size_t i = 0; p && i < g_ncache; i++)
        if (g_cache[i]->pool == pool && g_cache[i]->handle)
            cached += g_cache[i]->vsize;
    if (p && p->reserved > keep && cached) {
        int pushed = ctx_enter();
        cache_trim(p->reserved - keep, pool);
        ctx_leave(pushed);
    }
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}
