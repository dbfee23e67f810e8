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

/* The bytes of a map of `need` on device whose memory is there already (the cached block of that
 * size whose free was reached, which map_block takes: callers with device >= 0 only; else the
 * spare chunks it takes): counted in resident_bytes(), so not needed again. */
uint64_t counted_of(uint64_t need, int device)
{
    if (!need)
        return 0;
    return cache_idle_bytes_of(need, device) ? need : spares_cover(need, device);
}

/* Keep mapped bytes (less those on their way out) plus what a map of `need` bytes on device adds
 * (counted_of: not what it takes from spares or the cache) under the budget by swapping out the
 * least recently used blocks: before a plan exists this is the whole policy; under a plan, the
 * safety net for a plan whose swap-outs come later than predicted. The memory that map takes is
 * never given back for it. */
static void evict_keeping(uint64_t need, int device, uint64_t stamp)
{
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED), over;
#define ADDS (need - counted_of(need, device))
    if (!budget || !(over = over_budget(ADDS, budget)))
        return;
    cache_trim_keeping(over, need); /* cached memory before live blocks */
    if (g_pool_slack && (over = over_budget(ADDS, budget)))
        pools_trim(over); /* the driver's cached memory too */
    if ((over = over_budget(ADDS, budget)) && victim_exists(stamp))
        cache_trim_waiting(over, need); /* freed memory before live blocks */
    uint64_t adds = ADDS;
    if (resident_bytes() + adds > budget) {
        g_waits.rounds++;
        g_waits.round_pending += cache_pending_bytes();
    }
    uint64_t round = ++g_tick;
    while (resident_bytes() + adds > budget) {
        struct sblock *v = pick_victim(stamp, round, need);
        if (!v)
            break;
        g_waits.evictions += swap_out(v, PYOBMEM_SWAP_OUT_BUDGET);
    }
#undef ADDS
    if (resident_bytes() + adds > budget && !g_noted_budget) {
        uint64_t op = adds; /* the op's own blocks: none of them can go out for it */
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

void evict_for_budget(uint64_t need, uint64_t stamp) { evict_keeping(need, -1, stamp); }

/* Before mapping `need` bytes: evict for the budget, and when the memory of the swap-outs still
 * in flight would put the device over it, take one of their memory or wait for them (their
 * copy events only: they wait for their blocks' last uses, never for unrelated work). Physical
 * memory then stays under the budget, not only the bytes the executor counts. While it runs, the
 * chunks given back that this map takes stay as spares for it (g_want: unmap_block_keep). */
void hold_budget(uint64_t need, int device, uint64_t stamp)
{
    /* The cached block of `need` bytes whose free was reached and the spare chunks the map takes
     * are counted already (counted_of), the memory of a swap-out still copying is taken as is
     * (map_block): no wait for either. Else spare chunks and cached memory whose free has
     * completed go back, then the oldest swap-outs in flight are waited for, as many as the
     * budget needs. */
    g_want = need;
    g_want_dev = device;
    pools_refresh();
    evict_keeping(need, device, stamp);
    uint64_t budget = __atomic_load_n(&g_ctl->budget_bytes, __ATOMIC_RELAXED);
    uint64_t over;
    if (budget && g_out_pending && (over = over_budget(g_leaving + need - counted_of(need, device), budget)) &&
        !handoff_ready(need, device)) {
        /* Cached memory the GPU is done with (and spare chunks) goes back before the host
         * waits for copies: GPT medium at 75% on the H200 waited 48 ms at one 128 MiB
         * allocation for 2.5 GiB of swap-outs while the application held 14.3 of the 25.9 GiB
         * budget; with this order its step went from 1.106x to 1.033x (session 13). */
        cache_trim_keeping(over, need);
        if (over_budget(g_leaving + need - counted_of(need, device), budget))
            drain_until(need, device, budget);
    }
    if (budget && (over = over_budget(need - counted_of(need, device), budget)))
        cache_trim_keeping(over, need);
    g_want = 0;
    g_want_dev = -1;
}
