/*
 * Plan following in swap mode (swap_state.h): a plan the daemon wrote into the control file is
 * adopted at an iteration boundary; each op's key advances the position; the plan's SWAP_OUT,
 * PREFETCH actions run at theirs (MARK actions are ignored: see swap.c), and its IDLE hints
 * guide eviction.
 */
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

/* ---- plan state ---- */
/* When the template's first key recurs inside the iteration (GPT tiny's first kernel does, a
 * gradient-accumulation step's first micro-step kernel recurs at every micro-step), a host that
 * joins mid-iteration can sync at the wrong occurrence: such a sync is tentative for
 * g_plan.confirm_ops ops (confirm_ops_of). While tentative the plan's actions, sites and hints
 * wait, and a mismatch only means waiting for the iteration's start again, not a drop. */

/* An adopted action: the control file's, with its site as an index into g_plan.sites (-1: the
 * block is named by its address). */
struct act {
    uint32_t at;
    uint16_t kind, until;
    uint64_t addr, size;
    int32_t site;
};

/* An allocation site of the followed plan and the live block bound to it (NULL: none now). */
struct site {
    uint32_t at, ord;
    uint64_t size;
    struct sblock *b;
};

static struct {
    int following;
    uint64_t gen;
    uint32_t period;
    int64_t next; /* position expected next; -1: waiting for template_keys[0] */
    uint32_t confirm; /* > 0: the sync is tentative for this many more ops (plan_step) */
    uint32_t confirm_ops; /* ops a sync at the first key is tentative for; 0: that key is unique */
    uint64_t unsynced;    /* ops in a row not in step with the template (plan_step) */
    uint64_t *keys;
    struct act *acts;
    uint32_t n_acts;
    struct act *idle; /* IDLE hints, by block identity (ident_of) then position */
    uint32_t n_idle;
    struct site *sites; /* by (at, ord) */
    uint32_t n_sites;
    int64_t alloc_at;   /* position of the last op followed (the site of allocations now); -1: none */
    uint32_t alloc_ord; /* counted allocations since that op */
} g_plan = {.alloc_at = -1};
static uint64_t g_adopted;
/* The followed plan's position of the application's latest host sync (cuCtxSynchronize,
 * cuStreamSynchronize; g_plan.next when it began), -1: none yet (a new plan starts without one).
 * Written without g_mu (the sync hooks take no lock), read under it. */
static int64_t g_sync_at = -1;

/* A block's identity in the plan: its site (bit 63 set) while it is bound to one, else its
 * address (device addresses never have bit 63 set). */
static uint64_t ident_of(const struct sblock *b)
{
    return b->site ? (1ull << 63) | (uint64_t)(b->site - 1) : b->addr;
}

static uint64_t ident_of_act(const struct act *a)
{
    return a->site >= 0 ? (1ull << 63) | (uint64_t)a->site : a->addr;
}

static int cmp_site(const void *a, const void *b)
{
    const struct site *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return x->ord < y->ord ? -1 : x->ord > y->ord;
}

static struct site *site_find(uint32_t at, uint32_t ord)
{
    struct site key = {.at = at, .ord = ord};
    return bsearch(&key, g_plan.sites, g_plan.n_sites, sizeof key, cmp_site);
}

static int cmp_at(const void *a, const void *b)
{
    const struct act *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

static int cmp_ident_at(const void *a, const void *b)
{
    const struct act *x = a, *y = b;
    uint64_t i = ident_of_act(x), j = ident_of_act(y);
    if (i != j)
        return i < j ? -1 : 1;
    return x->at < y->at ? -1 : x->at > y->at;
}

/* Ops from position p to b's next access by the plan's IDLE hints (cyclic), for the window that
 * holds p: strictly inside (s, n), or also at its end (s, n] when `at_end` (the op at p itself
 * accesses b: 0 ops). UINT32_MAX when no window holds p. */
static uint32_t hinted_until(const struct sblock *b, int64_t pos, int at_end)
{
    uint64_t id = ident_of(b);
    size_t lo = 0, hi = g_plan.n_idle;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ident_of_act(&g_plan.idle[mid]) < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t P = g_plan.period, p = (uint32_t)(pos % P);
    for (size_t i = lo; i < g_plan.n_idle && ident_of_act(&g_plan.idle[i]) == id; i++) {
        uint32_t s = g_plan.idle[i].at, n = g_plan.idle[i].until;
        int before_end = at_end ? p <= n : p < n;
        int inside = s < n ? (p > s && before_end) : (p > s || before_end); /* n <= s: wraps the iteration */
        if (inside)
            return (n + P - p) % P;
    }
    return UINT32_MAX;
}

/* Ops until b's next access from position pos by the plan's IDLE hints (cyclic), or 0 when no
 * hint says it is idle at pos (in use now, or unknown). */
uint32_t idle_for(const struct sblock *b, int64_t pos)
{
    uint32_t d = hinted_until(b, pos, 0);
    return d == UINT32_MAX ? 0 : d ? d : g_plan.period;
}

/* A block the plan's IDLE hints say an op needs within this many ops (or a quarter of the
 * iteration, if less, but at least the next op) is needed soon: its memory is not handed to
 * another block (leaving_of). */
#define SOON_OPS 64

int needed_soon(const struct sblock *b)
{
    int64_t pos = plan_hint_position();
    if (pos < 0)
        return 0;
    uint32_t soon = g_plan.period / 4 < SOON_OPS ? g_plan.period / 4 : SOON_OPS;
    if (!soon)
        soon = 1; /* P < 4: still never the block the next op names */
    return hinted_until(b, pos, 1) < soon;
}

/* The ops a sync at keys[0] stays tentative: one more than the longest run, from any other
 * occurrence j of keys[0], that matches the template's start (keys[j..] cyclic against keys[0..]),
 * so that a sync at the wrong occurrence always meets its mismatch while tentative; at most
 * period - 1; 0 when keys[0] is unique. Z-function over keys followed by keys[0 .. P-2], O(P). */
static uint32_t confirm_ops_of(const uint64_t *keys, uint32_t P)
{
    if (P < 2)
        return 0;
    uint32_t n = 2 * P - 1, best = 0;
    int any = 0;
    uint32_t *z = calloc(n, sizeof *z);
    if (!z)
        return P - 1; /* no memory: the longest window there can be */
#define T(i) keys[(i) % P]
    for (uint32_t i = 1, l = 0, r = 0; i < n; i++) {
        uint32_t k = i < r ? (r - i < z[i - l] ? r - i : z[i - l]) : 0;
        while (i + k < n && T(k) == T(i + k))
            k++;
        z[i] = k;
        if (i + k > r) {
            l = i;
            r = i + k;
        }
        if (i < P && keys[i] == keys[0]) {
            any = 1;
            if (k > best)
                best = k;
        }
    }
#undef T
    free(z);
    if (!any)
        return 0;
    return best + 1 < P - 1 ? best + 1 : P - 1;
}

/* The plan's distinct sites, sorted (*n of them), and each site action's index into them (g_mu
 * held). Returns NULL on allocation failure. */
static struct site *collect_sites(struct act *acts, uint32_t n_acts, const struct pyobmem_action *src,
                                  uint32_t *n)
{
    *n = 0;
    struct site *sites = malloc((n_acts ? n_acts : 1) * sizeof *sites);
    if (!sites)
        return NULL;
    for (uint32_t i = 0; i < n_acts; i++)
        if (src[i].site_at != PYOBMEM_SITE_NONE)
            sites[(*n)++] = (struct site){src[i].site_at, src[i].site_ord, src[i].size, NULL};
    qsort(sites, *n, sizeof *sites, cmp_site);
    uint32_t k = 0;
    for (uint32_t i = 0; i < *n; i++)
        if (k == 0 || cmp_site(&sites[k - 1], &sites[i]) != 0)
            sites[k++] = sites[i];
    *n = k;
    for (uint32_t i = 0; i < n_acts; i++) {
        if (src[i].site_at == PYOBMEM_SITE_NONE)
            continue;
        struct site key = {.at = src[i].site_at, .ord = src[i].site_ord};
        struct site *t = bsearch(&key, sites, k, sizeof key, cmp_site);
        acts[i].site = t && t->size == src[i].size ? (int32_t)(t - sites) : -2; /* -2: never resolves */
    }
    return sites;
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
    struct pyobmem_action *src = malloc((na ? na : 1) * sizeof *src);
    struct act *acts = malloc((na ? na : 1) * sizeof *acts), *idle = malloc((na ? na : 1) * sizeof *idle);
    struct site *sites = NULL;
    uint32_t n_sites = 0;
    if (!keys || !src || !acts || !idle)
        goto fail;
    memcpy(keys, p->template_keys, period * sizeof *keys);
    memcpy(src, p->actions, na * sizeof *src);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != gen) /* rewritten meanwhile */
        goto fail;
    for (uint32_t i = 0; i < na; i++)
        acts[i] = (struct act){src[i].at, src[i].kind, src[i].until, src[i].addr, src[i].size, -1};
    sites = collect_sites(acts, na, src, &n_sites);
    if (!sites)
        goto fail;
    uint32_t k = 0, ni = 0;
    for (uint32_t i = 0; i < na; i++) {
        if (acts[i].at >= period || acts[i].site == -2)
            continue;
        if (acts[i].kind == PYOBMEM_ACT_IDLE && acts[i].until < period)
            idle[ni++] = acts[i];
        else if (acts[i].kind == PYOBMEM_ACT_SWAP_OUT || acts[i].kind == PYOBMEM_ACT_PREFETCH)
            acts[k++] = acts[i];
    }
    qsort(acts, k, sizeof *acts, cmp_at);
    qsort(idle, ni, sizeof *idle, cmp_ident_at);
    free(src);
    free(g_plan.keys);
    free(g_plan.acts);
    free(g_plan.idle);
    free(g_plan.sites);
    for (size_t i = 0; i < g_tab.n; i++) /* bindings to the old plan's sites end */
        block_of(i)->site = 0;
    g_plan.keys = keys;
    g_plan.acts = acts;
    g_plan.n_acts = k;
    g_plan.idle = idle;
    g_plan.n_idle = ni;
    g_plan.sites = sites;
    g_plan.n_sites = n_sites;
    g_plan.period = period;
    g_plan.gen = gen;
    __atomic_store_n(&g_plan.next, -1, __ATOMIC_RELAXED); /* plan_app_sync reads it without g_mu */
    g_plan.confirm = 0;
    g_plan.unsynced = 0;
    g_plan.confirm_ops = confirm_ops_of(keys, period);
    g_plan.alloc_at = -1;
    __atomic_store_n(&g_plan.following, 1, __ATOMIC_RELAXED);
    g_adopted = gen;
    __atomic_store_n(&g_sync_at, -1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_ctl->adopted, gen, __ATOMIC_RELEASE);
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_PLAN, .plan = {.generation = gen, .value = k}}, 1);
    return;
fail:
    free(keys);
    free(src);
    free(acts);
    free(idle);
    free(sites);
}

/* The position of the op with `key` in the followed plan, or -1. */
/* The shim leaves the plan: a PLAN drop record (position, the op issued, the one expected). */
static void drop(int64_t at, uint64_t seen, uint64_t expected)
{
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_PLAN, .flags = 1,
                                        .plan = {.generation = g_plan.gen, .value = (uint64_t)at, .seen = seen,
                                                 .expected = expected}}, 1);
    __atomic_add_fetch(&g_ctl->plan_drops, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&g_plan.following, 0, __ATOMIC_RELAXED);
}

int64_t plan_step(uint64_t key)
{
    if (!g_plan.following || g_plan.next <= 0)
        maybe_adopt(); /* only at an iteration boundary or when none is followed */
    g_plan.alloc_at = -1; /* until this op is followed */
    if (!g_plan.following)
        return -1;
    int64_t pos = -1;
    if (g_plan.next >= 0 && key == g_plan.keys[g_plan.next])
        pos = g_plan.next;
    else if (key == g_plan.keys[0]) {
        pos = 0; /* the iteration's start (or a resync to it) */
        g_plan.confirm = g_plan.confirm_ops;
    } else if (g_plan.next >= 0 && !g_plan.confirm) {
        drop(g_plan.next, key, g_plan.keys[g_plan.next]);
        return -1;
    } else { /* waiting for the iteration's start, or a tentative sync given up */
        __atomic_store_n(&g_plan.next, -1, __ATOMIC_RELAXED);
        g_plan.confirm = 0;
    }
    if (pos >= 0) {
        __atomic_store_n(&g_plan.next, (pos + 1) % g_plan.period, __ATOMIC_RELAXED);
        if (!(g_plan.confirm && --g_plan.confirm)) { /* in step */
            g_plan.unsynced = 0;
            g_plan.alloc_at = pos;
            g_plan.alloc_ord = 0;
            return pos;
        }
    }
    /* Out of step (waiting, or tentative). Two iterations' worth of ops without getting in step:
     * the template does not describe what runs (a tentative sync never confirmed, or its first
     * key never seen): a drop, so that the daemon learns again. */
    if (++g_plan.unsynced > 2 * (uint64_t)g_plan.period + g_plan.confirm_ops)
        drop(0, key, g_plan.keys[0]);
    return -1;
}

void plan_allocation(struct sblock *b, uint64_t size)
{
    if (!g_plan.following || g_plan.alloc_at < 0)
        return;
    uint32_t ord = g_plan.alloc_ord++;
    struct site *t = b ? site_find((uint32_t)g_plan.alloc_at, ord) : NULL;
    if (!t || t->size != size)
        return;
    if (t->b)
        t->b->site = 0; /* a block still bound from the last iteration (never freed): this one now */
    t->b = b;
    b->site = (int32_t)(t - g_plan.sites) + 1;
}

void plan_unbind(struct sblock *b)
{
    if (b->site && g_plan.sites && (uint32_t)b->site <= g_plan.n_sites && g_plan.sites[b->site - 1].b == b)
        g_plan.sites[b->site - 1].b = NULL;
    b->site = 0;
}

void run_actions(int64_t pos, uint16_t kind, uint64_t stamp)
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
        const struct act *a = &g_plan.acts[i];
        if (a->kind != kind)
            continue;
        struct sblock *b = a->site >= 0 ? g_plan.sites[a->site].b : block_at(a->addr);
        if (!b || (a->site < 0 && (b->addr != a->addr || b->site)) || b->size != a->size)
            continue;
        /* Bringing a block back is always safe; only what goes out must be swappable. A prefetch
         * at its consumer (a host running far ahead leaves no earlier op) finds the block in flight
         * for this very op: skipping it made every such swap-in a demand one. */
        if (kind != PYOBMEM_ACT_PREFETCH && !swappable(b))
            continue;
        if (kind == PYOBMEM_ACT_PREFETCH) {
            settle_out(b); /* still copying out, its memory another block's: wait for the copy */
            if (b->state == SB_OUT) {
                hold_budget(b->vsize, b->device, stamp);
                swap_in(b, 1, stamp); /* a failure leaves it out: the consumer brings it back */
            } else if (b->state == SB_OUT_PENDING && !(b->flags & SBF_GIVEN))
                cancel_out(b); /* needed before its copy out ended: it stays */
        } else {
            if (b->state == SB_IN_PENDING)
                finish_in(b, NULL, 0);
            g_waits.planned_outs += swap_out(b, PYOBMEM_SWAP_OUT_PLANNED);
        }
    }
}

int64_t plan_hint_position(void)
{
    return g_plan.following && g_plan.n_idle && g_plan.next >= 0 && !g_plan.confirm ? g_plan.next : -1;
}

void plan_app_sync(void)
{
    int64_t next = __atomic_load_n(&g_plan.next, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g_plan.following, __ATOMIC_RELAXED) && next >= 0)
        __atomic_store_n(&g_sync_at, next, __ATOMIC_RELAXED);
}

/* Ops before the latest sync's position in which little goes to the copy engine ahead. */
#define NEAR_SYNC_OPS 48

int plan_near_app_sync(void)
{
    int64_t at = __atomic_load_n(&g_sync_at, __ATOMIC_RELAXED), pos = plan_hint_position();
    if (at < 0 || pos < 0 || at >= g_plan.period) /* at: read while another plan was adopted */
        return 0;
    uint32_t P = g_plan.period, near = P / 4 < NEAR_SYNC_OPS ? P / 4 : NEAR_SYNC_OPS;
    return (uint32_t)((at - pos % P + P) % P) < near;
}
