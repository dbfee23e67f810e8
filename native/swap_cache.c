/*
 * The block cache of swap mode's allocator (swap_alloc.c; docs/swap.md "Stream-ordered blocks"):
 * free stream-ordered blocks by size class (reserved bytes), each with its reservation and usually
 * its physical memory still mapped, and how cached memory is given back for the budget: at once
 * when its free has completed (trim), or after waiting for the oldest pending free
 * (cache_trim_waiting) before a live block would go out.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "swap_state.h"

struct sblock **g_cache; /* sorted by vsize, the newest of a class last */
size_t g_ncache;
static size_t g_capcache;

static size_t cache_lower(uint64_t vsize)
{
    size_t lo = 0, hi = g_ncache;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_cache[mid]->vsize < vsize)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int cache_put(struct sblock *b)
{
    if (g_ncache == g_capcache) {
        size_t cap = g_capcache ? g_capcache * 2 : 256;
        struct sblock **t = realloc(g_cache, cap * sizeof *t);
        if (!t)
            return 0;
        g_cache = t;
        g_capcache = cap;
    }
    size_t i = cache_lower(b->vsize + 1); /* after its class: the newest last */
    memmove(&g_cache[i + 1], &g_cache[i], (g_ncache - i) * sizeof *g_cache);
    g_cache[i] = b;
    g_ncache++;
    return 1;
}

void cache_drop(size_t i)
{
    memmove(&g_cache[i], &g_cache[i + 1], (g_ncache - i - 1) * sizeof *g_cache);
    g_ncache--;
}

/* A cached block may be reused on stream s: in stream order on the stream that freed it, on any
 * other only once the free's event has completed (C20). */
static int cache_ready(struct sblock *c, CUstream s)
{
    if (!c->free_live || c->free_stream == s)
        return 1;
    if (real_cuEventQuery(c->free_ev) != CUDA_SUCCESS)
        return 0;
    c->free_live = 0;
    return 1;
}

struct sblock *cache_take(uint64_t vsize, int dev, CUmemoryPool pool, CUstream s)
{
    size_t unmapped = SIZE_MAX;
    for (size_t i = cache_lower(vsize); i < g_ncache && g_cache[i]->vsize == vsize; i++) {
        struct sblock *c = g_cache[i];
        if (c->device != dev || c->pool != pool || !cache_ready(c, s))
            continue;
        if (c->handle) {
            cache_drop(i);
            return c;
        }
        if (unmapped == SIZE_MAX)
            unmapped = i;
    }
    if (unmapped == SIZE_MAX)
        return NULL;
    struct sblock *c = g_cache[unmapped];
    cache_drop(unmapped);
    return c;
}

/* PYOBMEM_CACHE_HANDLES=0 turns cache_take_handle off (an A/B); read once. */
static int cache_handles_on(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv(PYOBMEM_ENV_CACHE_HANDLES);
        on = !(e && !strcmp(e, "0"));
    }
    return on;
}

/* The oldest mapped cached block of vsize on dev whose free has completed, or NULL; none without
 * a budget (nothing is swapped then, and the cache is for its own class's allocations) or with
 * the rule off. */
static struct sblock *idle_mapped(uint64_t vsize, int dev)
{
    if (dev < 0 || !__atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED) || !cache_handles_on())
        return NULL;
    for (size_t i = cache_lower(vsize); i < g_ncache && g_cache[i]->vsize == vsize; i++) {
        struct sblock *c = g_cache[i];
        if (!c->handle || c->device != dev || (c->free_live && real_cuEventQuery(c->free_ev) != CUDA_SUCCESS))
            continue;
        c->free_live = 0;
        return c;
    }
    return NULL;
}

uint64_t cache_idle_bytes_of(uint64_t vsize, int dev) { return idle_mapped(vsize, dev) ? vsize : 0; }

/* A swap-in (or a new stream-ordered block) takes cached memory the application freed instead of the cache
 * giving it back and cuMemCreate making more: on the H200 (session 17) a 128 MiB copy into the
 * device ran at 34 GB/s right after 1 GiB of other handles was released (55 otherwise, into
 * fresh memory or not), and GPT medium's swap-ins at 50% of its peak ran at 48 GB/s while its
 * swap-outs ran at 54.8. */
CUmemGenericAllocationHandle cache_take_handle(uint64_t vsize, int dev)
{
    struct sblock *c = idle_mapped(vsize, dev);
    if (!c)
        return 0;
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuMemUnmap(c->addr, c->vsize);
    g_waits.unmaps++;
    g_waits.unmap_ns += shim_now_ns() - t0;
    if (r != CUDA_SUCCESS)
        return 0;
    CUmemGenericAllocationHandle h = c->handle;
    /* a swap-out that gave c this memory may map it still (SBF_GIVEN): a free not ordered after
     * its copy (a cuMemFree of a block never used) must not let the copy in overwrite it */
    settle_handle(h);
    c->handle = 0;
    g_mapped -= vsize;
    pool_count(c->pool, 0, -(int64_t)vsize);
    g_waits.cache_handles++;
    return h;
}

/* Give back cached physical memory until `want` bytes are released or none is idle: spare handles
 * first, then cached blocks whose free has completed (their reservations stay cached). `pool`
 * non-NULL: only that pool's blocks; keep: the memory of that size the caller maps next stays,
 * one spare handle or else one such cached block. Returns the bytes released. */
static uint64_t trim(uint64_t want, CUmemoryPool pool, uint64_t keep)
{
    uint64_t got = pool ? 0 : spares_trim(want, keep);
    int kept = !keep || spare_bytes_of(keep);
    for (size_t i = g_ncache; got < want && i-- > 0;) {
        struct sblock *c = g_cache[i];
        if (!c->handle || (pool && c->pool != pool) || (c->free_live && real_cuEventQuery(c->free_ev) != CUDA_SUCCESS))
            continue;
        c->free_live = 0;
        if (!kept && c->vsize == keep) {
            kept = 1;
            continue;
        }
        if (unmap_block(c) == CUDA_SUCCESS) {
            pool_count(c->pool, 0, -(int64_t)c->vsize);
            got += c->vsize;
        }
    }
    return got;
}

uint64_t cache_trim(uint64_t want, CUmemoryPool pool) { return trim(want, pool, 0); }

uint64_t cache_trim_keeping(uint64_t want, uint64_t keep) { return trim(want, NULL, keep); }

uint64_t cache_pending_bytes(void)
{
    uint64_t n = 0;
    for (size_t i = 0; i < g_ncache; i++) {
        struct sblock *c = g_cache[i];
        if (!c->handle || !c->free_live)
            continue;
        CUresult q = real_cuEventQuery(c->free_ev);
        if (q == CUDA_ERROR_NOT_READY)
            n += c->vsize;
        else if (q == CUDA_SUCCESS)
            c->free_live = 0; /* completed: not queried again */
    }
    return n;
}

/* How long the budget waits for a pending free (PYOBMEM_FREE_WAIT, ms; 0: never): longer than
 * any host lead measured (GPT medium: ~300 ms). A free not reached by then is behind work that
 * may not end on its own (C16: a persistent kernel on the stream that freed it), and from then
 * on the budget evicts instead of waiting. */
#define FREE_WAIT_DEFAULT_MS 500
static int64_t g_free_wait_ns = -1; /* -1: not read yet; 0: the rule is off */

static uint64_t free_wait_limit(void)
{
    if (g_free_wait_ns < 0) {
        const char *e = getenv(PYOBMEM_ENV_FREE_WAIT);
        char *end = NULL;
        long ms = e && *e ? strtol(e, &end, 10) : FREE_WAIT_DEFAULT_MS;
        g_free_wait_ns = (end && *end) || ms < 0 ? FREE_WAIT_DEFAULT_MS * 1000000ll : ms * 1000000ll;
    }
    return (uint64_t)g_free_wait_ns;
}

/* Poll e (cuEventQuery, 20 us apart) until it completes, fails or `limit` ns pass; *waited: it
 * was pending at the first query. */
static CUresult free_reached(CUevent e, uint64_t limit, int *waited)
{
    uint64_t t0 = shim_now_ns();
    struct timespec nap = {0, 20000};
    for (*waited = 0;; *waited = 1) {
        CUresult q = real_cuEventQuery(e);
        if (q != CUDA_ERROR_NOT_READY || shim_now_ns() - t0 > limit)
            return q;
        nanosleep(&nap, NULL);
    }
}

/* The host runs ahead of the GPU: memory it freed at its time is still in use on the GPU until
 * the free's stream point (GPT medium's backward pass frees GiBs ahead of the GPU). Waiting for
 * the oldest such free costs the host its lead; swapping a live block out instead costs two
 * copies and, measured on the H200 at 75% (session 9), gradients evicted 100 ops before the
 * optimizer read them, each brought back on demand. */
uint64_t cache_trim_waiting(uint64_t want, uint64_t keep)
{
    uint64_t got = 0;
    while (got < want && free_wait_limit()) {
        struct sblock *oldest = NULL;
        for (size_t i = 0; i < g_ncache; i++) {
            struct sblock *c = g_cache[i];
            if (c->handle && c->free_live && (!oldest || c->freed_at < oldest->freed_at))
                oldest = c;
        }
        if (!oldest)
            break;
        uint64_t t0 = shim_now_ns(), limit = free_wait_limit();
        int waited;
        CUresult q = free_reached(oldest->free_ev, limit, &waited);
        g_waits.free_wait_ns += shim_now_ns() - t0;
        g_waits.free_waits += waited;
        if (q != CUDA_SUCCESS) {
            g_free_wait_ns = 0;
            if (q == CUDA_ERROR_NOT_READY)
                ring_note("swap: a freed block's stream did not reach its free within %llu ms (a persistent "
                          "kernel?); the budget evicts live blocks instead of waiting for frees from now on",
                          (unsigned long long)(limit / 1000000));
            else
                ring_note("swap: querying a freed block's event failed (CUresult %d); the budget no longer waits "
                          "for frees", (int)q);
            break;
        }
        oldest->free_live = 0;
        got += trim(want - got, NULL, keep);
    }
    return got;
}
