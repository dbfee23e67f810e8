/*
 * Swap mode (DESIGN.md "Swapping"): VMM backing of cuMemAlloc_v2 and stream-ordered blocks, the
 * swap executor, the pinned host pool, plan following and the budget (files: swap_state.h). It runs only when PYOBMEM_CONTROL names a
 * control file with the right magic and ABI version (swap_open at init sets g_shim.swap); the
 * op hooks test that flag once and otherwise never reach this file.
 *
 * A swap block is one cuMemAlloc_v2, or one stream-ordered allocation on a pool the shim serves
 * (swap_alloc.c), of at least control.min_swap_bytes, served by cuMemAddressReserve +
 * cuMemCreate + cuMemMap + cuMemSetAccess (or from the cache of freed blocks); the application
 * gets the reserved address, which stays valid while the physical memory comes and goes:
 *
 *   RESIDENT     physical memory mapped, the contents are on the device
 *   OUT_PENDING  D2H copy issued on the device-to-host stream (after the block's last-use
 *                events); the physical memory stays mapped until the copy event has completed,
 *                seen by a cuEventQuery (release thread or a later op), then unmapped -> OUT
 *                (SWAP_OUT event)
 *   OUT          no physical memory; the contents are in a pinned host slot
 *   IN_PENDING   physical memory mapped again at the same address, access granted again to
 *                every device that had it, H2D copy issued on the host-to-device stream; the
 *                next op touching the block makes its stream wait on the copy event -> RESIDENT
 *                (SWAP_IN event; cause PREFETCH/LATE for a planned prefetch, DEMAND otherwise)
 *
 * Ordering rules:
 *   - every op touching a swap block re-records that block's last-use event on the op's stream
 *     (one event per block and stream); a swap-out makes its copy stream wait on all of them;
 *     an op that may touch blocks it does not name (opaque, or more blocks than tracked)
 *     records a process-wide fence every swap-out also waits on, and first brings every block
 *     back;
 *   - one copy stream per direction, each in issue order, and one for swap-ins that wait for a
 *     handoff's copy out; a host slot is written by a swap-out only after the last copy that
 *     reads it (the block's own swap-in, or for a slot new to the block the latest swap-in on
 *     each stream: g_h2d_ev, g_handoff_ev);
 *   - the application thread waits only in cuMemFree of a swap block (for that block's own
 *     last-use events, as the real cuMemFree would wait for the device), while a capture is
 *     active on the op's stream and when mapping more would put the device over the budget
 *     and no swap-out still copying has memory of the size to hand over (hold_budget: the
 *     copy events of the oldest swap-outs in flight, never an application stream). No
 *     cuCtxSynchronize, no work on the legacy stream. cuMemFreeAsync takes effect at its
 *     stream point (an event).
 *   - during a stream capture on the op's stream: no plan action, no event recorded on or
 *     waited by the capturing stream; touched blocks are made resident synchronously.
 *   - a planned prefetch maps and copies when the host issues its op, never waiting for the
 *     GPU: the host runs ahead of the GPU (up to half an iteration on GPT medium), and that lead
 *     is the prefetch's. MARK actions are ignored: waiting for the GPU to reach them (session 4)
 *     made the host keep step with the GPU through the backward pass (H200, GPT medium at 60%:
 *     842 ms a step with the waits, 736 without).
 *
 * Swap blocks live in the first context that allocates one (one set of copy streams);
 * allocations in other contexts are served by the real allocator. One mutex guards everything;
 * the driver calls made under it are real functions (never our hooks), made with this thread's
 * capture mode set to RELAXED so that they cannot invalidate another thread's capture.
 * Every driver return code is checked; a failure leaves the block resident (or, for a block
 * that is out, its host copy intact), never half-mapped.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "swap_state.h"

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
struct pyobmem_control *g_ctl;
CUcontext g_ctx;
CUstream g_d2h, g_h2d, g_h2d_handoff;
CUevent g_h2d_ev, g_handoff_ev;
struct itable g_tab = ITABLE_OF(struct span);
uint64_t g_tick;
struct swap_waits g_waits;

void swap_lock(void)
{
    if (pthread_mutex_trylock(&g_mu) == 0)
        return;
    uint64_t t0 = shim_now_ns();
    pthread_mutex_lock(&g_mu);
    g_waits.lock_ns += shim_now_ns() - t0;
    g_waits.lock_waits++;
}

static void note_waits(void)
{
    if (!g_shim.swap) /* a fork child: it traced, the counters are its parent's */
        return;
    pthread_mutex_lock(&g_mu);
    struct swap_waits w = g_waits;
    pthread_mutex_unlock(&g_mu);
    ring_note("swap.waits=ops=%llu/%lluus drains=%llu/%lluus maps=%llu/%lluus "
              "creates=%llu unmaps=%llu/%lluus releases=%llu evictions=%llu planned_outs=%llu handoffs=%llu "
              "free_waits=%llu/%lluus rounds=%llu round_pending=%lluMB",
              (unsigned long long)w.ops, (unsigned long long)(w.op_ns / 1000), (unsigned long long)w.drains,
              (unsigned long long)(w.drain_ns / 1000), (unsigned long long)w.maps, (unsigned long long)(w.map_ns / 1000),
              (unsigned long long)w.creates, (unsigned long long)w.unmaps, (unsigned long long)(w.unmap_ns / 1000),
              (unsigned long long)w.releases, (unsigned long long)w.evictions, (unsigned long long)w.planned_outs,
              (unsigned long long)w.handoffs, (unsigned long long)w.free_waits,
              (unsigned long long)(w.free_wait_ns / 1000), (unsigned long long)w.rounds,
              (unsigned long long)(w.round_pending >> 20));
    /* its own note: swap.waits is near the ring's 256-character note limit */
    ring_note("swap.app_syncs=%llu/%lluus hold=%s near_sync=%llu cache_handles=%llu demands=%llu/%lluus held=%lluus",
              (unsigned long long)__atomic_load_n(&g_waits.app_syncs, __ATOMIC_RELAXED),
              (unsigned long long)(__atomic_load_n(&g_waits.app_sync_ns, __ATOMIC_RELAXED) / 1000),
              swap_sync_hold() ? "on" : "off", (unsigned long long)w.out_near_sync, (unsigned long long)w.cache_handles,
              (unsigned long long)w.demands, (unsigned long long)(w.demand_ns / 1000),
              (unsigned long long)(w.demand_hold_ns / 1000));
    ring_note("swap.host=allocs=%llu/%lluus frees=%llu/%lluus create=%llu/%lluus access=%llu/%lluus "
              "release=%llu/%lluus lock_waits=%llu/%lluus releaser=%llu/%lluus",
              (unsigned long long)w.allocs, (unsigned long long)(w.alloc_ns / 1000), (unsigned long long)w.frees,
              (unsigned long long)(w.free_ns / 1000), (unsigned long long)w.creates,
              (unsigned long long)(w.create_ns / 1000), (unsigned long long)w.accesses,
              (unsigned long long)(w.access_ns / 1000), (unsigned long long)w.release_calls,
              (unsigned long long)(w.release_ns / 1000), (unsigned long long)w.lock_waits,
              (unsigned long long)(w.lock_ns / 1000), (unsigned long long)w.releaser_polls,
              (unsigned long long)(w.releaser_ns / 1000));
    ring_note("swap.releases=bytes=%lluMiB h2d_busy=%llu/%lluMiB", (unsigned long long)(w.release_bytes >> 20),
              (unsigned long long)w.busy_releases, (unsigned long long)(w.busy_release_bytes >> 20));
    swap_pools_note();
}
uint64_t g_mapped;
uint64_t g_swap_bytes;
uint64_t g_leaving;
unsigned g_out_pending;
struct use g_fences[MAX_FENCES];
int g_fences_lost;
size_t g_gran[MAX_DEVICES];
unsigned g_inflight_all;

/* ---- small helpers ---- */

CUevent ev_new(void)
{
    CUevent e = NULL;
    if (real_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return e;
}

int ctx_enter(void)
{
    CUcontext cur = NULL;
    if (!g_ctx || real_cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur == g_ctx)
        return 0;
    return real_cuCtxPushCurrent_v2(g_ctx) == CUDA_SUCCESS;
}

void ctx_leave(int pushed)
{
    CUcontext c;
    if (pushed)
        real_cuCtxPopCurrent_v2(&c);
}

/* This thread's capture mode -> RELAXED for the shim's own calls, restored after. */
int relax(CUstreamCaptureMode *old)
{
    *old = CU_STREAM_CAPTURE_MODE_RELAXED;
    return real_cuThreadExchangeStreamCaptureMode(old) == CUDA_SUCCESS;
}

void unrelax(int did, CUstreamCaptureMode old)
{
    if (did)
        real_cuThreadExchangeStreamCaptureMode(&old);
}

int capturing(CUstream s, int *unknown)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    *unknown = 0;
    if (real_cuStreamIsCapturing(s, &st) != CUDA_SUCCESS) {
        *unknown = 1; /* e.g. the legacy stream while another thread captures */
        return 0;
    }
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

int swappable(const struct sblock *b)
{
    return !(b->flags & (SBF_NEVER | SBF_OPAQUE | SBF_LOST)) && !b->inflight && !g_inflight_all;
}

void emit_swap(uint16_t type, uint16_t cause, const struct sblock *b, uint64_t dur)
{
    CUstream s = type == PYOBMEM_EV_SWAP_OUT ? g_d2h : b->in_stream;
    /* SWAP_OUT and SWAP_IN share their payload struct: .swap_out names both. */
    ring_write(&(struct pyobmem_record){.type = type, .flags = cause,
                                        .swap_out = {.block_id = b->id, .bytes = b->size, .duration_ns = dur,
                                                     .stream = (uint64_t)(uintptr_t)s}}, 1);
}

/* ---- the block table ---- */

struct sblock *block_at(uint64_t addr)
{
    struct span *s = itable_find(&g_tab, addr);
    return s ? s->b : NULL;
}

int table_add(struct sblock *b)
{
    struct span s = {b->addr, b->addr + b->vsize, b};
    if (!itable_insert(&g_tab, &s))
        return 0;
    g_swap_bytes += b->size;
    return 1;
}

void table_remove(struct sblock *b)
{
    size_t i = itable_upper(&g_tab, b->addr);
    if (i > 0 && block_of(i - 1) == b) {
        itable_erase(&g_tab, i - 1, i);
        g_swap_bytes -= b->size;
    }
    plan_unbind(b);
}

/* Device bytes the budget sees now: every live device block of the process at its size, swap
 * blocks at what they have mapped, less those on their way out, and what the driver's pools hold
 * beyond their live blocks. */
uint64_t resident_bytes(void)
{
    uint64_t all = __atomic_load_n(&g_shim.device_bytes, __ATOMIC_RELAXED);
    uint64_t others = all > g_swap_bytes ? all - g_swap_bytes : 0;
    return others + g_pool_slack + g_mapped + g_spare_bytes - g_leaving;
}

/* ---- last-use events and fences ---- */

/* Record on stream s in one of the slots: the slot of s, a free one, or one whose event has
 * completed. Returns 0 when no slot could be used. */
int uses_record(struct use *u, int n, CUstream s)
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

int uses_idle(struct use *u, int n)
{
    for (int i = 0; i < n; i++)
        if (u[i].live && real_cuEventQuery(u[i].ev) != CUDA_SUCCESS)
            return 0;
    return 1;
}

int uses_wait(struct use *u, int n, CUstream s)
{
    for (int i = 0; i < n; i++)
        if (u[i].live && real_cuStreamWaitEvent(s, u[i].ev, 0) != CUDA_SUCCESS)
            return 0;
    return 1;
}

void uses_sync(struct use *u, int n)
{
    for (int i = 0; i < n; i++)
        if (u[i].live)
            real_cuEventSynchronize(u[i].ev);
}

void forget_uses(struct sblock *b)
{
    for (int i = 0; i < MAX_USES; i++)
        b->uses[i].live = 0;
}

/* ---- entry points: access grants, pointer queries, IPC and NCCL blocks ---- */

int swap_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count, CUresult *rc)
{
    pthread_mutex_lock(&g_mu);
    struct sblock *b = block_at(ptr);
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
 * copy streams (no application stream to wait on). */
void bring_back(struct sblock *b)
{
    if (b->state == SB_RESIDENT)
        return;
    struct swap_op now = {.active = 1, .capturing = 1};
    uint64_t stamp = ++g_tick;
    int pushed = ctx_enter();
    settle_out(b); /* its memory another block's: out once its copy ends, then like any block out */
    if (b->state == SB_OUT)
        hold_budget(b->vsize, b->device, stamp); /* the budget holds for it too */
    make_usable(b, &now, stamp);
    ctx_leave(pushed);
}

void swap_never(CUdeviceptr p)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    struct sblock *b = block_at(p);
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
    struct sblock *b = block_at(p);
    if (b) {
        b->lru = ++g_tick;
        bring_back(b);
    }
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}

void swap_touch_many(const uint64_t *words, size_t n)
{
    CUstreamCaptureMode old;
    int relaxed = relax(&old);
    pthread_mutex_lock(&g_mu);
    uint64_t stamp = ++g_tick; /* one stamp: none of them is the least recently used of the others */
    for (size_t i = 0; i < n; i++) {
        struct sblock *b = block_at(words[i]);
        if (b) {
            b->lru = stamp;
            bring_back(b);
        }
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
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
        ring_note("swap.memlock_limit=%lld", rl.rlim_cur == RLIM_INFINITY ? -1ll : (long long)rl.rlim_cur);
    ring_note("swap=on budget=%llu min_swap_bytes=%llu", (unsigned long long)c->budget_bytes,
              (unsigned long long)c->min_swap_bytes);
    atexit(note_waits);
    return 1;
}

void swap_atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
void swap_atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
void swap_atfork_child(void)
{
    /* The child has no CUDA context of its own: it traces, it does not swap. */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_mu = fresh;
    g_shim.swap = 0;
    releaser_atfork_child();
}

