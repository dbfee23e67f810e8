/*
 * VMM mapping for swap mode (swap_state.h): physical memory created (or taken from a spare
 * handle, a cached block whose free was reached, or a swap-out still copying), mapped at a
 * block's reservation and its access granted again to every device that had it (C17); unmapped exactly as mapped. Spare handles: the physical memory of finished swap-outs,
 * kept while the budget has room, so that swap-ins and new blocks of their size make no
 * cuMemCreate.
 */
#include <string.h>

#include "swap_state.h"

#define MAX_SPARES 256

uint64_t g_peers[MAX_DEVICES];
static int g_peers_known[MAX_DEVICES];
struct spare {
    CUmemGenericAllocationHandle h;
    uint64_t vsize;
    int device;
};
static struct spare g_spares[MAX_SPARES];
static size_t g_nspares;
uint64_t g_spare_bytes;
static int g_noted_nomem;

void peers_of(int device)
{
    if (device < 0 || device >= MAX_DEVICES || g_peers_known[device])
        return;
    g_peers_known[device] = 1;
    int n = 0;
    if (!real_cuDeviceGetCount || real_cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return;
    for (int p = 0; p < n && p < MAX_DEVICES; p++) {
        int can = 0;
        if (p != device && real_cuDeviceCanAccessPeer &&
            real_cuDeviceCanAccessPeer(&can, (CUdevice)p, (CUdevice)device) == CUDA_SUCCESS && can)
            g_peers[device] |= 1ull << p;
    }
}

CUresult grant(const struct sblock *b)
{
    CUmemAccessDesc d[2 * MAX_DEVICES];
    size_t n = 0;
    for (int i = 0; i < MAX_DEVICES; i++) {
        uint64_t bit = 1ull << i;
        if (!((b->rw | b->ro) & bit))
            continue;
        memset(&d[n], 0, sizeof d[n]);
        d[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        d[n].location.id = i;
        d[n].flags = (b->rw & bit) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
        n++;
    }
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuMemSetAccess(b->addr, b->vsize, d, n);
    g_waits.access_ns += shim_now_ns() - t0;
    g_waits.accesses++;
    return r;
}

/* A spare handle of exactly vsize bytes on device, or 0. */
static CUmemGenericAllocationHandle spare_take(uint64_t vsize, int device)
{
    for (size_t i = g_nspares; i-- > 0;)
        if (g_spares[i].vsize == vsize && g_spares[i].device == device) {
            CUmemGenericAllocationHandle h = g_spares[i].h;
            g_spares[i] = g_spares[--g_nspares];
            g_spare_bytes -= vsize;
            return h;
        }
    return 0;
}

/* The memory of h goes once it is mapped nowhere: a swap-out that handed it over (SBF_GIVEN) and
 * still maps it at its range is unmapped first (after its copy out: normally ended, the memory's
 * new owner ordered after it), or the device would keep the memory the budget counts as gone. */
static void release_handle(CUmemGenericAllocationHandle h, uint64_t bytes)
{
    settle_handle(h);
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuMemRelease(h);
    g_waits.release_ns += shim_now_ns() - t0;
    g_waits.release_calls++;
    if (r == CUDA_SUCCESS) {
        g_waits.release_bytes += bytes;
        if (real_cuEventQuery(g_h2d_ev) == CUDA_ERROR_NOT_READY || real_cuEventQuery(g_handoff_ev) == CUDA_ERROR_NOT_READY) {
            g_waits.busy_releases++;
            g_waits.busy_release_bytes += bytes;
        }
    }
    if (r != CUDA_SUCCESS && !g_noted_nomem) {
        g_noted_nomem = 1;
        ring_note("swap: cuMemRelease failed; device memory leaked");
    }
}

/* Take a spare, a cached block's memory or a swap-out's (with `after`), else create; map and
 * grant access: all or nothing. */
static CUresult map_block_timed(struct sblock *b, CUevent *after);

CUresult map_block(struct sblock *b, CUevent *after)
{
    uint64_t t0 = shim_now_ns();
    CUresult r = map_block_timed(b, after);
    g_waits.map_ns += shim_now_ns() - t0;
    g_waits.maps++;
    return r;
}

/* The swap-out whose memory a map of vsize bytes on device takes: still copying (or queued), its
 * memory its own, not one of an op being begun (inflight: that one is about to stay, cancel_out,
 * and taking its memory would make it wait on the host for its copy and come back by a swap-in),
 * not needed soon by the plan's IDLE hints (needed_soon: its memory given, it could come back
 * only after its whole copy out, the host waiting, settle_out); of those the oldest swap-out,
 * whose copy ends first (the new block's first use waits for it). On the H200 (session 11, GPT
 * medium at 60% of its peak) the first such swap-out in the table, taken until then, was often
 * the block of the very next op: 4-6 handoffs an iteration, the host waiting 3-47 ms at each, its
 * lead over the GPU gone for the rest of the forward pass (1.251x; 1.170x with this rule). */
static struct sblock *leaving_of(uint64_t vsize, int device)
{
    struct sblock *best = NULL;
    for (size_t i = 0; g_out_pending && i < g_tab.n; i++) {
        struct sblock *o = block_of(i);
        if (o->state != SB_OUT_PENDING || (o->flags & SBF_GIVEN) || o->inflight || !o->handle || o->vsize != vsize ||
            o->device != device || (best && o->out_order >= best->out_order))
            continue;
        if (needed_soon(o))
            continue;
        best = o;
    }
    return best;
}

int handoff_ready(uint64_t vsize, int device)
{
    return device >= 0 && !spare_bytes_of(vsize) && leaving_of(vsize, device) != NULL;
}

/* Map the memory of o, a swap-out still copying, at b: the handle is b's from now on, and o's
 * range stays mapped to it until o's copy ends (poll_releases then unmaps it; o->handle names it
 * until then, for release_handle). Physical memory
 * does not grow, and no one waits on the host: b's first use waits for o's copy on the GPU
 * (*after). A host running ahead of the GPU keeps its lead where the budget would otherwise make
 * it wait for every swap-out in flight (measured on GPT medium: 851 such drains took 5.7 s of
 * an 18-step run at 60%). */
static int take_leaving(struct sblock *b, CUevent *after)
{
    struct sblock *o = leaving_of(b->vsize, b->device);
    if (o)
        issue_now(o); /* b's first use waits for o's whole copy out: its event must be recorded */
    if (!o || o->state != SB_OUT_PENDING || real_cuMemMap(b->addr, b->vsize, 0, o->handle, 0) != CUDA_SUCCESS)
        return 0;
    if (grant(b) != CUDA_SUCCESS) {
        real_cuMemUnmap(b->addr, b->vsize);
        return 0;
    }
    b->handle = o->handle;
    o->flags |= SBF_GIVEN;
    g_leaving -= o->vsize; /* its bytes are b's: mapped once, counted once */
    *after = o->copy_ev;
    g_waits.handoffs++;
    /* o's memory is gone from it now: that is its swap-out, as the budget and the capture see it */
    emit_swap(PYOBMEM_EV_SWAP_OUT, o->out_cause, o, shim_now_ns() - o->t_issue);
    return 1;
}

static CUresult map_block_timed(struct sblock *b, CUevent *after)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = b->device;
    if (after)
        *after = NULL;
    CUmemGenericAllocationHandle h = spare_take(b->vsize, b->device);
    if (!h && after) /* hold_budget counted it for callers with `after` (device >= 0) only */
        h = cache_take_handle(b->vsize, b->device);
    if (!h && after && take_leaving(b, after))
        return CUDA_SUCCESS; /* g_mapped: o's bytes are now b's */
    CUresult r = CUDA_SUCCESS;
    if (!h) {
        uint64_t t0 = shim_now_ns();
        r = real_cuMemCreate(&h, b->vsize, &prop, 0);
        g_waits.create_ns += shim_now_ns() - t0;
        g_waits.creates++;
    }
    if (r != CUDA_SUCCESS)
        return r;
    r = real_cuMemMap(b->addr, b->vsize, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        release_handle(h, b->vsize); /* a cached block's may still be mapped by a swap-out that gave it */
        return r;
    }
    r = grant(b);
    if (r != CUDA_SUCCESS) {
        real_cuMemUnmap(b->addr, b->vsize);
        release_handle(h, b->vsize);
        return r;
    }
    b->handle = h;
    g_mapped += b->vsize;
    return CUDA_SUCCESS;
}

/* Unmap exactly what was mapped, then release the handle, or keep it as a spare (keep = 1) when
 * the budget has room for it: the next swap-in or block of its size maps it without a
 * cuMemCreate. */
CUresult unmap_block_keep(struct sblock *b, int keep)
{
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuMemUnmap(b->addr, b->vsize);
    g_waits.unmaps++;
    if (r != CUDA_SUCCESS) {
        g_waits.unmap_ns += shim_now_ns() - t0;
        return r;
    }
    g_mapped -= b->vsize;
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    if (keep && budget && g_nspares < MAX_SPARES && resident_bytes() + g_leaving + b->vsize <= budget) {
        g_spares[g_nspares++] = (struct spare){b->handle, b->vsize, b->device};
        g_spare_bytes += b->vsize;
    } else {
        release_handle(b->handle, b->vsize);
        g_waits.releases++;
    }
    b->handle = 0;
    g_waits.unmap_ns += shim_now_ns() - t0;
    return CUDA_SUCCESS;
}

CUresult unmap_block(struct sblock *b) { return unmap_block_keep(b, 0); }

uint64_t spares_trim(uint64_t want, uint64_t keep)
{
    uint64_t got = 0;
    for (size_t i = g_nspares; got < want && i-- > 0;) {
        if (keep && g_spares[i].vsize == keep) {
            keep = 0; /* the one spare of that size stays */
            continue;
        }
        release_handle(g_spares[i].h, g_spares[i].vsize);
        g_spare_bytes -= g_spares[i].vsize;
        got += g_spares[i].vsize;
        g_spares[i] = g_spares[--g_nspares];
    }
    return got;
}

uint64_t spare_bytes_of(uint64_t vsize)
{
    for (size_t i = 0; i < g_nspares; i++)
        if (g_spares[i].vsize == vsize)
            return vsize;
    return 0;
}
