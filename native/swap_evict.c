/*
 * The eviction policy and the budget of swap mode (swap_state.h): which block goes out when the
 * device would pass the budget (Belady's choice by the plan's IDLE hints, else the least recently
 * used), and the waits that keep physical memory under it.
 */
#include "swap_state.h"

static int g_noted_budget;

/* b may go out for the op of `stamp` (round: an eviction round that has not tried it yet). */
static int evictable(const struct sblock *b, uint64_t stamp, uint64_t round)
{
    return b->state == SB_RESIDENT && swappable(b) && b->stamp != stamp && b->tried != round;
}

/* A block the budget could swap out for the op of `stamp`. Without one, waiting for pending frees
 * would only make the host wait at every op (the budget cannot be kept there anyway). */
static int victim_exists(uint64_t stamp)
{
    for (size_t i = 0; i < g_tab.n; i++)
        if (evictable(block_of(i), stamp, UINT64_MAX)) /* no round: rounds are ticks, never that */
            return 1;
    return 0;
}

/* Under a plan's IDLE hints, a block of the size about to be mapped is taken over the block idle
 * the longest when it is idle at least this share of that one's time: its memory then goes
 * straight to the mapping (a handoff, swap_vmm.c) instead of the host waiting for a copy. */
#define SAME_SIZE_SHARE 2 /* 1/2 */

static struct sblock *pick_victim(uint64_t stamp, uint64_t round, uint64_t vsize)
{
    struct sblock *v = NULL, *busy = NULL, *same = NULL;
    int64_t pos = plan_hint_position();
    if (pos >= 0) {
        /* Belady's choice on the learned iteration: the block idle the longest from here */
        uint32_t best = 0, best_same = 0;
        for (size_t i = 0; i < g_tab.n; i++) {
            struct sblock *b = block_of(i);
            if (!evictable(b, stamp, round))
                continue;
            uint32_t d = idle_for(b, pos);
            if (d > best) {
                best = d;
                v = b;
            }
            if (b->vsize == vsize && d > best_same) {
                best_same = d;
                same = b;
            }
        }
        if (same && best_same * SAME_SIZE_SHARE >= best)
            v = same;
        if (v) {
            v->tried = round;
            return v;
        }
    }
    for (size_t i = 0; i < g_tab.n; i++) {
        struct sblock *b = block_of(i);
        if (!evictable(b, stamp, round))
            continue;
        if (v && b->lru >= v->lru)
            continue;
        if (uses_idle(b->uses, MAX_USES))
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

/* Free at least `need` bytes of device memory now: cached memory first, finish swap-outs in
 * flight, then evict idle blocks and wait for their copies (on the device-to-host stream). */
void make_room(uint64_t need, uint64_t stamp)
{
    uint64_t before = g_mapped + g_spare_bytes, round = ++g_tick;
    cache_trim(need, NULL);
    drain_outs();
    while (before - g_mapped - g_spare_bytes + g_leaving < need) {
        struct sblock *v = pick_victim(stamp, round, need);
        if (!v)
            break;
        g_waits.evictions += swap_out(v, PYOBMEM_SWAP_OUT_ROOM);
    }
    drain_outs();
}

/* Bytes by which resident_bytes() + extra passes the budget, 0 when it does not: read once, since
 * other threads' non-swap allocations and frees change resident_bytes() without g_mu. */
static uint64_t over_budget(uint64_t extra, uint64_t budget)
{
    uint64_t r = resident_bytes() + extra;
    return r > budget ? r - budget : 0;
}

/* Keep mapped bytes (less those on their way out) plus `need` under the budget by swapping out
 * the least recently used blocks: before a plan exists this is the whole policy; under a plan,
 * the safety net for a plan whose swap-outs come later than predicted. keep: the bytes of a spare
 * handle or cached block the caller maps next (counted already), never given back for it. */
static void evict_keeping(uint64_t need, uint64_t keep, uint64_t stamp)
{
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED), over;
    if (!budget || !(over = over_budget(need, budget)))
        return;
    cache_trim_keeping(over, keep); /* cached memory before live blocks */
    if (g_pool_slack && (over = over_budget(need, budget)))
        pools_trim(over); /* the driver's cached memory too */
    if ((over = over_budget(need, budget)) && victim_exists(stamp))
        cache_trim_waiting(over, keep); /* freed memory before live blocks */
    if (resident_bytes() + need > budget) {
        g_waits.rounds++;
        g_waits.round_pending += cache_pending_bytes();
    }
    uint64_t round = ++g_tick;
    while (resident_bytes() + need > budget) {
        struct sblock *v = pick_victim(stamp, round, need);
        if (!v)
            break;
        g_waits.evictions += swap_out(v, PYOBMEM_SWAP_OUT_BUDGET);
    }
    if (resident_bytes() + need > budget && !g_noted_budget) {
        uint64_t op = need; /* the op's own blocks: none of them can go out for it */
        for (size_t i = 0; i < g_tab.n; i++)
            if (block_of(i)->stamp == stamp)
                op += block_of(i)->vsize;
        if (op > budget) {
            g_noted_budget = 1;
            ring_note("swap.warn=the budget (%llu bytes) is below what one op needs at once (%llu bytes of "
                      "swappable blocks); the device goes over it there",
                      (unsigned long long)budget, (unsigned long long)op);
        }
    }
}

void evict_for_budget(uint64_t need, uint64_t stamp) { evict_keeping(need, 0, stamp); }

/* Before mapping `need` bytes: evict for the budget, and when the memory of the swap-outs still
 * in flight would put the device over it, take one of their memory or wait for them (their
 * copy events only: they wait for their blocks' last uses, never for unrelated work). Physical
 * memory then stays under the budget, not only the bytes the executor counts. */
/* `need` when the memory a map of that size takes next is counted already (a spare handle, or a
 * cached block's whose free was reached: map_block takes it), else 0. */
static uint64_t counted_of(uint64_t need, int device)
{
    return spare_bytes_of(need) || cache_idle_bytes_of(need, device) ? need : 0;
}

void hold_budget(uint64_t need, int device, uint64_t stamp)
{
    /* A spare of `need` bytes (or a cached block's, its free reached: map_block takes its memory)
     * is the memory the caller maps next (counted already), the memory
     * of a swap-out still copying is taken as is (map_block): no wait for either. Else spare
     * handles and cached memory whose free has completed go back, then the oldest swap-outs in
     * flight are waited for, as many as the budget needs. */
    uint64_t keep = counted_of(need, device);
    pools_refresh();
    evict_keeping(need - keep, keep, stamp);
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    uint64_t over;
    if (budget && g_out_pending && (over = over_budget(g_leaving + need - keep, budget)) && !handoff_ready(need, device)) {
        /* Cached memory the GPU is done with (and spare handles) goes back before the host
         * waits for copies: GPT medium at 75% on the H200 waited 48 ms at one 128 MiB
         * allocation for 2.5 GiB of swap-outs while the application held 14.3 of the 25.9 GiB
         * budget; with this order its step went from 1.106x to 1.033x (session 13). */
        cache_trim_keeping(over, keep);
        if (over_budget(g_leaving + need - keep, budget))
            drain_until(need - keep, budget);
    }
    /* spares the drained swap-outs kept: one of `need` bytes is the memory the caller maps next */
    keep = counted_of(need, device);
    if (budget && (over = over_budget(need - keep, budget)))
        cache_trim_keeping(over, keep);
}
