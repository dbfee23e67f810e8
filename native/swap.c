/*
 * Swap mode (DESIGN.md "Swapping"): VMM backing of cuMemAlloc_v2, the swap executor, the
 * pinned host pool, plan following and the budget. It runs only when PYOBMEM_CONTROL names a
 * control file with the right magic and ABI version (swap_open at init sets g_shim.swap); the
 * op hooks test that flag once and otherwise never reach this file.
 *
 * A swap block is one cuMemAlloc_v2 of at least control.min_swap_bytes served by
 * cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess; the application gets the
 * reserved address, which stays valid while the physical memory comes and goes:
 *
 *   RESIDENT     physical memory mapped, the contents are on the device
 *   OUT_PENDING  D2H copy issued on the shim stream (after the block's last-use events); the
 *                physical memory stays mapped until the copy event has completed, seen by a
 *                cuEventQuery at a later op, then unmap + release -> OUT (SWAP_OUT event)
 *   OUT          no physical memory; the contents are in a pinned host slot
 *   IN_PENDING   new physical memory mapped at the same address, access granted again to
 *                every device that had it, H2D copy issued on the shim stream; the next op
 *                touching the block makes its stream wait on the copy event -> RESIDENT
 *                (SWAP_IN event; cause PREFETCH/LATE for a planned prefetch, DEMAND otherwise)
 *
 * Ordering rules:
 *   - every op touching a swap block re-records that block's last-use event on the op's stream
 *     (one event per block and stream); a swap-out makes the shim stream wait on all of them;
 *     an op that may touch blocks it does not name (opaque, or more blocks than tracked)
 *     records a process-wide fence every swap-out also waits on, and first brings every block
 *     back;
 *   - all shim copies run on ONE non-blocking stream, in issue order, so a host slot freed
 *     after its copy was issued can be reused at once: the next copy into or out of it is
 *     ordered after;
 *   - the application thread waits only in cuMemFree of a swap block (for that block's own
 *     last-use events, as the real cuMemFree would wait for the device), while a capture is
 *     active on the op's stream and when mapping more would put the device over the budget
 *     (hold_budget; cuStreamSynchronize of the shim stream, never of an application stream),
 *     and for a prefetch's mark event (wait_mark, bounded). No cuCtxSynchronize, no work on
 *     the legacy stream.
 *   - during a stream capture on the op's stream: no plan action, no event recorded on or
 *     waited by the capturing stream; touched blocks are made resident synchronously.
 *   - a planned prefetch first waits (bounded, wait_mark) until the GPU has run the op where the
 *     plan put the block's MARK: the host runs far ahead of the GPU (half an iteration on GPT
 *     medium), and mapping at issue time would bring the memory back that much too early.
 *
 * Swap blocks live in the first context that allocates one (one shim stream); allocations in
 * other contexts are served by the real allocator. One mutex guards everything here; the
 * driver calls made under it are real functions (never our hooks), made with this thread's
 * capture mode set to RELAXED so that they cannot invalidate another thread's capture.
 * Every driver return code is checked; a failure leaves the block resident (or, for a block
 * that is out, its host copy intact), never half-mapped.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

enum { SB_RESIDENT, SB_OUT_PENDING, SB_OUT, SB_IN_PENDING };

#define SBF_NEVER 1u      /* IPC-exported: never swapped */
#define SBF_OPAQUE 2u     /* named by an opaque op: never swapped */
#define SBF_LOST 4u       /* its uses could not be tracked: never swapped */
#define SBF_PREFETCHED 8u /* IN_PENDING because of a planned prefetch */

#define MAX_USES 8        /* streams tracked per block between two swaps */
#define MAX_FENCES 32     /* streams with an opaque op in flight */
#define MAX_DEVICES 64
#define MAX_CHUNKS 64
#define POOL_CHUNK ((size_t)1 << 30)
#define HOST_ALIGN ((size_t)4096)

struct use {
    CUstream stream;
    CUevent ev;
    int live;
};

struct sblock {
    uint64_t addr, size, vsize; /* address given to the app, bytes asked, bytes reserved/mapped */
    uint32_t id;                /* block id of the trace (ALLOC record) */
    int device;
    unsigned flags;
    int state;
    CUmemGenericAllocationHandle handle; /* while mapped */
    uint64_t rw, ro;            /* devices with read-write / read-only access (bit = ordinal) */
    struct use uses[MAX_USES];
    CUevent copy_ev;            /* last copy of this block on the shim stream */
    CUevent mark_ev;            /* the plan's MARK for its next prefetch (valid while marked) */
    int marked;
    void *host;                 /* its host slot, kept from the first swap-out until it is freed */
    uint64_t t_issue;           /* ns when the last copy was issued */
    uint64_t lru;               /* op stamp of the last op touching it */
    uint64_t stamp;             /* op stamp: the op being prepared touches it (never evicted for it) */
    uint64_t tried;             /* eviction round that already tried it */
    unsigned inflight;          /* ops between swap_op_begin and swap_op_end naming it: never out */
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pyobmem_control *g_ctl;
static CUcontext g_ctx;   /* the context of the swap blocks */
static CUstream g_stream; /* the shim's non-blocking stream in it */
static struct sblock **g_tab; /* sorted by addr */
static size_t g_n, g_cap;
static uint64_t g_tick;
static uint64_t g_mapped;   /* vsize of blocks with physical memory */
static uint64_t g_swap_bytes; /* size of the blocks in g_tab */
static uint64_t g_leaving;  /* vsize of OUT_PENDING blocks */
static unsigned g_out_pending;
static struct use g_fences[MAX_FENCES];
static int g_fences_lost;   /* a fence could not be kept: no more swap-outs */
static size_t g_gran[MAX_DEVICES];
static uint64_t g_peers[MAX_DEVICES];
static int g_peers_known[MAX_DEVICES];
static int g_noted_nomem, g_noted_swapin;

/* ---- plan state ---- */
static struct {
    int following;
    uint64_t gen;
    uint32_t period;
    int64_t next; /* position expected next; -1: waiting for template_keys[0] */
    uint64_t *keys;
    struct pyobmem_action *acts;
    uint32_t n_acts;
    struct pyobmem_action *idle; /* IDLE hints, by address then position */
    uint32_t n_idle;
} g_plan;
static uint64_t g_adopted;

/* ---- the release thread ---- */
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_releaser;      /* 1: started; -1: off (PYOBMEM_RELEASER=0, or it could not start) */
static int g_releaser_stop; /* set at exit: the thread makes no driver call after it */

/* ---- small helpers ---- */

static CUevent ev_new(void)
{
    CUevent e = NULL;
    if (real_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return e;
}

static int ctx_enter(void)
{
    CUcontext cur = NULL;
    if (!g_ctx || real_cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur == g_ctx)
        return 0;
    return real_cuCtxPushCurrent_v2(g_ctx) == CUDA_SUCCESS;
}

static void ctx_leave(int pushed)
{
    CUcontext c;
    if (pushed)
        real_cuCtxPopCurrent_v2(&c);
}

/* This thread's capture mode -> RELAXED for the shim's own calls, restored after. */
static int relax(CUstreamCaptureMode *old)
{
    *old = CU_STREAM_CAPTURE_MODE_RELAXED;
    return real_cuThreadExchangeStreamCaptureMode(old) == CUDA_SUCCESS;
}

static void unrelax(int did, CUstreamCaptureMode old)
{
    if (did)
        real_cuThreadExchangeStreamCaptureMode(&old);
}

/* Ops between swap_op_begin and swap_op_end that may touch any block (opaque or overflowing):
 * while one is, nothing goes out (another thread's eviction could unmap what it is about to use). */
static unsigned g_inflight_all;

static int swappable(const struct sblock *b)
{
    return !(b->flags & (SBF_NEVER | SBF_OPAQUE | SBF_LOST)) && !b->inflight && !g_inflight_all;
}

static void emit_swap(uint16_t type, uint16_t cause, const struct sblock *b, uint64_t dur)
{
    /* SWAP_OUT and SWAP_IN share their payload struct: .swap_out names both. */
    ring_write(&(struct pyobmem_record){.type = type, .flags = cause,
                                        .swap_out = {.block_id = b->id, .bytes = b->size, .duration_ns = dur,
                                                     .stream = (uint64_t)(uintptr_t)g_stream}}, 1);
}

/* ---- the block table ---- */

static size_t upper(uint64_t addr)
{
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_tab[mid]->addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct sblock *find(uint64_t addr)
{
    size_t i = upper(addr);
    if (i == 0)
        return NULL;
    struct sblock *b = g_tab[i - 1];
    return addr < b->addr + b->vsize ? b : NULL;
}

static int insert(struct sblock *b)
{
    if (g_n == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 256;
        struct sblock **t = realloc(g_tab, cap * sizeof *t);
        if (!t)
            return 0;
        g_tab = t;
        g_cap = cap;
    }
    size_t i = upper(b->addr);
    memmove(&g_tab[i + 1], &g_tab[i], (g_n - i) * sizeof *g_tab);
    g_tab[i] = b;
    g_n++;
    g_swap_bytes += b->size;
    return 1;
}

static void erase(struct sblock *b)
{
    size_t i = upper(b->addr);
    if (i > 0 && g_tab[i - 1] == b) {
        memmove(&g_tab[i - 1], &g_tab[i], (g_n - i) * sizeof *g_tab);
        g_n--;
        g_swap_bytes -= b->size;
    }
}

/* Device bytes the budget sees now: every live device block of the process at its size, swap
 * blocks at what they have mapped, less those on their way out. */
static uint64_t resident_bytes(void)
{
    uint64_t all = __atomic_load_n(&g_shim.device_bytes, __ATOMIC_RELAXED);
    uint64_t others = all > g_swap_bytes ? all - g_swap_bytes : 0;
    return others + g_mapped - g_leaving;
}

/* ---- the pinned host pool: chunks of cuMemHostAlloc, first fit ---- */

struct ext {
    char *p;
    size_t len;
    int chunk;
};
static struct ext *g_free;
static size_t g_nfree, g_capfree;
static int g_nchunks;
static size_t g_pinned, g_pin_cap;
static int g_pool_dead;

static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    size_t kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static struct {
    char *p;
    size_t len;
} g_chunks[MAX_CHUNKS];

static int pool_chunk_of(const char *p)
{
    for (int c = 0; c < g_nchunks; c++)
        if (p >= g_chunks[c].p && p < g_chunks[c].p + g_chunks[c].len)
            return c;
    return -1;
}

static int free_insert(size_t at, struct ext e)
{
    if (g_nfree == g_capfree) {
        size_t cap = g_capfree ? g_capfree * 2 : 64;
        struct ext *n = realloc(g_free, cap * sizeof *n);
        if (!n)
            return 0;
        g_free = n;
        g_capfree = cap;
    }
    memmove(&g_free[at + 1], &g_free[at], (g_nfree - at) * sizeof *g_free);
    g_free[at] = e;
    g_nfree++;
    return 1;
}

static void pool_free(void *ptr, size_t n)
{
    if (!ptr)
        return;
    n = (n + HOST_ALIGN - 1) & ~(HOST_ALIGN - 1);
    char *p = ptr;
    size_t i = 0;
    while (i < g_nfree && g_free[i].p < p)
        i++;
    int chunk = pool_chunk_of(p);
    if (i > 0 && g_free[i - 1].chunk == chunk && g_free[i - 1].p + g_free[i - 1].len == p) {
        g_free[i - 1].len += n;
        if (i < g_nfree && g_free[i].chunk == chunk && g_free[i - 1].p + g_free[i - 1].len == g_free[i].p) {
            g_free[i - 1].len += g_free[i].len;
            memmove(&g_free[i], &g_free[i + 1], (g_nfree - i - 1) * sizeof *g_free);
            g_nfree--;
        }
        return;
    }
    if (i < g_nfree && g_free[i].chunk == chunk && p + n == g_free[i].p) {
        g_free[i].p = p;
        g_free[i].len += n;
        return;
    }
    free_insert(i, (struct ext){p, n, chunk}); /* on ENOMEM the slot is lost, never reused */
}

static int pool_grow(size_t need)
{
    if (g_pool_dead)
        return 0;
    if (!g_pin_cap) {
        size_t avail = mem_available();
        g_pin_cap = avail ? avail / 2 : (size_t)16 << 30;
    }
    size_t room = g_pin_cap > g_pinned ? g_pin_cap - g_pinned : 0;
    size_t c = need > POOL_CHUNK ? need : POOL_CHUNK;
    if (c > room)
        c = room & ~(HOST_ALIGN - 1);
    while (g_nchunks < MAX_CHUNKS && c >= need) {
        void *h = NULL;
        if (real_cuMemHostAlloc(&h, c, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS && h) {
            g_chunks[g_nchunks].p = h;
            g_chunks[g_nchunks].len = c;
            size_t i = 0;
            while (i < g_nfree && g_free[i].p < (char *)h)
                i++;
            if (!free_insert(i, (struct ext){h, c, g_nchunks})) {
                real_cuMemFreeHost(h);
                break;
            }
            g_nchunks++;
            g_pinned += c;
            ring_note("swap.pinned_bytes=%zu", g_pinned);
            return 1;
        }
        c = (c / 2) & ~(HOST_ALIGN - 1);
    }
    g_pool_dead = 1;
    ring_note("swap: pinned host memory exhausted (%zu bytes pinned, a %zu-byte block stays resident)", g_pinned,
              need);
    return 0;
}

static void *pool_alloc(size_t n)
{
    n = (n + HOST_ALIGN - 1) & ~(HOST_ALIGN - 1);
    for (int tries = 0; tries < 2; tries++) {
        for (size_t i = 0; i < g_nfree; i++) {
            if (g_free[i].len < n)
                continue;
            char *p = g_free[i].p;
            g_free[i].p += n;
            g_free[i].len -= n;
            if (g_free[i].len == 0) {
                memmove(&g_free[i], &g_free[i + 1], (g_nfree - i - 1) * sizeof *g_free);
                g_nfree--;
            }
            return p;
        }
        if (!pool_grow(n))
            return NULL;
    }
    return NULL;
}

/* ---- last-use events and fences ---- */

/* Record on stream s in one of the slots: the slot of s, a free one, or one whose event has
 * completed. Returns 0 when no slot could be used. */
static int slot_record(struct use *u, int n, CUstream s)
{
    struct use *slot = NULL;
    for (int i = 0; i < n && !slot; i++)
        if (u[i].live && u[i].stream == s)
            slot = &u[i];
    for (int i = 0; i < n && !slot; i++)
        if (!u[i].live)
            slot = &u[i];
    for (int i = 0; i < n && !slot; i++)
        if (real_cuEventQuery(u[i].ev) == CUDA_SUCCESS)
            slot = &u[i];
    if (!slot)
        return 0;
    if (!slot->ev && !(slot->ev = ev_new()))
        return 0;
    if (real_cuEventRecord(slot->ev, s) != CUDA_SUCCESS) {
        slot->live = 0;
        return 0;
    }
    slot->stream = s;
    slot->live = 1;
    return 1;
}

static int slots_idle(struct use *u, int n)
{
    for (int i = 0; i < n; i++)
        if (u[i].live && real_cuEventQuery(u[i].ev) != CUDA_SUCCESS)
            return 0;
    return 1;
}

static int slots_wait(struct use *u, int n, CUstream s)
{
    for (int i = 0; i < n; i++)
        if (u[i].live && real_cuStreamWaitEvent(s, u[i].ev, 0) != CUDA_SUCCESS)
            return 0;
    return 1;
}

static void slots_sync(struct use *u, int n)
{
    for (int i = 0; i < n; i++)
        if (u[i].live)
            real_cuEventSynchronize(u[i].ev);
}

/* ---- physical memory ---- */

static void peers_of(int device)
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

static CUresult grant(const struct sblock *b)
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
    return n ? real_cuMemSetAccess(b->addr, b->vsize, d, n) : CUDA_ERROR_INVALID_VALUE;
}

/* Create, map and grant access: all or nothing. */
static CUresult map_new(struct sblock *b)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = b->device;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = real_cuMemCreate(&h, b->vsize, &prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = real_cuMemMap(b->addr, b->vsize, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        real_cuMemRelease(h);
        return r;
    }
    r = grant(b);
    if (r != CUDA_SUCCESS) {
        real_cuMemUnmap(b->addr, b->vsize);
        real_cuMemRelease(h);
        return r;
    }
    b->handle = h;
    g_mapped += b->vsize;
    return CUDA_SUCCESS;
}

/* Unmap exactly what was mapped, then release the handle. */
static CUresult unmap_phys(struct sblock *b)
{
    CUresult r = real_cuMemUnmap(b->addr, b->vsize);
    if (r != CUDA_SUCCESS)
        return r;
    g_mapped -= b->vsize;
    if (real_cuMemRelease(b->handle) != CUDA_SUCCESS && !g_noted_nomem) {
        g_noted_nomem = 1;
        ring_note("swap: cuMemRelease failed; device memory leaked");
    }
    b->handle = 0;
    return CUDA_SUCCESS;
}

/* ---- the executor ---- */

static void forget_uses(struct sblock *b)
{
    for (int i = 0; i < MAX_USES; i++)
        b->uses[i].live = 0;
}

/* OUT_PENDING -> RESIDENT: the copy goes on, its result is dropped; the block keeps its slot
 * (later copies into it are ordered after this one on the shim stream). */
static void cancel_out(struct sblock *b)
{
    b->state = SB_RESIDENT;
    g_out_pending--;
    g_leaving -= b->vsize;
}

static void releaser_kick(void);

/* A block keeps its host slot from its first swap-out until it is freed: no pool churn, and the
 * pool never holds more than the blocks that were swapped (first-fit slots of mixed sizes,
 * recycled at every swap-in, fragmented it past the total of all allocations on the H200). When
 * the pool cannot grow, a resident block's slot (its copy is stale) is given up for this one. */
static void *host_slot(struct sblock *b)
{
    void *h = pool_alloc(b->size);
    for (size_t i = 0; !h && i < g_n; i++) {
        struct sblock *o = g_tab[i];
        if (o != b && o->host && o->state == SB_RESIDENT) {
            pool_free(o->host, o->size);
            o->host = NULL;
            h = pool_alloc(b->size);
        }
    }
    return h;
}

static int swap_out(struct sblock *b)
{
    if (b->state != SB_RESIDENT || !swappable(b) || g_fences_lost || !g_stream)
        return 0;
    void *h = b->host ? b->host : host_slot(b);
    if (!h)
        return 0;
    int ok = (b->copy_ev || (b->copy_ev = ev_new())) && slots_wait(b->uses, MAX_USES, g_stream) &&
             slots_wait(g_fences, MAX_FENCES, g_stream) &&
             real_cuMemcpyDtoHAsync_v2(h, b->addr, b->size, g_stream) == CUDA_SUCCESS &&
             real_cuEventRecord(b->copy_ev, g_stream) == CUDA_SUCCESS;
    if (!ok) {
        if (!b->host)
            pool_free(h, b->size); /* a copy already queued into it is ordered before any reuse */
        return 0;
    }
    b->host = h;
    b->state = SB_OUT_PENDING;
    b->t_issue = shim_now_ns();
    g_out_pending++;
    g_leaving += b->vsize;
    releaser_kick();
    return 1;
}

/* OUT_PENDING blocks whose copy has completed: release their physical memory. */
static void poll_releases(void)
{
    for (size_t i = 0; i < g_n && g_out_pending; i++) {
        struct sblock *b = g_tab[i];
        if (b->state != SB_OUT_PENDING)
            continue;
        CUresult q = real_cuEventQuery(b->copy_ev);
        if (q == CUDA_ERROR_NOT_READY)
            continue;
        if (q != CUDA_SUCCESS || unmap_phys(b) != CUDA_SUCCESS) {
            cancel_out(b); /* keep it resident; the host copy is dropped */
            continue;
        }
        b->state = SB_OUT;
        g_out_pending--;
        g_leaving -= b->vsize;
        forget_uses(b);
        emit_swap(PYOBMEM_EV_SWAP_OUT, 0, b, shim_now_ns() - b->t_issue);
    }
}

/* The release thread: while swap-outs are in flight it polls their copy events every 100 us and
 * releases the memory of those done. Without it a block is released at the first op the host
 * issues after its copy ends, and a host waiting in loss.item() at the end of an iteration
 * issues none: the memory of everything swapped out during the backward pass would stay mapped
 * until the next iteration. It never waits in the driver (cuEventQuery only), runs with the
 * RELAXED capture mode, and stops calling the driver at exit. */
static void *releaser(void *arg)
{
    (void)arg;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    real_cuThreadExchangeStreamCaptureMode(&mode);
    struct timespec nap = {0, 100000};
    pthread_mutex_lock(&g_mu);
    int pushed = ctx_enter();
    while (!g_releaser_stop) {
        if (!g_out_pending) {
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        poll_releases();
        pthread_mutex_unlock(&g_mu);
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&g_mu);
    }
    (void)pushed; /* the context stays current on this thread until the process ends */
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void releaser_exit(void)
{
    if (g_releaser <= 0) /* a fork child inherits the handler, not the thread */
        return;
    pthread_mutex_lock(&g_mu);
    g_releaser_stop = 1;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Start the thread at the first swap-out (g_mu held); wake it at every one. */
static void releaser_kick(void)
{
    if (!g_releaser) {
        const char *env = getenv(PYOBMEM_ENV_RELEASER);
        pthread_t t;
        pthread_attr_t attr;
        g_releaser = -1;
        if ((!env || strcmp(env, "0") != 0) && pthread_attr_init(&attr) == 0) {
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals never land on it */
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, releaser, NULL) == 0) {
                g_releaser = 1;
                atexit(releaser_exit);
            }
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            pthread_attr_destroy(&attr);
        }
    }
    if (g_releaser > 0)
        pthread_cond_signal(&g_cv);
}

/* Finish every swap-out in flight (synchronise the shim stream only) and release. */
static void drain_outs(void)
{
    if (g_out_pending && real_cuStreamSynchronize(g_stream) == CUDA_SUCCESS)
        poll_releases();
}

static uint32_t idle_for(const struct sblock *b, int64_t pos);

/* The block to evict: one that can be swapped out now, not touched by the op with stamp `stamp`,
 * not yet tried in eviction round `round`. Under a plan with IDLE hints, the one whose next
 * access is farthest; otherwise (or when no hint says a block is idle) the least recently used,
 * an idle one (all its uses done) if there is one, else any (its copy then waits on the shim
 * stream for its last uses). */

static struct sblock *lru_victim(uint64_t stamp, uint64_t round)
{
    struct sblock *v = NULL, *busy = NULL;
    if (g_plan.following && g_plan.n_idle && g_plan.next >= 0) {
        /* Belady's choice on the learned iteration: the block idle the longest from here */
        uint32_t best = 0;
        for (size_t i = 0; i < g_n; i++) {
            struct sblock *b = g_tab[i];
            if (b->state != SB_RESIDENT || !swappable(b) || b->stamp == stamp || b->tried == round)
                continue;
            uint32_t d = idle_for(b, g_plan.next);
            if (d > best) {
                best = d;
                v = b;
            }
        }
        if (v) {
            v->tried = round;
            return v;
        }
    }
    for (size_t i = 0; i < g_n; i++) {
        struct sblock *b = g_tab[i];
        if (b->state != SB_RESIDENT || !swappable(b) || b->stamp == stamp || b->tried == round)
            continue;
        if (v && b->lru >= v->lru)
            continue;
        if (slots_idle(b->uses, MAX_USES))
            v = b;
        else if (!busy || b->lru < busy->lru)
            busy = b;
    }
    if (!v)
        v = busy;
    if (v)
        v->tried = round;
    return v;
}

/* Free at least `need` bytes of device memory now: finish swap-outs in flight, then evict idle
 * blocks and wait for their copies (on the shim stream). */
static void make_room(uint64_t need, uint64_t stamp)
{
    uint64_t before = g_mapped, round = ++g_tick;
    drain_outs();
    while (before - g_mapped + g_leaving < need) {
        struct sblock *v = lru_victim(stamp, round);
        if (!v)
            break;
        swap_out(v);
    }
    drain_outs();
}

/* OUT -> IN_PENDING. */
static CUresult swap_in(struct sblock *b, int planned, uint64_t stamp)
{
    CUresult r = map_new(b);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        make_room(b->vsize, stamp);
        r = map_new(b);
    }
    if (r != CUDA_SUCCESS)
        return r;
    r = real_cuMemcpyHtoDAsync_v2(b->addr, b->host, b->size, g_stream);
    if (r == CUDA_SUCCESS) {
        r = real_cuEventRecord(b->copy_ev, g_stream);
        if (r != CUDA_SUCCESS)
            real_cuStreamSynchronize(g_stream); /* the copy is queued: let it finish before unmapping */
    }
    if (r != CUDA_SUCCESS) {
        unmap_phys(b);
        return r; /* still OUT, host copy intact */
    }
    b->state = SB_IN_PENDING;
    b->flags = planned ? (b->flags | SBF_PREFETCHED) : (b->flags & ~SBF_PREFETCHED);
    b->t_issue = shim_now_ns();
    forget_uses(b);
    return CUDA_SUCCESS;
}

/* IN_PENDING -> RESIDENT for an op on stream s (NULL `op`: no consumer, e.g. a swap-out). */
static CUresult finish_in(struct sblock *b, const struct swap_op *op, int demand)
{
    uint16_t cause = PYOBMEM_SWAP_IN_DEMAND;
    if (!demand && (b->flags & SBF_PREFETCHED))
        cause = real_cuEventQuery(b->copy_ev) == CUDA_SUCCESS ? PYOBMEM_SWAP_IN_PREFETCH : PYOBMEM_SWAP_IN_LATE;
    if (op && !op->capturing) {
        if (real_cuStreamWaitEvent(op->stream, b->copy_ev, 0) != CUDA_SUCCESS) {
            CUresult r = real_cuStreamSynchronize(g_stream);
            if (r != CUDA_SUCCESS)
                return r;
        }
    } else if (op) {
        CUresult r = real_cuStreamSynchronize(g_stream);
        if (r != CUDA_SUCCESS)
            return r;
    }
    b->state = SB_RESIDENT;
    b->flags &= ~SBF_PREFETCHED;
    emit_swap(PYOBMEM_EV_SWAP_IN, cause, b, shim_now_ns() - b->t_issue);
    return CUDA_SUCCESS;
}

static void hold_budget(uint64_t need, uint64_t stamp);

/* Make b usable by op. */
static CUresult consume(struct sblock *b, const struct swap_op *op, uint64_t stamp)
{
    int demand = 0;
    switch (b->state) {
    case SB_RESIDENT:
        return CUDA_SUCCESS;
    case SB_OUT_PENDING:
        cancel_out(b);
        return CUDA_SUCCESS;
    case SB_OUT: {
        if (!op || !op->capturing)
            hold_budget(b->vsize, stamp); /* a demand swap-in keeps the budget too */
        CUresult r = swap_in(b, 0, stamp);
        if (r != CUDA_SUCCESS) {
            if (!g_noted_swapin) {
                g_noted_swapin = 1;
                ring_note("swap: a block could not be brought back (CUresult %d); the op was refused", (int)r);
            }
            return r;
        }
        demand = 1;
    }
        /* fallthrough */
    case SB_IN_PENDING:
    default:
        return finish_in(b, op, demand);
    }
}

/* ---- plan following ---- */

static int cmp_at(const void *a, const void *b)
{
    const struct pyobmem_action *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

static int cmp_addr_at(const void *a, const void *b)
{
    const struct pyobmem_action *x = a, *y = b;
    if (x->addr != y->addr)
        return x->addr < y->addr ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Ops until b's next access from position pos by the plan's IDLE hints (cyclic), or 0 when no
 * hint says it is idle at pos (in use now, or unknown). */
static uint32_t idle_for(const struct sblock *b, int64_t pos)
{
    size_t lo = 0, hi = g_plan.n_idle;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_plan.idle[mid].addr < b->addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t P = g_plan.period, p = (uint32_t)(pos % P);
    for (size_t i = lo; i < g_plan.n_idle && g_plan.idle[i].addr == b->addr; i++) {
        uint32_t s = g_plan.idle[i].at, n = g_plan.idle[i].until;
        int inside = s < n ? (p > s && p < n) : (p > s || p < n); /* n <= s: wraps the iteration */
        if (inside)
            return (n + P - p) % P ? (n + P - p) % P : P;
    }
    return 0;
}

static void maybe_adopt(void)
{
    uint64_t a = __atomic_load_n(&g_ctl->active, __ATOMIC_ACQUIRE) & 1;
    struct pyobmem_plan *p = &g_ctl->plans[a];
    uint64_t gen = __atomic_load_n(&p->generation, __ATOMIC_ACQUIRE);
    if (gen == 0 || gen <= g_adopted || p->pid != g_shim.pid)
        return;
    uint32_t period = p->period, na = p->n_actions;
    if (period == 0 || period > PYOBMEM_PLAN_MAX_OPS || na > PYOBMEM_PLAN_MAX_ACTIONS) {
        g_adopted = gen; /* malformed: never looked at again */
        ring_note("swap: plan %llu rejected (period %u, %u actions)", (unsigned long long)gen, period, na);
        return;
    }
    uint64_t *keys = malloc(period * sizeof *keys);
    struct pyobmem_action *acts = malloc((na ? na : 1) * sizeof *acts);
    if (!keys || !acts) {
        free(keys);
        free(acts);
        return;
    }
    memcpy(keys, p->template_keys, period * sizeof *keys);
    memcpy(acts, p->actions, na * sizeof *acts);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != gen) { /* rewritten meanwhile */
        free(keys);
        free(acts);
        return;
    }
    uint32_t k = 0, ni = 0;
    struct pyobmem_action *idle = malloc((na ? na : 1) * sizeof *idle);
    if (!idle) {
        free(keys);
        free(acts);
        return;
    }
    for (uint32_t i = 0; i < na; i++) {
        if (acts[i].at >= period)
            continue;
        if (acts[i].kind == PYOBMEM_ACT_IDLE && acts[i].until < period)
            idle[ni++] = acts[i];
        else if (acts[i].kind == PYOBMEM_ACT_SWAP_OUT || acts[i].kind == PYOBMEM_ACT_PREFETCH ||
                 acts[i].kind == PYOBMEM_ACT_MARK)
            acts[k++] = acts[i];
    }
    qsort(acts, k, sizeof *acts, cmp_at);
    qsort(idle, ni, sizeof *idle, cmp_addr_at);
    free(g_plan.keys);
    free(g_plan.acts);
    free(g_plan.idle);
    g_plan.keys = keys;
    g_plan.acts = acts;
    g_plan.n_acts = k;
    g_plan.idle = idle;
    g_plan.n_idle = ni;
    g_plan.period = period;
    g_plan.gen = gen;
    g_plan.next = -1;
    g_plan.following = 1;
    g_adopted = gen;
    __atomic_store_n(&g_ctl->adopted, gen, __ATOMIC_RELEASE);
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_PLAN, .plan = {.generation = gen, .value = k}}, 1);
}

/* The position of the op with `key` in the followed plan, or -1. */
static int64_t plan_step(uint64_t key)
{
    if (!g_plan.following || g_plan.next <= 0)
        maybe_adopt(); /* only at an iteration boundary or when none is followed */
    if (!g_plan.following)
        return -1;
    int64_t pos;
    if (g_plan.next >= 0 && key == g_plan.keys[g_plan.next])
        pos = g_plan.next;
    else if (key == g_plan.keys[0])
        pos = 0; /* a new iteration: resync */
    else if (g_plan.next < 0)
        return -1; /* waiting for the iteration to start */
    else {
        ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_PLAN, .flags = 1,
                                            .plan = {.generation = g_plan.gen, .value = (uint64_t)g_plan.next}}, 1);
        __atomic_add_fetch(&g_ctl->plan_drops, 1, __ATOMIC_RELAXED);
        g_plan.following = 0;
        return -1;
    }
    g_plan.next = (pos + 1) % g_plan.period;
    return pos;
}

/* The host waits (bounded) until the GPU has run the op that recorded b's mark: a prefetch then
 * maps its memory when the GPU is where the plan put it, not when a host running ahead issues
 * the op. Only the mark's stream is waited for; past MARK_WAIT_NS (e.g. a stream held by a host
 * flag) the prefetch goes ahead, early. */
#define MARK_WAIT_NS 500000000ull
static void wait_mark(struct sblock *b)
{
    if (!b->marked)
        return;
    b->marked = 0;
    uint64_t t0 = shim_now_ns();
    struct timespec nap = {0, 20000};
    while (real_cuEventQuery(b->mark_ev) == CUDA_ERROR_NOT_READY && shim_now_ns() - t0 < MARK_WAIT_NS)
        nanosleep(&nap, NULL);
}

static void run_actions(int64_t pos, uint16_t kind, uint64_t stamp, CUstream s)
{
    size_t lo = 0, hi = g_plan.n_acts;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((int64_t)g_plan.acts[mid].at < pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo; i < g_plan.n_acts && (int64_t)g_plan.acts[i].at == pos; i++) {
        const struct pyobmem_action *a = &g_plan.acts[i];
        if (a->kind != kind)
            continue;
        struct sblock *b = find(a->addr);
        if (!b || b->addr != a->addr || b->size != a->size || !swappable(b))
            continue;
        if (kind == PYOBMEM_ACT_MARK) {
            if (b->mark_ev || (b->mark_ev = ev_new()))
                b->marked = real_cuEventRecord(b->mark_ev, s) == CUDA_SUCCESS;
        } else if (kind == PYOBMEM_ACT_PREFETCH) {
            if (b->state == SB_OUT) {
                wait_mark(b);
                hold_budget(b->vsize, stamp);
                swap_in(b, 1, stamp); /* a failure leaves it out: the consumer brings it back */
            }
            else if (b->state == SB_OUT_PENDING)
                cancel_out(b);
        } else {
            if (b->state == SB_IN_PENDING)
                finish_in(b, NULL, 0);
            swap_out(b);
        }
    }
}

/* ---- entry points ---- */

/* Keep mapped bytes (less those on their way out) plus `need` under the budget by swapping out
 * the least recently used blocks: before a plan exists this is the whole policy; under a plan,
 * the safety net for a plan whose swap-outs come later than predicted. */
static void evict_for_budget(uint64_t need, uint64_t stamp)
{
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    if (!budget || resident_bytes() + need <= budget)
        return;
    uint64_t round = ++g_tick;
    while (resident_bytes() + need > budget) {
        struct sblock *v = lru_victim(stamp, round);
        if (!v)
            break;
        swap_out(v);
    }
}

/* Before mapping `need` bytes: evict for the budget, and when the memory of the swap-outs still
 * in flight would put the device over it, wait for them (the shim stream only: they wait for
 * their blocks' last uses, never for unrelated work). Physical memory then stays under the
 * budget, not only the bytes the executor counts. */
static void hold_budget(uint64_t need, uint64_t stamp)
{
    evict_for_budget(need, stamp);
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    if (budget && g_out_pending && resident_bytes() + g_leaving + need > budget)
        drain_outs();
}

static int capturing(CUstream s, int *unknown)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    *unknown = 0;
    if (real_cuStreamIsCapturing(s, &st) != CUDA_SUCCESS) {
        *unknown = 1; /* e.g. the legacy stream while another thread captures */
        return 0;
    }
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The op has been issued (or refused): its blocks may go out again (g_mu held). */
static void inflight_done(const struct swap_op *op)
{
    for (uint32_t i = 0; i < op->n; i++) {
        struct sblock *b = find(op->addrs[i]);
        if (b && b->addr == op->addrs[i] && b->inflight)
            b->inflight--;
    }
    g_inflight_all -= op->all;
}

CUresult swap_op_begin(struct swap_op *op, uint64_t key, CUstream s, int how, const uint64_t *words, size_t n)
{
    int unknown;
    op->active = 1;
    op->key = key;
    op->stream = s;
    op->opaque = how != 0;
    op->overflow = 0;
    op->n = 0;
    op->pos = -1;
    op->capturing = capturing(s, &unknown);
    int paused = op->capturing || unknown;
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    uint64_t stamp = ++g_tick;
    int pushed = ctx_enter();
    if (!paused && g_out_pending)
        poll_releases();
    /* During a capture (or when unsure) the op's stream gets nothing of ours: consume() then
     * synchronises the shim stream instead of making the op's stream wait. */
    struct swap_op view = *op;
    view.capturing = paused;
    /* first every block of the op is stamped (so no eviction for it picks one of them), then
     * each is made usable */
    for (size_t i = 0; i < n; i++) {
        struct sblock *b = words[i] ? find(words[i]) : NULL;
        if (!b || b->stamp == stamp)
            continue;
        b->stamp = stamp;
        b->lru = stamp;
        if (how & SWAP_OP_OPAQUE)
            b->flags |= SBF_OPAQUE;
        if (op->n < SWAP_MAX_OP_BLOCKS)
            op->addrs[op->n++] = b->addr;
        else
            op->overflow = 1;
    }
    /* Until swap_op_end the op's blocks stay in: between here and the real call another thread
     * could otherwise evict one, and its copy would not wait for this op (not yet recorded). */
    for (uint32_t i = 0; i < op->n; i++)
        find(op->addrs[i])->inflight++;
    op->all = op->overflow || how;
    g_inflight_all += op->all;
    /* the plan: prefetches before the op (never evicting one of its blocks) */
    op->pos = plan_step(key);
    if (op->pos >= 0 && !paused)
        run_actions(op->pos, PYOBMEM_ACT_PREFETCH, stamp, s);
    CUresult fail = CUDA_SUCCESS;
    if (!op->overflow) {
        for (uint32_t i = 0; i < op->n && fail == CUDA_SUCCESS; i++)
            fail = consume(find(op->addrs[i]), &view, stamp);
    } else {
        for (size_t i = 0; i < g_n && fail == CUDA_SUCCESS; i++)
            if (g_tab[i]->stamp == stamp)
                fail = consume(g_tab[i], &view, stamp);
    }
    if (how) { /* it may touch anything: everything comes back first, nothing is evicted for it */
        for (size_t i = 0; i < g_n; i++)
            g_tab[i]->stamp = stamp;
        for (size_t i = 0; i < g_n && fail == CUDA_SUCCESS; i++)
            fail = consume(g_tab[i], &view, stamp);
    }
    if (fail == CUDA_SUCCESS && !paused)
        evict_for_budget(0, stamp); /* the budget holds between allocations too */
    if (fail != CUDA_SUCCESS) {
        inflight_done(op); /* the op is refused: swap_op_end will not run */
        op->active = 0;
    }
    ctx_leave(pushed);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
    return fail;
}

void swap_op_end(struct swap_op *op, CUresult r)
{
    if (!op->active)
        return;
    op->active = 0;
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    int pushed = ctx_enter();
    inflight_done(op);
    if (r == CUDA_SUCCESS && !op->capturing) {
        if ((op->opaque || op->overflow) && !slot_record(g_fences, MAX_FENCES, op->stream) && !g_fences_lost) {
            g_fences_lost = 1;
            ring_note("swap: too many streams with opaque work in flight; swap-outs stopped");
        }
        for (uint32_t i = 0; i < op->n; i++) {
            struct sblock *b = find(op->addrs[i]);
            if (b && b->addr == op->addrs[i] && !slot_record(b->uses, MAX_USES, op->stream))
                b->flags |= SBF_LOST;
        }
        if (op->pos >= 0) {
            run_actions(op->pos, PYOBMEM_ACT_MARK, g_tick, op->stream);
            run_actions(op->pos, PYOBMEM_ACT_SWAP_OUT, g_tick, op->stream);
        }
    }
    ctx_leave(pushed);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}

int swap_alloc(CUdeviceptr *dptr, size_t size)
{
    uint64_t min = __atomic_load_n(&g_ctl->min_swap_bytes, __ATOMIC_RELAXED);
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    if (!dptr || size == 0 || size < min || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx ||
        !real_cuCtxGetDevice || real_cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 || dev >= MAX_DEVICES)
        return 0;
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    int served = 0;
    struct sblock *b = NULL;
    if (g_ctx && g_ctx != ctx)
        goto out;
    if (!g_gran[dev]) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        size_t g = 0;
        if (real_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
            goto out;
        g_gran[dev] = g;
    }
    if (!g_stream) {
        CUstream s = NULL;
        if (real_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS || !s)
            goto out;
        g_stream = s;
        g_ctx = ctx;
    }
    size_t gran = g_gran[dev];
    if (size > SIZE_MAX - gran)
        goto out;
    uint64_t vsize = (size + gran - 1) / gran * gran;
    uint64_t stamp = ++g_tick;
    hold_budget(vsize, stamp);
    b = calloc(1, sizeof *b);
    CUdeviceptr va = 0;
    if (!b || real_cuMemAddressReserve(&va, vsize, gran, 0, 0) != CUDA_SUCCESS || !va)
        goto out;
    b->addr = va;
    b->size = size;
    b->vsize = vsize;
    b->device = (int)dev;
    b->lru = stamp;
    peers_of((int)dev);
    b->rw = (1ull << dev) | g_peers[dev];
    CUresult r = map_new(b);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && g_out_pending) {
        drain_outs();
        r = map_new(b);
    }
    if (r != CUDA_SUCCESS || !insert(b)) {
        if (r == CUDA_SUCCESS)
            unmap_phys(b);
        real_cuMemAddressFree(va, vsize);
        goto out;
    }
    *dptr = va;
    served = 1;
out:
    if (!served)
        free(b);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
    return served;
}

void swap_bind_id(uint64_t addr, uint32_t id)
{
    pthread_mutex_lock(&g_mu);
    struct sblock *b = find(addr);
    if (b && b->addr == addr)
        b->id = id;
    pthread_mutex_unlock(&g_mu);
}

int swap_free(CUdeviceptr dptr, CUresult *rc)
{
    pthread_mutex_lock(&g_mu);
    struct sblock *b = find(dptr);
    if (!b || b->addr != dptr) {
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    erase(b);
    if (b->state == SB_OUT_PENDING) {
        g_out_pending--;
        g_leaving -= b->vsize;
    }
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    int pushed = ctx_enter();
    /* Wait for what may still use it: its own last uses, opaque ops, our copy. Never a device
     * or application-stream synchronisation (C16). */
    slots_sync(b->uses, MAX_USES);
    slots_sync(g_fences, MAX_FENCES);
    /* a resident block may still have a copy queued: a cancelled swap-out reads its memory */
    if (b->copy_ev && b->state != SB_OUT)
        real_cuEventSynchronize(b->copy_ev);
    CUresult r = CUDA_SUCCESS;
    if (b->state != SB_OUT)
        r = unmap_phys(b);
    if (r == CUDA_SUCCESS) {
        pool_free(b->host, b->size);
        r = real_cuMemAddressFree(b->addr, b->vsize);
        for (int i = 0; i < MAX_USES; i++)
            if (b->uses[i].ev)
                real_cuEventDestroy_v2(b->uses[i].ev);
        if (b->copy_ev)
            real_cuEventDestroy_v2(b->copy_ev);
        if (b->mark_ev)
            real_cuEventDestroy_v2(b->mark_ev);
        free(b);
    } else {
        insert(b); /* still mapped: keep it, resident (with its slot) */
        b->state = SB_RESIDENT;
    }
    ctx_leave(pushed);
    unrelax(relaxed, old);
    pthread_mutex_unlock(&g_mu);
    *rc = r;
    return 1;
}

int swap_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count, CUresult *rc)
{
    pthread_mutex_lock(&g_mu);
    struct sblock *b = find(ptr);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        return 0;
    }
    CUresult r = CUDA_SUCCESS;
    if (b->state != SB_OUT)
        r = real_cuMemSetAccess(ptr, size, desc, count);
    else if (!desc)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) /* granted again at every remap (C17) */
        for (size_t i = 0; i < count; i++) {
            if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
                desc[i].location.id >= MAX_DEVICES)
                continue;
            uint64_t bit = 1ull << desc[i].location.id;
            b->rw &= ~bit;
            b->ro &= ~bit;
            if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
                b->rw |= bit;
            else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
                b->ro |= bit;
        }
    pthread_mutex_unlock(&g_mu);
    *rc = r;
    return 1;
}

/* Bring b back now if it is out or leaving (g_mu held): room first, then synchronously on the
 * shim stream (no application stream to wait on). */
static void bring_back(struct sblock *b)
{
    if (b->state == SB_RESIDENT)
        return;
    struct swap_op now = {.active = 1, .capturing = 1};
    uint64_t stamp = ++g_tick;
    int pushed = ctx_enter();
    if (b->state == SB_OUT)
        hold_budget(b->vsize, stamp); /* the budget holds for it too */
    consume(b, &now, stamp);
    ctx_leave(pushed);
}

void swap_never(CUdeviceptr p)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    struct sblock *b = find(p);
    if (b) {
        b->flags |= SBF_NEVER;
        bring_back(b);
    }
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}

void swap_touch(CUdeviceptr p)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    struct sblock *b = find(p);
    if (b) {
        b->lru = ++g_tick;
        bring_back(b);
    }
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}

int swap_open(const char *path)
{
    if (!path || !*path)
        return 0;
    /* every driver function the executor needs, or no swap mode at all */
    void *need[] = {
        (void *)real_cuCtxGetCurrent, (void *)real_cuCtxPushCurrent_v2, (void *)real_cuCtxPopCurrent_v2,
        (void *)real_cuCtxGetDevice, (void *)real_cuMemGetAllocationGranularity, (void *)real_cuMemHostAlloc,
        (void *)real_cuMemFreeHost, (void *)real_cuStreamCreate, (void *)real_cuStreamSynchronize,
        (void *)real_cuStreamWaitEvent, (void *)real_cuStreamIsCapturing, (void *)real_cuThreadExchangeStreamCaptureMode,
        (void *)real_cuEventCreate, (void *)real_cuEventRecord, (void *)real_cuEventQuery,
        (void *)real_cuEventSynchronize, (void *)real_cuEventDestroy_v2, (void *)real_cuMemAddressReserve,
        (void *)real_cuMemAddressFree, (void *)real_cuMemCreate, (void *)real_cuMemRelease, (void *)real_cuMemMap,
        (void *)real_cuMemUnmap, (void *)real_cuMemSetAccess, (void *)real_cuMemcpyDtoHAsync_v2,
        (void *)real_cuMemcpyHtoDAsync_v2,
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!need[i]) {
            ring_note("swap=off: the driver lacks a function the executor needs");
            return 0;
        }
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        ring_note("swap=off: control file cannot be opened");
        return 0;
    }
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= sizeof(struct pyobmem_control))
        m = mmap(NULL, sizeof(struct pyobmem_control), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        ring_note("swap=off: control file too small");
        return 0;
    }
    struct pyobmem_control *c = m;
    if (__atomic_load_n(&c->magic, __ATOMIC_ACQUIRE) != PYOBMEM_CONTROL_MAGIC || c->abi_version != PYOBMEM_ABI_VERSION) {
        munmap(m, sizeof *c);
        ring_note("swap=off: control file has a wrong magic or version");
        return 0;
    }
    g_ctl = c;
    g_adopted = 0;
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
        ring_note("swap.memlock_limit=%lld", rl.rlim_cur == RLIM_INFINITY ? -1ll : (long long)rl.rlim_cur);
    ring_note("swap=on budget=%llu min_swap_bytes=%llu", (unsigned long long)c->budget_bytes,
              (unsigned long long)c->min_swap_bytes);
    return 1;
}

void swap_atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
void swap_atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
void swap_atfork_child(void)
{
    /* The child has no CUDA context of its own: it traces, it does not swap. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    g_mu = fresh;
    g_cv = cv;
    g_shim.swap = 0;
    g_releaser = -1; /* no thread in the child, and none to start */
}
