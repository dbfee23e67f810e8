/*
 * The swap executor (swap_state.h): swap-outs on the device-to-host stream after the block's
 * last uses, swap-ins and prefetches on the host-to-device stream, the op's stream made to wait
 * for them, and the ops themselves from swap_op_begin to swap_op_end.
 */
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

static int g_noted_swapin;

/*
 * Swap-outs are queued here and issued on g_d2h a few at a time (issue_outs): the copy engine runs
 * copies of every stream in submission order, so the application's own small copies wait behind
 * whatever the shim has issued. Measured on the H200 (session 10): a 4-byte loss.item() waited
 * 48 ms behind a 2.8 GB copy out on another stream, 42 ms behind the same in 4 MiB pieces; GPT
 * medium at 75% gives its optimizer's state to the copy engine right before that call. At most
 * OUT_AHEAD bytes (PYOBMEM_OUT_AHEAD_MIB; pieces of OUT_PIECE) are issued and not yet done, so
 * such a copy waits ~10 ms, while the engine does not run dry when the release thread (it
 * issues more every 100 us) cannot take the lock for a few ms. 128 MiB (~2.4 ms of copying)
 * left it dry in GPT medium's forward pass: 512 MiB ran 1.167x against 1.192x at 60%, 1.404x
 * against 1.486x at 50%, and 1.054x against 1.029x at 75%, where loss.item() waits behind it
 * (H200, session 14, 14 steps, median of the last 5).
 */
#define OUT_PIECE (64ull << 20)
#define OUT_AHEAD_DEFAULT_MIB 512
#define OUT_AHEAD_MAX_MIB (1l << 24) /* 16 TiB: beyond any device, and no overflow in bytes */

/* OUT_AHEAD in bytes: PYOBMEM_OUT_AHEAD_MIB, at least one piece and at most OUT_AHEAD_MAX_MIB; not
 * a number or negative: the default. Read once. */
static uint64_t out_ahead(void)
{
    static uint64_t ahead;
    uint64_t a = __atomic_load_n(&ahead, __ATOMIC_RELAXED);
    if (!a) {
        const char *e = getenv(PYOBMEM_ENV_OUT_AHEAD);
        char *end = NULL;
        long mib = OUT_AHEAD_DEFAULT_MIB, v = e && *e ? strtol(e, &end, 10) : -1;
        long piece = (long)(OUT_PIECE >> 20);
        if (end && !*end && v >= 0)
            mib = v < piece ? piece : v > OUT_AHEAD_MAX_MIB ? OUT_AHEAD_MAX_MIB : v;
        a = (uint64_t)mib << 20;
        __atomic_store_n(&ahead, a, __ATOMIC_RELAXED);
    }
    return a;
}

static struct sblock **g_outq; /* queued swap-outs, oldest first */
static size_t g_noutq, g_capoutq;
struct flight {
    CUevent ev; /* recorded on g_d2h after the piece */
    uint64_t bytes;
};
static struct flight *g_fly; /* issued pieces not yet seen done, oldest first */
static size_t g_nfly, g_capfly;
static uint64_t g_fly_bytes;
static CUevent *g_spare_ev; /* flight events seen done, reused */
static size_t g_nspare_ev, g_capspare_ev;
static uint64_t g_out_seq; /* pieces issued: sblock.out_seq */
static uint64_t g_out_order; /* swap-outs begun: sblock.out_order */
/* Application threads inside cuCtxSynchronize or cuStreamSynchronize of any stream (copy.c). Such a
 * call also waits for copies other threads issue while it waits: on the H200 (session 12, GPT
 * medium at 75%) loss.item() waited 40.7 ms a step while the release thread fed the optimizer
 * state's 2.4 GB of queued swap-outs to the engine. While one is in, the queue waits (unless
 * PYOBMEM_SYNC_HOLD=0): the engine idles once what is in flight is done. */
static int g_app_syncs;
static int g_hold = -1; /* PYOBMEM_SYNC_HOLD, read once */

int swap_sync_hold(void)
{
    int h = __atomic_load_n(&g_hold, __ATOMIC_RELAXED);
    if (h < 0) {
        const char *env = getenv(PYOBMEM_ENV_SYNC_HOLD);
        h = !(env && strcmp(env, "0") == 0);
        __atomic_store_n(&g_hold, h, __ATOMIC_RELAXED);
    }
    return h;
}

static int grow(void **a, size_t *cap, size_t n, size_t each)
{
    if (n < *cap)
        return 1;
    size_t c = *cap ? 2 * *cap : 64;
    void *t = realloc(*a, c * each);
    if (!t)
        return 0;
    *a = t;
    *cap = c;
    return 1;
}

static void dequeue(struct sblock *b)
{
    for (size_t i = 0; i < g_noutq; i++)
        if (g_outq[i] == b) {
            memmove(&g_outq[i], &g_outq[i + 1], (g_noutq - i - 1) * sizeof *g_outq);
            g_noutq--;
            break;
        }
    b->queued = 0;
}

/* OUT_PENDING -> RESIDENT: a copy already issued goes on, its result is dropped; the block keeps
 * its slot (a later swap-out of it is ordered after this copy on the same stream). */
void cancel_out(struct sblock *b)
{
    if (b->queued)
        dequeue(b);
    b->state = SB_RESIDENT;
    g_out_pending--;
    g_leaving -= b->vsize;
}

/* Forget the pieces the copy engine has done (their events complete in issue order). */
static void retire_flights(void)
{
    size_t k = 0;
    while (k < g_nfly && real_cuEventQuery(g_fly[k].ev) != CUDA_ERROR_NOT_READY) {
        g_fly_bytes -= g_fly[k].bytes;
        if (grow((void **)&g_spare_ev, &g_capspare_ev, g_nspare_ev, sizeof *g_spare_ev))
            g_spare_ev[g_nspare_ev++] = g_fly[k].ev;
        else
            real_cuEventDestroy_v2(g_fly[k].ev);
        k++;
    }
    memmove(g_fly, g_fly + k, (g_nfly - k) * sizeof *g_fly);
    g_nfly -= k;
}

/* Issue the next piece of b, the head of the queue: the waits first (its last uses, opaque ops'
 * fences, the last copy that reads its host slot), the block's copy event after every piece.
 * Returns 0 when the driver refused a call. */
static int issue_piece(struct sblock *b)
{
    if (b->out_off == 0) {
        /* The host slot is written only after the last copy that reads it: the block's own
         * swap-in for its kept slot, any swap-in for a slot new to it (swap-ins run in issue
         * order on each of g_h2d and g_h2d_handoff). */
        CUevent reader = b->slot_new ? g_h2d_ev : (b->copy_h2d ? b->copy_ev : NULL);
        if (!(b->copy_ev || (b->copy_ev = ev_new())) || !uses_wait(b->uses, MAX_USES, g_d2h) ||
            !uses_wait(g_fences, MAX_FENCES, g_d2h) || (reader && real_cuStreamWaitEvent(g_d2h, reader, 0) != CUDA_SUCCESS) ||
            (b->slot_new && real_cuStreamWaitEvent(g_d2h, g_handoff_ev, 0) != CUDA_SUCCESS))
            return 0;
        b->copy_h2d = 0;
        b->slot_new = 0;
        b->t_issue = shim_now_ns();
    }
    uint64_t n = b->size - b->out_off < OUT_PIECE ? b->size - b->out_off : OUT_PIECE;
    if (!grow((void **)&g_fly, &g_capfly, g_nfly, sizeof *g_fly))
        return 0;
    CUevent ev = g_nspare_ev ? g_spare_ev[--g_nspare_ev] : ev_new();
    if (!ev)
        return 0;
    if (real_cuMemcpyDtoHAsync_v2((char *)b->host + b->out_off, b->addr + b->out_off, n, g_d2h) != CUDA_SUCCESS ||
        real_cuEventRecord(b->copy_ev, g_d2h) != CUDA_SUCCESS || real_cuEventRecord(ev, g_d2h) != CUDA_SUCCESS) {
        real_cuEventDestroy_v2(ev);
        return 0;
    }
    g_fly[g_nfly++] = (struct flight){ev, n};
    g_fly_bytes += n;
    b->out_off += n;
    b->out_seq = ++g_out_seq;
    return 1;
}

uint64_t swap_app_sync_begin(void)
{
    plan_app_sync();
    if (swap_sync_hold())
        __atomic_add_fetch(&g_app_syncs, 1, __ATOMIC_ACQ_REL);
    return shim_now_ns();
}

void swap_app_sync_end(uint64_t t_begin)
{
    __atomic_add_fetch(&g_waits.app_sync_ns, shim_now_ns() - t_begin, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_waits.app_syncs, 1, __ATOMIC_RELAXED);
    if (swap_sync_hold())
        __atomic_sub_fetch(&g_app_syncs, 1, __ATOMIC_ACQ_REL);
}

/* The window near the application's host sync: the sync waits for what is in flight (OUT_AHEAD
 * at most) and 512 MiB cost loss.item() ~13 ms a step at 75% (538.0 against 525.0 ms with 128 MiB,
 * H200, session 14); elsewhere the larger window keeps the engine fed. */
#define NEAR_SYNC_AHEAD (128ull << 20)

void issue_outs(int all)
{
    if (g_nfly && (g_noutq || g_nfly > 256)) /* only what is queued needs the count now */
        retire_flights();
    if (!all && __atomic_load_n(&g_app_syncs, __ATOMIC_ACQUIRE))
        return; /* the sync waits for what is in flight (OUT_AHEAD at most), not the queue */
    all |= !releaser_running(); /* nothing would issue the rest while the application waits */
    uint64_t ahead = out_ahead();
    if (!all && ahead > NEAR_SYNC_AHEAD && g_noutq && plan_near_app_sync()) {
        ahead = NEAR_SYNC_AHEAD;
        g_waits.out_near_sync++;
    }
    while (g_noutq && (all || g_fly_bytes < ahead)) {
        struct sblock *b = g_outq[0];
        if (!issue_piece(b)) {
            cancel_out(b); /* it stays resident */
            continue;
        }
        if (b->out_off == b->size)
            dequeue(b);
    }
}

void issue_now(struct sblock *b)
{
    if (!b->queued)
        return;
    dequeue(b); /* out of the queue's order: its events are recorded after it, in issue order */
    while (b->out_off < b->size)
        if (!issue_piece(b)) {
            cancel_out(b);
            return;
        }
}

int swap_out(struct sblock *b, uint16_t cause)
{
    if (b->state != SB_RESIDENT || !swappable(b) || g_fences_lost || !g_d2h ||
        !grow((void **)&g_outq, &g_capoutq, g_noutq, sizeof *g_outq))
        return 0;
    int fresh = !b->host;
    void *h = b->host ? b->host : host_slot(b);
    if (!h)
        return 0;
    b->host = h;
    b->slot_new |= fresh;
    b->out_off = 0;
    b->out_order = ++g_out_order;
    b->out_cause = cause;
    b->queued = 1;
    g_outq[g_noutq++] = b;
    b->state = SB_OUT_PENDING;
    g_out_pending++;
    g_leaving += b->vsize;
    releaser_kick();
    issue_outs(0);
    return b->state == SB_OUT_PENDING;
}

/* OUT -> IN_PENDING. */
CUresult swap_in(struct sblock *b, int planned, uint64_t stamp)
{
    CUevent after = NULL;
    CUresult r = map_block(b, &after);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        make_room(b->vsize, stamp);
        r = map_block(b, &after);
    }
    if (r != CUDA_SUCCESS)
        return r;
    /* The memory's last owner still copying out (a handoff): the copy in comes after it, on its
     * own stream, or every swap-in queued behind it on g_h2d would wait for that copy out too
     * (on the H200, GPT medium at 50% of its peak: 1.361 against 1.393, session 20). */
    if (after && real_cuEventQuery(after) == CUDA_SUCCESS)
        after = NULL; /* that copy has ended: nothing to wait for, the swap-in keeps issue order on
                       * g_h2d (session 21, 60%: 1.172 / 1.190 against 1.252 / 1.206; 50%: 1.359
                       * against 1.404) */
    CUstream s = after ? g_h2d_handoff : g_h2d;
    CUevent last = after ? g_handoff_ev : g_h2d_ev;
    if (after)
        r = real_cuStreamWaitEvent(s, after, 0);
    if (r == CUDA_SUCCESS)
        r = real_cuMemcpyHtoDAsync_v2(b->addr, b->host, b->size, s);
    if (r == CUDA_SUCCESS) {
        r = real_cuEventRecord(b->copy_ev, s);
        if (r == CUDA_SUCCESS && real_cuEventRecord(last, s) != CUDA_SUCCESS)
            r = real_cuStreamSynchronize(s); /* no later slot writer could wait for it */
        if (r != CUDA_SUCCESS)
            real_cuStreamSynchronize(s); /* the copy is queued: let it finish before unmapping */
    }
    b->in_stream = s;
    if (r != CUDA_SUCCESS) {
        unmap_block(b);
        return r; /* still OUT, host copy intact */
    }
    b->copy_h2d = 1;
    b->state = SB_IN_PENDING;
    b->flags = planned ? (b->flags | SBF_PREFETCHED) : (b->flags & ~SBF_PREFETCHED);
    b->t_issue = shim_now_ns();
    forget_uses(b);
    return CUDA_SUCCESS;
}

/* IN_PENDING -> RESIDENT for an op on stream s (NULL `op`: no consumer, e.g. a swap-out). */
CUresult finish_in(struct sblock *b, const struct swap_op *op, int demand)
{
    uint16_t cause = PYOBMEM_SWAP_IN_DEMAND;
    if (!demand && (b->flags & SBF_PREFETCHED))
        cause = real_cuEventQuery(b->copy_ev) == CUDA_SUCCESS ? PYOBMEM_SWAP_IN_PREFETCH : PYOBMEM_SWAP_IN_LATE;
    if (op && !op->capturing) {
        if (real_cuStreamWaitEvent(op->stream, b->copy_ev, 0) != CUDA_SUCCESS) {
            CUresult r = real_cuStreamSynchronize(b->in_stream);
            if (r != CUDA_SUCCESS)
                return r;
        }
    } else if (op) {
        CUresult r = real_cuStreamSynchronize(b->in_stream);
        if (r != CUDA_SUCCESS)
            return r;
    }
    b->state = SB_RESIDENT;
    b->flags &= ~SBF_PREFETCHED;
    emit_swap(PYOBMEM_EV_SWAP_IN, cause, b, shim_now_ns() - b->t_issue);
    return CUDA_SUCCESS;
}

/* Make b usable by op. */
CUresult make_usable(struct sblock *b, const struct swap_op *op, uint64_t stamp)
{
    int demand = 0;
    uint64_t t0 = 0;
    switch (b->state) {
    case SB_RESIDENT:
        return CUDA_SUCCESS;
    case SB_OUT_PENDING:
        if (!(b->flags & SBF_GIVEN)) {
            cancel_out(b);
            return CUDA_SUCCESS;
        }
        t0 = shim_now_ns();
        settle_out(b); /* its memory is another block's: it comes back once its copy out ends */
        if (b->state != SB_OUT)
            return CUDA_ERROR_UNKNOWN;
        /* fallthrough */
    case SB_OUT: {
        uint64_t t_hold = shim_now_ns();
        t0 = t0 ? t0 : t_hold;
        if (!op || !op->capturing)
            hold_budget(b->vsize, b->device, stamp); /* a demand swap-in keeps the budget too */
        g_waits.demand_hold_ns += shim_now_ns() - t_hold;
        CUresult r = swap_in(b, 0, stamp);
        g_waits.demand_ns += shim_now_ns() - t0;
        g_waits.demands++;
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

/* The op has been issued (or refused): its blocks may go out again (g_mu held). */
static void inflight_done(const struct swap_op *op)
{
    for (uint32_t i = 0; i < op->n; i++) {
        struct sblock *b = block_at(op->addrs[i]);
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
    struct slow_mark slow;
    slow_begin(&slow);
    swap_lock();
    slow_waits(&slow);
    uint64_t t_begin = shim_now_ns(), stamp = ++g_tick;
    int pushed = ctx_enter();
    if (!paused && g_out_pending)
        poll_releases();
    /* During a capture (or when unsure) the op's stream gets nothing of ours: make_usable() then
     * synchronises the copy stream instead of making the op's stream wait. */
    int was_capturing = op->capturing;
    op->capturing = paused; /* as make_usable sees it, until the blocks are usable */
    /* first every block of the op is stamped (so no eviction for it picks one of them), then
     * each is made usable */
    for (size_t i = 0; i < n; i++) {
        struct sblock *b = words[i] ? block_at(words[i]) : NULL;
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
        block_at(op->addrs[i])->inflight++;
    op->all = op->overflow || how;
    g_inflight_all += op->all;
    /* the plan: prefetches before the op (never evicting one of its blocks) */
    op->pos = plan_step(key);
    slow_named(&slow, op); /* before the plan's prefetches change their blocks' state */
    if (op->pos >= 0 && !paused)
        run_actions(op->pos, PYOBMEM_ACT_PREFETCH, stamp);
    CUresult fail = CUDA_SUCCESS;
    if (!op->overflow) {
        for (uint32_t i = 0; i < op->n && fail == CUDA_SUCCESS; i++)
            fail = make_usable(block_at(op->addrs[i]), op, stamp);
    } else {
        for (size_t i = 0; i < g_tab.n && fail == CUDA_SUCCESS; i++)
            if (block_of(i)->stamp == stamp)
                fail = make_usable(block_of(i), op, stamp);
    }
    if (how) { /* it may touch anything: everything comes back first, nothing is evicted for it */
        for (size_t i = 0; i < g_tab.n; i++)
            block_of(i)->stamp = stamp;
        for (size_t i = 0; i < g_tab.n && fail == CUDA_SUCCESS; i++)
            fail = make_usable(block_of(i), op, stamp);
    }
    op->capturing = was_capturing;
    if (fail == CUDA_SUCCESS && !paused)
        evict_for_budget(0, stamp); /* the budget holds between allocations too */
    if (fail != CUDA_SUCCESS) {
        inflight_done(op); /* the op is refused: swap_op_end will not run */
        op->active = 0;
    }
    g_waits.op_ns += shim_now_ns() - t_begin;
    g_waits.ops++;
    ctx_leave(pushed);
    slow_end(&slow, "op", op->pos, 0);
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
    struct slow_mark slow;
    slow_begin(&slow);
    swap_lock();
    slow_waits(&slow);
    uint64_t t_end = shim_now_ns();
    int pushed = ctx_enter();
    inflight_done(op);
    if (r == CUDA_SUCCESS && !op->capturing) {
        if ((op->opaque || op->overflow) && !uses_record(g_fences, MAX_FENCES, op->stream) && !g_fences_lost) {
            g_fences_lost = 1;
            ring_note("swap: too many streams with opaque work in flight; swap-outs stopped");
        }
        for (uint32_t i = 0; i < op->n; i++) {
            struct sblock *b = block_at(op->addrs[i]);
            if (b && b->addr == op->addrs[i] && !uses_record(b->uses, MAX_USES, op->stream))
                b->flags |= SBF_LOST;
        }
        if (op->pos >= 0) {
            run_actions(op->pos, PYOBMEM_ACT_SWAP_OUT, g_tick);
        }
    }
    g_waits.op_ns += shim_now_ns() - t_end;
    ctx_leave(pushed);
    slow_end(&slow, "op_end", op->pos, 0);
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}
