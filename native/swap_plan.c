/*
 * Plan following in swap mode (swap_state.h): a plan the daemon wrote into the control file is
 * adopted at an iteration boundary; each op's key advances the position; the plan's SWAP_OUT,
 * PREFETCH and MARK actions run at theirs, and its IDLE hints guide eviction.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "swap_state.h"

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
uint32_t idle_for(const struct sblock *b, int64_t pos)
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
int64_t plan_step(uint64_t key)
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

void run_actions(int64_t pos, uint16_t kind, uint64_t stamp, CUstream s)
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
        struct sblock *b = block_at(a->addr);
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

int64_t plan_hint_position(void)
{
    return g_plan.following && g_plan.n_idle && g_plan.next >= 0 ? g_plan.next : -1;
}
