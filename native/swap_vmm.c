/*
 * VMM mapping for swap mode (swap_state.h): a block's physical memory is whole handles (chunks of
 * at most CHUNK_MAX) mapped side by side at its reservation, its access granted again to every
 * device that had it (C17); unmapped exactly as mapped. Chunks come from a cached block of the
 * same size whose free was reached, else from the spare chunks, else (nothing spare taken) from a
 * swap-out still copying; cuMemCreate makes the rest. Spare chunks: the physical memory of
 * finished swap-outs and trimmed cached blocks, kept while the budget has room or the map the
 * budget is held for takes them.
 *
 * Why chunks: a cuMemRelease costs the host-to-device engine ~2 ms per GiB released, right after
 * it (session 20), and GPT medium at 50% of its peak released 29 GiB a step, 16 of them while a
 * swap-in copied, because the memory a swap-out gave back was rarely of the size the next map
 * needed. Chunks of one block fit any larger block, and moving a chunk (unmap, map elsewhere)
 * does not slow the copies (on the H200 the first 128 MiB copy after 1 GiB of 32 MiB chunks was
 * moved ran at 52.9 GB/s, 33.7 after they were released; one cuMemSetAccess and one cuMemUnmap
 * cover a range of several mappings: session 24, swap_logs/session24/chunk_probe.py).
 */
#include <string.h>

#include "swap_state.h"

#define MAX_SPARES 1024
#define CHUNK_MAX (64ull << 20) /* the largest chunk cuMemCreate makes (blocks over it get several) */
#define FILL_MAX 16             /* spare chunks one map takes at most: each mapping costs ~25 us of
                                 * cuMemSetAccess and ~16 us of cuMemUnmap (H200, session 24) */

uint64_t g_peers[MAX_DEVICES];
static int g_peers_known[MAX_DEVICES];
struct spare {
    CUmemGenericAllocationHandle h;
    uint64_t bytes;
    int device;
    int mark; /* taken by the fill being computed (fill_mark) */
};
static struct spare g_spares[MAX_SPARES]; /* largest first */
static size_t g_nspares;
uint64_t g_spare_bytes;
static int g_noted_nomem;
uint64_t g_want;
int g_want_dev = -1;

int pmem_has(const struct pmem *m, CUmemGenericAllocationHandle h)
{
    for (unsigned i = 0; i < m->n; i++)
        if (m->h[i] == h)
            return 1;
    return 0;
}

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

/* Mark the spare chunks a map of `need` bytes on device (-1: any) takes: the largest that fits
 * what is left, FILL_MAX at most (one pass: the spares are largest first, and one too large for
 * what was left stays too large). Returns their bytes. */
static uint64_t fill_mark(uint64_t need, int device)
{
    uint64_t left = need;
    int k = 0;
    for (size_t i = 0; i < g_nspares; i++) {
        struct spare *p = &g_spares[i];
        p->mark = left && k < FILL_MAX && p->bytes <= left && (device < 0 || p->device == device);
        if (p->mark) {
            left -= p->bytes;
            k++;
        }
    }
    return need - left;
}

uint64_t spares_cover(uint64_t need, int device) { return need && g_nspares ? fill_mark(need, device) : 0; }

/* A spare chunk in its place by size (the caller checked there is room). */
static void spare_put(CUmemGenericAllocationHandle h, uint64_t bytes, int device)
{
    size_t i = g_nspares;
    while (i > 0 && g_spares[i - 1].bytes < bytes)
        i--;
    memmove(&g_spares[i + 1], &g_spares[i], (g_nspares - i) * sizeof *g_spares);
    g_spares[i] = (struct spare){h, bytes, device, 0};
    g_nspares++;
    g_spare_bytes += bytes;
}

static void spare_drop(size_t i)
{
    g_spare_bytes -= g_spares[i].bytes;
    memmove(&g_spares[i], &g_spares[i + 1], (g_nspares - i - 1) * sizeof *g_spares);
    g_nspares--;
}

/* b's chunks from the spares (those fill_mark chose), in b->mem from offset *off on. */
static void spares_take(struct sblock *b, uint64_t *off)
{
    if (!fill_mark(b->vsize, b->device))
        return;
    for (size_t i = g_nspares; i-- > 0;)
        if (g_spares[i].mark) {
            settle_handle(g_spares[i].h); /* a swap-out that handed it over may map it still */
            b->mem.h[b->mem.n] = g_spares[i].h;
            b->mem.sz[b->mem.n++] = g_spares[i].bytes;
            *off += g_spares[i].bytes;
            spare_drop(i);
        }
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

/* Take a cached block's memory or spare chunks or a swap-out's (with `after`), create the rest;
 * map and grant access: all or nothing. */
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
        if (o->state != SB_OUT_PENDING || (o->flags & SBF_GIVEN) || o->inflight || !o->mem.n || o->vsize != vsize ||
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
    return device >= 0 && !spares_cover(vsize, device) && leaving_of(vsize, device) != NULL;
}

/* Map the memory of o, a swap-out still copying, at b: the chunks are b's from now on, and o's
 * range stays mapped to them until o's copy ends (poll_releases then unmaps it; o->mem names them
 * until then, for release_handle). Physical memory
 * does not grow, and no one waits on the host: b's first use waits for o's copy on the GPU
 * (*after). A host running ahead of the GPU keeps its lead where the budget would otherwise make
 * it wait for every swap-out in flight (measured on GPT medium: 851 such drains took 5.7 s of
 * an 18-step run at 60%). */
/* Map m's chunks side by side from b's address: all or none (what was mapped is unmapped). */
static CUresult map_chunks(const struct sblock *b, const struct pmem *m)
{
    uint64_t off = 0;
    for (unsigned i = 0; i < m->n; i++) {
        CUresult r = real_cuMemMap(b->addr + off, m->sz[i], 0, m->h[i], 0);
        if (r != CUDA_SUCCESS) {
            if (off)
                real_cuMemUnmap(b->addr, off);
            return r;
        }
        off += m->sz[i];
    }
    return CUDA_SUCCESS;
}

static int take_leaving(struct sblock *b, CUevent *after)
{
    struct sblock *o = leaving_of(b->vsize, b->device);
    if (o)
        issue_now(o); /* b's first use waits for o's whole copy out: its event must be recorded */
    if (!o || o->state != SB_OUT_PENDING || map_chunks(b, &o->mem) != CUDA_SUCCESS)
        return 0;
    if (grant(b) != CUDA_SUCCESS) {
        real_cuMemUnmap(b->addr, b->vsize);
        return 0;
    }
    b->mem = o->mem;
    o->flags |= SBF_GIVEN;
    g_leaving -= o->vsize; /* its bytes are b's: mapped once, counted once */
    *after = o->copy_ev;
    g_waits.handoffs++;
    /* o's memory is gone from it now: that is its swap-out, as the budget and the capture see it */
    emit_swap(PYOBMEM_EV_SWAP_OUT, o->out_cause, o, shim_now_ns() - o->t_issue);
    return 1;
}

/* The size of the next chunk to create for `left` bytes at chunk slot n (gran: the device's
 * granularity, which left is a multiple of): the largest power-of-two number of granules up to
 * CHUNK_MAX, so that the memory fits other blocks when it is given back; the last slot takes
 * what is left. */
static uint64_t chunk_size(uint64_t left, unsigned n, uint64_t gran)
{
    if (n + 1 >= MAX_PCHUNKS || !gran)
        return left;
    uint64_t c = gran;
    while (c * 2 <= left && c * 2 <= CHUNK_MAX)
        c *= 2;
    return c;
}

static void release_chunks(struct pmem *m)
{
    for (unsigned i = 0; i < m->n; i++)
        release_handle(m->h[i], m->sz[i]); /* a cached block's may still be mapped by a swap-out that gave it */
    m->n = 0;
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
    b->mem.n = 0;
    uint64_t off = 0;
    /* hold_budget counted a cached block's for callers with `after` (device >= 0) only */
    if (after && cache_take_mem(b->vsize, b->device, &b->mem))
        off = b->vsize;
    else
        spares_take(b, &off);
    if (!off && after && take_leaving(b, after))
        return CUDA_SUCCESS; /* g_mapped: o's bytes are now b's */
    CUresult r = CUDA_SUCCESS;
    uint64_t gran = b->device >= 0 && b->device < MAX_DEVICES ? g_gran[b->device] : 0;
    while (off < b->vsize && r == CUDA_SUCCESS) {
        uint64_t c = chunk_size(b->vsize - off, b->mem.n, gran);
        CUmemGenericAllocationHandle h = 0;
        uint64_t t0 = shim_now_ns();
        r = real_cuMemCreate(&h, c, &prop, 0);
        g_waits.create_ns += shim_now_ns() - t0;
        g_waits.creates++;
        if (r == CUDA_SUCCESS) {
            b->mem.h[b->mem.n] = h;
            b->mem.sz[b->mem.n++] = c;
            off += c;
        }
    }
    if (r == CUDA_SUCCESS)
        r = map_chunks(b, &b->mem);
    if (r == CUDA_SUCCESS && (r = grant(b)) != CUDA_SUCCESS)
        real_cuMemUnmap(b->addr, b->vsize);
    if (r != CUDA_SUCCESS) {
        release_chunks(&b->mem);
        return r;
    }
    g_mapped += b->vsize;
    return CUDA_SUCCESS;
}

/* Whether a map of g_want bytes would take a spare chunk of `bytes` on device, were it one: the
 * chunk is kept for it instead of being released and created again. */
static int wanted(uint64_t bytes, int device)
{
    if (!g_want || bytes > g_want || (g_want_dev >= 0 && device != g_want_dev) || g_nspares == MAX_SPARES)
        return 0;
    uint64_t before = spares_cover(g_want, g_want_dev);
    if (before + bytes > g_want)
        return 0;
    spare_put(0, bytes, device); /* a stand-in, never taken: only counted */
    uint64_t with = spares_cover(g_want, g_want_dev);
    for (size_t i = 0; i < g_nspares; i++)
        if (!g_spares[i].h) {
            spare_drop(i);
            break;
        }
    return with == before + bytes;
}

/* Unmap exactly what was mapped (one call covers every chunk), then release each chunk, or keep it
 * as a spare (keep: KEEP_ROOM while the budget has room for it; KEEP_ROOM and KEEP_WANTED when
 * the map the budget is held for takes it): the next swap-in or block maps it without a
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
    for (unsigned i = 0; i < b->mem.n; i++) {
        uint64_t c = b->mem.sz[i];
        int room = keep == KEEP_ROOM && resident_bytes() + g_leaving + c <= budget;
        if (keep && budget && g_nspares < MAX_SPARES && (room || wanted(c, b->device))) {
            spare_put(b->mem.h[i], c, b->device);
        } else {
            release_handle(b->mem.h[i], c);
            g_waits.releases++;
        }
    }
    b->mem.n = 0;
    g_waits.unmap_ns += shim_now_ns() - t0;
    return CUDA_SUCCESS;
}

CUresult unmap_block(struct sblock *b) { return unmap_block_keep(b, KEEP_NONE); }

uint64_t spares_trim(uint64_t want, uint64_t keep)
{
    uint64_t got = 0;
    if (keep)
        fill_mark(keep, g_want_dev);
    for (size_t i = 0; got < want && i < g_nspares;) { /* the largest first: fewer calls */
        if (keep && g_spares[i].mark) {
            i++; /* what the map of `keep` bytes takes stays */
            continue;
        }
        release_handle(g_spares[i].h, g_spares[i].bytes);
        got += g_spares[i].bytes;
        spare_drop(i);
    }
    return got;
}
