/*
 * VMM mapping for swap mode (swap_state.h): a block's physical memory is pieces of one size
 * (PYOBMEM_PIECE_MIB, a multiple of the granularity; the last piece of a block may be smaller),
 * mapped in order at its reservation and its access granted again to every device that had it
 * (C17); unmapped exactly as mapped. Pieces come from spares (the pieces of unmapped blocks,
 * kept while the budget has room), from cached blocks whose free was reached (under a budget
 * with no room left), from a swap-out still copying (a handoff), else from cuMemCreate. Why
 * pieces: with one handle per block a swap-out's memory served only a block of its own size, so
 * GPT medium at 50% of its peak made ~700 cuMemCreate and cuMemRelease calls a step (session
 * 17), and a cuMemRelease slows the copies to the device issued after it (34 against 55 GB/s on
 * the H200).
 */
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

uint64_t g_peers[MAX_DEVICES];
static int g_peers_known[MAX_DEVICES];
uint64_t g_spare_bytes;
static int g_noted_nomem;

/* Spares: full pieces by device (a stack each: any one serves), and the others (a block's last
 * piece, or whole blocks with PYOBMEM_PIECE_MIB=0) by size. */
struct hstack {
    CUmemGenericAllocationHandle *h;
    size_t n, cap;
};
static struct hstack g_full[MAX_DEVICES];
struct spare {
    CUmemGenericAllocationHandle h;
    uint64_t size;
    int device;
};
static struct spare *g_odd;
static size_t g_nodd, g_capodd;

static int grow(void **a, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 1;
    size_t c = *cap ? 2 * *cap : 256;
    void *t = realloc(*a, c * elem);
    if (!t)
        return 0;
    *a = t;
    *cap = c;
    return 1;
}

uint64_t piece_bytes(int device)
{
    static uint64_t mib = UINT64_MAX;
    if (mib == UINT64_MAX) {
        const char *e = getenv(PYOBMEM_ENV_PIECE_MIB);
        char *end = NULL;
        unsigned long long v = e && *e ? strtoull(e, &end, 10) : PIECE_MIB_DEFAULT;
        mib = (end && *end) || v > (1u << 20) ? PIECE_MIB_DEFAULT : v;
    }
    uint64_t gran = device >= 0 && device < MAX_DEVICES && g_gran[device] ? g_gran[device] : 2u << 20;
    return (mib << 20) ? ((mib << 20) + gran - 1) / gran * gran : 0;
}

/* A block of vsize bytes: *full pieces of *piece bytes, then one of *tail bytes (0: none). */
static void layout(uint64_t vsize, int device, uint64_t *piece, uint64_t *full, uint64_t *tail)
{
    *piece = piece_bytes(device);
    *full = *piece ? vsize / *piece : 0;
    *tail = *piece ? vsize % *piece : vsize;
}

static int is_full(uint64_t size, int device)
{
    return device >= 0 && device < MAX_DEVICES && size == piece_bytes(device);
}

static int spare_put(CUmemGenericAllocationHandle h, uint64_t size, int device)
{
    if (is_full(size, device)) {
        struct hstack *s = &g_full[device];
        if (!grow((void **)&s->h, &s->cap, s->n, sizeof *s->h))
            return 0;
        s->h[s->n++] = h;
    } else {
        if (!grow((void **)&g_odd, &g_capodd, g_nodd, sizeof *g_odd))
            return 0;
        g_odd[g_nodd++] = (struct spare){h, size, device};
    }
    g_spare_bytes += size;
    return 1;
}

static ptrdiff_t odd_find(uint64_t size, int device)
{
    for (size_t i = g_nodd; i-- > 0;)
        if (g_odd[i].size == size && g_odd[i].device == device)
            return (ptrdiff_t)i;
    return -1;
}

/* A spare of exactly size bytes on device, or 0. */
static CUmemGenericAllocationHandle spare_take(uint64_t size, int device)
{
    CUmemGenericAllocationHandle h = 0;
    if (is_full(size, device)) {
        if (g_full[device].n)
            h = g_full[device].h[--g_full[device].n];
    } else {
        ptrdiff_t i = odd_find(size, device);
        if (i >= 0) {
            h = g_odd[i].h;
            g_odd[i] = g_odd[--g_nodd];
        }
    }
    if (h)
        g_spare_bytes -= size;
    return h;
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

/* One cuMemSetAccess over the block's whole range, every piece of it. */
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

static void release_handle(CUmemGenericAllocationHandle h)
{
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuMemRelease(h);
    g_waits.release_ns += shim_now_ns() - t0;
    g_waits.release_calls++;
    if (r != CUDA_SUCCESS && !g_noted_nomem) {
        g_noted_nomem = 1;
        ring_note("swap: cuMemRelease failed; device memory leaked");
    }
}

void phys_put(struct phys *p, int keep)
{
    if (!p)
        return;
    settle_mem(p); /* a swap-out that handed it over may map it still: its copy out ends first */
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    for (uint32_t i = 0; i < p->n; i++) {
        if (keep && budget && (keep == KEEP_ALWAYS || resident_bytes() + g_leaving + p->p[i].size <= budget) &&
            spare_put(p->p[i].h, p->p[i].size, p->device))
            continue;
        release_handle(p->p[i].h);
        g_waits.releases++;
    }
    free(p);
}

/* Map p's pieces in order from addr; all or nothing. */
static CUresult map_pieces(uint64_t addr, const struct phys *p)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < p->n; i++) {
        CUresult r = real_cuMemMap(addr + off, p->p[i].size, 0, p->p[i].h, 0);
        if (r != CUDA_SUCCESS) {
            if (off)
                real_cuMemUnmap(addr, off);
            return r;
        }
        off += p->p[i].size;
    }
    return CUDA_SUCCESS;
}

/* Bytes of a map of vsize on device the spares would cover (with `cached`: and the cached
 * blocks whose free was reached, cache_idle_pieces). */
static uint64_t covered(uint64_t vsize, int device, int cached)
{
    uint64_t piece, full, tail;
    layout(vsize, device, &piece, &full, &tail);
    uint64_t have = device >= 0 && device < MAX_DEVICES ? g_full[device].n : 0;
    int tail_ok = tail && odd_find(tail, device) >= 0;
    if (cached && (have < full || (tail && !tail_ok)))
        cache_idle_pieces(device, vsize, piece, tail, &have, &tail_ok);
    return (have < full ? have : full) * piece + (tail_ok ? tail : 0);
}

uint64_t counted_bytes(uint64_t vsize, int device, int takes)
{
    uint64_t s = covered(vsize, device, 0);
    if (!takes || s >= vsize)
        return s;
    /* cached memory only where the rest would pass the budget: a cached block keeps its memory
     * for the next allocation of its size while there is room (60% gained nothing from taking
     * it whenever idle, session 17) */
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    if (!budget || resident_bytes() + vsize - s <= budget)
        return s;
    return covered(vsize, device, 1);
}

/* Take spares, cached memory or a swap-out's (with `after`), else create; map and grant
 * access: all or nothing. */
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
        if (o->state != SB_OUT_PENDING || (o->flags & SBF_GIVEN) || o->inflight || !o->mem || o->vsize != vsize ||
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
    return device >= 0 && covered(vsize, device, 0) < vsize && leaving_of(vsize, device) != NULL;
}

/* Map the memory of o, a swap-out still copying, at b: the memory is b's from now on, and o's
 * range stays mapped to it until o's copy ends (poll_releases then unmaps it; o->mem names it
 * until then, for settle_mem). Physical memory
 * does not grow, and no one waits on the host: b's first use waits for o's copy on the GPU
 * (*after). A host running ahead of the GPU keeps its lead where the budget would otherwise make
 * it wait for every swap-out in flight (measured on GPT medium: 851 such drains took 5.7 s of
 * an 18-step run at 60%). */
static int take_leaving(struct sblock *b, CUevent *after)
{
    struct sblock *o = leaving_of(b->vsize, b->device);
    if (o)
        issue_now(o); /* b's first use waits for o's whole copy out: its event must be recorded */
    if (!o || o->state != SB_OUT_PENDING || map_pieces(b->addr, o->mem) != CUDA_SUCCESS)
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

static CUresult map_block_timed(struct sblock *b, CUevent *after)
{
    if (after)
        *after = NULL;
    /* hold_budget counted handoffs and cached memory for callers with `after` only; a handoff
     * before cached memory: a cached block keeps its memory for the next allocation of its size
     * (on the H200 taking cached memory of any size first cut GPT medium's handoffs at 60% from
     * 766 to 203 a run and its step went from 1.154x to 1.304x, session 18) */
    uint64_t spares = covered(b->vsize, b->device, 0);
    if (after && spares < b->vsize && take_leaving(b, after))
        return CUDA_SUCCESS; /* g_mapped: o's bytes are now b's */
    if (after && counted_bytes(b->vsize, b->device, 1) > spares)
        cache_give_idle(b->device, b->vsize);
    uint64_t piece, full, tail;
    layout(b->vsize, b->device, &piece, &full, &tail);
    uint32_t n = (uint32_t)(full + (tail != 0));
    struct phys *p = calloc(1, sizeof *p + n * sizeof p->p[0]);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    p->device = b->device;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = b->device;
    CUresult r = CUDA_SUCCESS;
    for (uint32_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
        uint64_t size = i < full ? piece : tail;
        CUmemGenericAllocationHandle h = spare_take(size, b->device);
        if (!h) {
            uint64_t t0 = shim_now_ns();
            r = real_cuMemCreate(&h, size, &prop, 0);
            g_waits.create_ns += shim_now_ns() - t0;
            g_waits.creates++;
        }
        if (r == CUDA_SUCCESS)
            p->p[p->n++] = (struct piece){h, size};
    }
    if (r == CUDA_SUCCESS)
        r = map_pieces(b->addr, p);
    if (r == CUDA_SUCCESS && (r = grant(b)) != CUDA_SUCCESS)
        real_cuMemUnmap(b->addr, b->vsize);
    if (r != CUDA_SUCCESS) {
        phys_put(p, 1); /* spares again while the budget has room */
        return r;
    }
    b->mem = p;
    g_mapped += b->vsize;
    return CUDA_SUCCESS;
}

/* Unmap exactly what was mapped (one call over the range), then release the pieces, or keep
 * them as spares (keep = 1) while the budget has room: the next swap-in or block maps them
 * without a cuMemCreate. */
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
    struct phys *p = b->mem;
    b->mem = NULL;
    phys_put(p, keep);
    g_waits.unmap_ns += shim_now_ns() - t0;
    return CUDA_SUCCESS;
}

CUresult unmap_block(struct sblock *b) { return unmap_block_keep(b, 0); }

uint64_t spares_trim(uint64_t want, uint64_t keep)
{
    uint64_t got = 0;
    while (got < want && g_nodd && g_spare_bytes - g_odd[g_nodd - 1].size >= keep) {
        struct spare s = g_odd[--g_nodd];
        release_handle(s.h);
        g_spare_bytes -= s.size;
        got += s.size;
    }
    for (int d = 0; d < MAX_DEVICES; d++) {
        uint64_t piece = piece_bytes(d);
        while (got < want && g_full[d].n && g_spare_bytes - piece >= keep) {
            release_handle(g_full[d].h[--g_full[d].n]);
            g_spare_bytes -= piece;
            got += piece;
        }
    }
    return got;
}
