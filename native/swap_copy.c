/*
 * The swap executor (swap_state.h): swap-outs on the device-to-host stream after the block's
 * last uses, swap-ins and prefetches on the host-to-device stream, the op's stream made to wait
 * for them, and the ops themselves from swap_op_begin to swap_op_end.
 */
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

static int g_noted_swapin;

/* OUT_PENDING -> RESIDENT: the copy goes on, its result is dropped; the block keeps its slot
 * (a later swap-out of it is ordered after this copy on the same stream). */
void cancel_out(struct sblock *b)
{
    b->state = SB_RESIDENT;
    g_out_pending--;
    g_leaving -= b->vsize;
}

int swap_out(struct sblock *b)
{
    if (b->state != SB_RESIDENT || !swappable(b) || g_fences_lost || !g_d2h)
        return 0;
    void *h = b->host ? b->host : host_slot(b);
    if (!h)
        return 0;
    /* The host slot is written only after the last copy that reads it: the block's own swap-in
     * for its kept slot, any swap-in for a slot new to it (swap-ins run in issue order on g_h2d). */
    CUevent reader = b->host ? (b->copy_h2d ? b->copy_ev : NULL) : g_h2d_ev;
    int ok = (b->copy_ev || (b->copy_ev = ev_new())) && uses_wait(b->uses, MAX_USES, g_d2h) &&
             uses_wait(g_fences, MAX_FENCES, g_d2h) &&
             (!reader || real_cuStreamWaitEvent(g_d2h, reader, 0) == CUDA_SUCCESS) &&
             real_cuMemcpyDtoHAsync_v2(h, b->addr, b->size, g_d2h) == CUDA_SUCCESS &&
             real_cuEventRecord(b->copy_ev, g_d2h) == CUDA_SUCCESS;
    if (!ok) {
        if (!b->host)
            host_free(h, b->size); /* a copy already queued into it is ordered before any reuse */
        return 0;
    }
    b->copy_h2d = 0;
    b->host = h;
    b->state = SB_OUT_PENDING;
    b->t_issue = shim_now_ns();
    g_out_pending++;
    g_leaving += b->vsize;
    releaser_kick();
    return 1;
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
    if (after) /* the memory's last owner is still copying out: the copy in comes after it */
        r = real_cuStreamWaitEvent(g_h2d, after, 0);
    if (r == CUDA_SUCCESS)
        r = real_cuMemcpyHtoDAsync_v2(b->addr, b->host, b->size, g_h2d);
    if (r == CUDA_SUCCESS) {
        r = real_cuEventRecord(b->copy_ev, g_h2d);
        if (r == CUDA_SUCCESS && real_cuEventRecord(g_h2d_ev, g_h2d) != CUDA_SUCCESS)
            r = real_cuStreamSynchronize(g_h2d); /* no later slot writer could wait for it */
        if (r != CUDA_SUCCESS)
            real_cuStreamSynchronize(g_h2d); /* the copy is queued: let it finish before unmapping */
    }
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
            CUresult r = real_cuStreamSynchronize(g_h2d);
            if (r != CUDA_SUCCESS)
                return r;
        }
    } else if (op) {
        CUresult r = real_cuStreamSynchronize(g_h2d);
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
    switch (b->state) {
    case SB_RESIDENT:
        return CUDA_SUCCESS;
    case SB_OUT_PENDING:
        if (!(b->flags & SBF_GIVEN)) {
            cancel_out(b);
            return CUDA_SUCCESS;
        }
        settle_out(b); /* its memory is another block's: it comes back once its copy out ends */
        if (b->state != SB_OUT)
            return CUDA_ERROR_UNKNOWN;
        /* fallthrough */
    case SB_OUT: {
        if (!op || !op->capturing)
            hold_budget(b->vsize, b->device, stamp); /* a demand swap-in keeps the budget too */
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
    pthread_mutex_lock(&g_mu);
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
    pthread_mutex_unlock(&g_mu);
    unrelax(relaxed, old);
}
