/*
 * The swap executor's shared state (swap mode; private to native/swap*.c). Who does what:
 *
 *   swap.c          the control file, the executor's lock and small helpers, the table of swap
 *                   blocks (an interval table), last-use events and fences, the pointer-query,
 *                   IPC and access entry points, fork
 *   swap_alloc.c    the allocator: cuMemAlloc_v2 and stream-ordered blocks, the pools the shim
 *                   serves and their queries
 *   swap_cache.c    the size-class cache of freed stream-ordered blocks, trimmed for the budget
 *   swap_vmm.c      VMM mapping: reserve-free physical memory, access grants, spare handles
 *   swap_copy.c     the executor: swap-outs and swap-ins on the two copy streams, ops begun
 *                   and ended (swap_op_begin / swap_op_end)
 *   swap_release.c  the release thread: physical memory of finished swap-outs given back
 *   swap_evict.c    the eviction policy and the budget
 *   swap_plan.c     plan following: adoption, positions, planned actions, IDLE hints
 *   swap_host.c     the pinned host pool and host slots
 *   swap_slow.c     the slow-call log (PYOBMEM_SLOW_LOG): the executor's waits call by call
 *
 * Everything below is guarded by g_mu unless it says otherwise.
 */
#ifndef PYOBMEM_SWAP_STATE_H
#define PYOBMEM_SWAP_STATE_H

#include <pthread.h>

#include "intervals.h"
#include "shim.h"

enum { SB_RESIDENT, SB_OUT_PENDING, SB_OUT, SB_IN_PENDING };

#define SBF_NEVER 1u      /* IPC-exported: never swapped */
#define SBF_OPAQUE 2u     /* named by an opaque op: never swapped */
#define SBF_LOST 4u       /* its uses could not be tracked: never swapped */
#define SBF_PREFETCHED 8u /* IN_PENDING because of a planned prefetch */
#define SBF_GIVEN 16u     /* OUT_PENDING, its physical memory handed to another block (map_block):
                           * its range stays mapped to it (handle: that block's) until the copy
                           * out ends, then unmapped */

#define MAX_USES 8        /* streams tracked per block between two swaps */
#define MAX_FENCES 32     /* streams with an opaque op in flight */
#define MAX_DEVICES 64

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
    CUevent copy_ev;            /* last copy of this block (on g_d2h, g_h2d or g_h2d_handoff) */
    int copy_h2d;               /* that copy is a swap-in (it reads the host slot) */
    CUstream in_stream;         /* the stream of its latest swap-in (g_h2d or g_h2d_handoff) */
    int queued;                 /* OUT_PENDING, in the queue of swap-outs: not all issued yet (swap_copy.c) */
    int slot_new;               /* its host slot is new to it: the copy out waits for the latest swap-in */
    uint64_t out_off;           /* bytes of its swap-out issued so far */
    uint64_t out_seq;           /* issue order of its swap-out's latest piece: swap-outs complete in it */
    uint64_t out_order;         /* order of its swap-out among all (swap_out): the queue's order */
    uint16_t out_cause;         /* its swap-out's pyobmem_swap_out_cause (the SWAP_OUT record's flags) */
    void *host;                 /* its host slot, kept from the first swap-out until it is freed */
    uint64_t t_issue;           /* ns when the last copy (a swap-out: its first piece) was issued */
    uint64_t lru;               /* op stamp of the last op touching it */
    uint64_t named_op;          /* the slow-call log's count of ops when one last named it */
    uint64_t stamp;             /* op stamp: the op being prepared touches it (never evicted for it) */
    uint64_t tried;             /* eviction round that already tried it */
    unsigned inflight;          /* ops between swap_op_begin and swap_op_end naming it: never out */
    /* stream-ordered blocks (served for cuMemAllocAsync / cuMemAllocFromPoolAsync) */
    int ordered;                /* 1: a stream-ordered block, cached at its free (a cuMemAlloc block: 0) */
    CUmemoryPool pool;          /* the pool it was asked of (counted in that pool's queries) */
    CUevent free_ev;            /* cached: recorded at the free's stream point, pending while free_live */
    CUstream free_stream;
    int free_live;
    uint64_t freed_at;          /* cached: g_tick at its free (the oldest pending free is waited for first) */
    int32_t site;               /* 1 + index of the followed plan's site bound to it; 0: none */
};

/* Where the application's threads spend time in the executor (ns, counts; g_mu held), written
 * at exit as the NOTE swap.waits: what a slow swap run spent its host time on. */
struct swap_waits {
    uint64_t op_ns, ops;                      /* swap_op_begin + swap_op_end, whole */
    uint64_t drain_ns, drains;                /* waiting for every swap-out in flight (drain_outs) */
    uint64_t map_ns, maps, creates;           /* map_block; creates: a cuMemCreate, no spare */
    uint64_t unmap_ns, unmaps, releases;      /* unmap_block_keep; releases: a cuMemRelease */
    uint64_t evictions, planned_outs;         /* swap-outs for the budget, and the plan's */
    uint64_t handoffs;                        /* maps that took a swap-out's memory still copying */
    uint64_t cache_handles;                   /* maps that took a cached block's memory (its free reached) */
    uint64_t free_wait_ns, free_waits;        /* waiting for cached blocks' frees to reclaim their memory */
    uint64_t rounds, round_pending;           /* eviction rounds still over after the trims; cached bytes then pending (sum) */
    uint64_t app_sync_ns, app_syncs;          /* the application in cuCtxSynchronize / cuStreamSynchronize (atomic, no lock) */
    /* NOTE swap.host: the allocation path, the driver's VMM calls by kind, and the lock */
    uint64_t alloc_ns, allocs, free_ns, frees; /* swap_alloc / swap_free with the lock held, whole */
    uint64_t create_ns, access_ns, accesses;   /* cuMemCreate (count: creates), cuMemSetAccess (grant) */
    uint64_t release_ns, release_calls;        /* cuMemRelease of a handle (release_handle) */
    /* NOTE swap.releases: the bytes released, and those released while a swap-in was not yet
     * complete (copying, or queued behind a wait): on the H200 each GiB released costs the
     * host-to-device engine ~2 ms right after (session 20's probe), which slows swap-ins then */
    uint64_t release_bytes, busy_releases, busy_release_bytes;
    uint64_t lock_ns, lock_waits;              /* application threads waiting for g_mu in allocs, frees and ops (swap_lock) */
    uint64_t releaser_ns, releaser_polls;      /* the release thread's polls, the lock held */
    uint64_t out_near_sync;                    /* issue_outs calls with the window near a host sync (NOTE swap.app_syncs) */
    uint64_t demand_ns, demand_hold_ns, demands; /* demand swap-ins of an op's blocks (make_usable), whole and in hold_budget */
};
extern struct swap_waits g_waits;

/* ---- swap_slow.c: the slow-call log (PYOBMEM_SLOW_LOG) ---- */
struct slow_mark {
    uint64_t t0, t_locked;  /* the call's entry (0: the log is off), g_mu taken */
    uint64_t outside;       /* this thread's time since its last executor call ended */
    const char *outside_of; /* that call */
    struct swap_waits w;    /* at t_locked */
};
/* At a call's entry, before g_mu; slow_waits once g_mu is held; slow_end before it is let go:
 * writes the call's line (and the stretch's before it) when either passes the threshold. pos:
 * the plan position (-1: none); bytes: the allocation's or free's size. */
void slow_begin(struct slow_mark *m);
void slow_waits(struct slow_mark *m);
void slow_end(struct slow_mark *m, const char *call, int64_t pos, uint64_t bytes);
/* After the op's position is known: a line for each of its blocks that is not resident, with
 * its state and the ops since an op last named it (the stale parameter words of docs/swap.md),
 * whatever the threshold. */
void slow_named(const struct slow_mark *m, const struct swap_op *op);

/* ---- swap.c: state and helpers ---- */
extern pthread_mutex_t g_mu;
/* g_mu for an application thread (allocations, frees, ops): the time it waits for the lock is
 * counted (g_waits.lock_ns). */
void swap_lock(void);
extern struct pyobmem_control *g_ctl;
extern CUcontext g_ctx;   /* the context of the swap blocks */
/* The shim's copy streams in it (non-blocking): swap-outs on g_d2h, swap-ins and prefetches on
 * g_h2d, so both directions run at once; a swap-in that must wait for a swap-out's copy (it took
 * that swap-out's memory: a handoff) on g_h2d_handoff, so that the swap-ins behind it do not
 * wait for that copy too (both share the host-to-device engine). g_h2d_ev / g_handoff_ev:
 * recorded after every swap-in on each, so that a swap-out into a host slot another copy may
 * still read waits for it. */
extern CUstream g_d2h, g_h2d, g_h2d_handoff;
extern CUevent g_h2d_ev, g_handoff_ev;
/* The live swap blocks: struct span elements, by address. */
struct span {
    uint64_t start, end; /* [addr, addr + vsize) */
    struct sblock *b;
};
extern struct itable g_tab;
static inline struct sblock *block_of(size_t i) { return ((struct span *)itable_at(&g_tab, i))->b; }
extern uint64_t g_tick;          /* op stamps and eviction rounds */
extern uint64_t g_mapped;        /* vsize of blocks with physical memory mapped (cached ones too) */
extern uint64_t g_swap_bytes;    /* size of the blocks in g_tab */
extern uint64_t g_leaving;       /* vsize of OUT_PENDING blocks */
extern unsigned g_out_pending;
extern struct use g_fences[MAX_FENCES];
extern int g_fences_lost;        /* a fence could not be kept: no more swap-outs */
extern size_t g_gran[MAX_DEVICES];
/* Ops between swap_op_begin and swap_op_end that may touch any block (opaque or overflowing):
 * while one is, nothing goes out (another thread's eviction could unmap what it is about to use). */
extern unsigned g_inflight_all;

CUevent ev_new(void);
int ctx_enter(void);
void ctx_leave(int pushed);
/* This thread's capture mode -> RELAXED for the shim's own calls, restored after. */
int relax(CUstreamCaptureMode *old);
void unrelax(int did, CUstreamCaptureMode old);
/* Whether s is capturing; *unknown when the driver cannot say (e.g. the legacy stream while
 * another thread captures). */
int capturing(CUstream s, int *unknown);
int swappable(const struct sblock *b);
void emit_swap(uint16_t type, uint16_t cause, const struct sblock *b, uint64_t dur);
struct sblock *block_at(uint64_t addr);
int table_add(struct sblock *b);
void table_remove(struct sblock *b);
/* Device bytes the budget sees now (see swap.c). */
uint64_t resident_bytes(void);
/* Last-use events (one slot per stream) and fences. */
int uses_record(struct use *u, int n, CUstream s);
int uses_idle(struct use *u, int n);
int uses_wait(struct use *u, int n, CUstream s);
void uses_sync(struct use *u, int n);
void forget_uses(struct sblock *b);
/* Bring b back now if it is out or leaving, synchronously on the copy streams. */
void bring_back(struct sblock *b);

/* ---- swap_host.c ---- */
void *host_alloc(size_t n);
void host_free(void *ptr, size_t n);
/* b's host slot for a swap-out: a new one, or one taken from a resident block (its copy is stale). */
void *host_slot(struct sblock *b);

/* ---- swap_vmm.c ---- */
extern uint64_t g_peers[MAX_DEVICES];
extern uint64_t g_spare_bytes;   /* physical memory of the spare handles */
void peers_of(int device);
CUresult grant(const struct sblock *b);
/* Physical memory for b (a spare handle; else, with `after`, a cached block's of b's size whose
 * free was reached or a swap-out's of b's size still copying out; else cuMemCreate), mapped and
 * its access granted: all or nothing. *after:
 * NULL, or the event b's first use must wait for (the copy out of the memory's last owner). */
CUresult map_block(struct sblock *b, CUevent *after);
/* Whether map_block(after) would take a swap-out's memory for vsize bytes on device. */
int handoff_ready(uint64_t vsize, int device);
/* Unmap and release (keep: or keep the handle as a spare while the budget has room). */
CUresult unmap_block_keep(struct sblock *b, int keep);
CUresult unmap_block(struct sblock *b);
/* Release spare handles until `want` bytes are given back, keeping one of `keep` bytes (0: none);
 * returns the bytes released. */
uint64_t spares_trim(uint64_t want, uint64_t keep);
/* vsize when a spare handle of vsize bytes exists, else 0. */
uint64_t spare_bytes_of(uint64_t vsize);

/* ---- swap_copy.c ---- */
void cancel_out(struct sblock *b);
/* Queue b's swap-out (OUT_PENDING at once) and issue what the copy engine has room for; cause:
 * a pyobmem_swap_out_cause, recorded with it. */
int swap_out(struct sblock *b, uint16_t cause);
/* Whether queued swap-outs wait while the application syncs (PYOBMEM_SYNC_HOLD, default on). */
int swap_sync_hold(void);
/* Issue queued swap-outs while fewer than OUT_AHEAD bytes are in flight (128 MiB near the
 * application's host sync; all: every one). */
void issue_outs(int all);
/* Issue all of b's swap-out now, out of the queue's order (its memory is handed over). */
void issue_now(struct sblock *b);
CUresult swap_in(struct sblock *b, int planned, uint64_t stamp);
CUresult finish_in(struct sblock *b, const struct swap_op *op, int demand);
/* Make b usable by op (NULL op: synchronously, no consumer stream). */
CUresult make_usable(struct sblock *b, const struct swap_op *op, uint64_t stamp);

/* ---- swap_release.c ---- */
void poll_releases(void);
int releaser_running(void);
void releaser_kick(void);
void drain_outs(void);
/* Wait for the swap-outs in flight, oldest first, until `need` more bytes fit `budget`. */
void drain_until(uint64_t need, uint64_t budget);
/* A swap-out whose memory was handed over: wait for its copy, then it is OUT. */
void settle_out(struct sblock *b);
/* settle_out of every block whose range still maps h (memory it handed over). */
void settle_handle(CUmemGenericAllocationHandle h);
/* b, freed (out of the table) while SBF_GIVEN: free_finish(b) once its range is unmapped.
 * Returns 0 when it cannot be deferred. */
int given_freed(struct sblock *b);
void releaser_atfork_child(void);

/* ---- swap_evict.c ---- */
void evict_for_budget(uint64_t need, uint64_t stamp);
/* device: where `need` bytes are mapped next when the caller can take a swap-out's memory still
 * copying or a cached block's (map_block with `after`), -1 when it cannot. */
void hold_budget(uint64_t need, int device, uint64_t stamp);
void make_room(uint64_t need, uint64_t stamp);

/* ---- swap_plan.c ---- */
/* The position of the op with `key` in the followed plan, or -1. */
int64_t plan_step(uint64_t key);
void run_actions(int64_t pos, uint16_t kind, uint64_t stamp);
/* The position IDLE hints are read at (the next op's), or -1 when there are none to follow. */
int64_t plan_hint_position(void);
uint32_t idle_for(const struct sblock *b, int64_t pos);
int needed_soon(const struct sblock *b); /* by the IDLE hints, an op needs b within min(64 ops, P/4) */
/* A stream-ordered allocation of at least min_swap_bytes was asked for (b: the block served for
 * it, or NULL when the driver's pool serves it): counts it at the current site and binds b to
 * the plan's site there when the size matches. */
void plan_allocation(struct sblock *b, uint64_t size);
/* b leaves the live table: its site binding ends. */
void plan_unbind(struct sblock *b);
/* An application thread begins a host sync: its position in the followed plan is kept (no lock
 * needed). */
void plan_app_sync(void);
/* The next op is within min(48, P / 4) ops before the position of the latest host sync. */
int plan_near_app_sync(void);

/* ---- swap_cache.c ---- */
/* The block cache: free stream-ordered blocks sorted by vsize (the newest of a class last). */
extern struct sblock **g_cache;
extern size_t g_ncache;
/* Add b, the newest of its class (0: no memory for the table); remove index i. */
int cache_put(struct sblock *b);
void cache_drop(size_t i);
/* A cached block of vsize for pool on stream s (taken out of the cache): a mapped one first,
 * else one with only its reservation; NULL when none is ready (C20: another stream's free must
 * have completed). */
struct sblock *cache_take(uint64_t vsize, int dev, CUmemoryPool pool, CUstream s);
uint64_t cache_trim(uint64_t want, CUmemoryPool pool);
/* cache_trim of every pool, keeping one spare handle of `keep` bytes, or else one cached block
 * of that size whose free was reached (see hold_budget). */
uint64_t cache_trim_keeping(uint64_t want, uint64_t keep);
/* A cached block's physical memory for a map of vsize bytes on dev (cache_take_handle: unmapped
 * from the cached block, whose reservation stays cached; 0 for none): mapped, of exactly that
 * size, its free reached. cache_idle_bytes_of: vsize when there is one, else 0. */
CUmemGenericAllocationHandle cache_take_handle(uint64_t vsize, int dev);
uint64_t cache_idle_bytes_of(uint64_t vsize, int dev);
/* Cached bytes whose free the GPU has not reached yet (their memory cannot be given back now). */
uint64_t cache_pending_bytes(void);
/* cache_trim_keeping after waiting on the host for the oldest pending frees, as many as `want`
 * needs: memory the application freed is reclaimed before a live block goes out for it. */
uint64_t cache_trim_waiting(uint64_t want, uint64_t keep);

/* ---- swap_alloc.c ---- */
/* Count used / reserved bytes (signed) against the served pool `pool` (none: nothing). */
void pool_count(CUmemoryPool pool, int64_t used, int64_t reserved);
/* The rest of swap_free for a block it deferred (given_freed): cached, or given back. */
void free_finish(struct sblock *b);

/* NOTE swap.driver_pool=slack_high=B trimmed=B at exit (swap_alloc.c). */
void swap_pools_note(void);
/* The driver's reserved memory beyond its live blocks in the served pools (bytes), as last asked
 * (pools_refresh, before every map); pools_trim gives up to `want` of it back (cuMemPoolTrimTo)
 * and returns the bytes released. */
extern uint64_t g_pool_slack;
void pools_refresh(void);
uint64_t pools_trim(uint64_t want);

#endif
