/*
 * The slow-call log of swap mode (PYOBMEM_SLOW_LOG=FILE; docs/swap.md "Analysing a swap run"):
 * where a host gap of a swap run went, call by call. NOTE swap.waits sums the executor's waits
 * over the whole run; a gap at one op (the 46 ms before GPT medium's embedding backward at 50%,
 * session 24) needs them per call. One line per executor call (op begin and end, allocation,
 * free) whose time, the wait for g_mu included, passes PYOBMEM_SLOW_US (default 1000), and one
 * per stretch of a thread's time outside the executor as long (the application, or a real driver
 * call: "launch" is the stretch between an op's begin and its end). Off: one load per call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

static FILE *g_log;          /* NULL: off */
static uint64_t g_slow_ns;   /* the threshold */
static int g_slow_state;     /* 0: not read yet; 1: on; -1: off */
static SHIM_TLS uint64_t t_exit;       /* this thread's last exit from an executor call (0: none yet) */
static SHIM_TLS const char *t_exit_of; /* which call that was */

static int slow_on(void)
{
    int state = __atomic_load_n(&g_slow_state, __ATOMIC_ACQUIRE);
    if (SHIM_LIKELY(state))
        return state > 0;
    pthread_mutex_lock(&g_mu);
    if (!g_slow_state) {
        const char *path = getenv(PYOBMEM_ENV_SLOW_LOG), *us = getenv(PYOBMEM_ENV_SLOW_US);
        g_log = path && *path ? fopen(path, "w") : NULL;
        g_slow_ns = (us && *us ? strtoull(us, NULL, 10) : 1000) * 1000;
        if (g_log)
            fprintf(g_log, "t_ns\tcall\tpos\tus\tafter\tfree_wait_us\tdrain_us\tmap_us\taccess_us\tcreate_us"
                           "\tunmap_us\trelease_us\tdemand_us\thold_us\tlock_us\tevictions\tplanned_outs\tbytes\tops_since\n");
        __atomic_store_n(&g_slow_state, g_log ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return g_slow_state > 0;
}

void slow_begin(struct slow_mark *m)
{
    m->t0 = 0;
    if (!slow_on())
        return;
    m->t0 = shim_now_ns();
    m->t_locked = 0;
    m->outside = t_exit ? m->t0 - t_exit : 0;
    m->outside_of = t_exit_of;
}

void slow_waits(struct slow_mark *m)
{
    if (m->t0) {
        m->t_locked = shim_now_ns();
        m->w = g_waits;
    }
}

#define US(f) (unsigned long long)((g_waits.f - m->w.f) / 1000)
#define N(f) (unsigned long long)(g_waits.f - m->w.f)

void slow_end(struct slow_mark *m, const char *call, int64_t pos, uint64_t bytes)
{
    if (!m->t0)
        return;
    uint64_t now = shim_now_ns();
    if (m->outside >= g_slow_ns)
        fprintf(g_log, "%llu\toutside\t%lld\t%llu\t%s\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\n",
                (unsigned long long)m->t0, (long long)pos, (unsigned long long)(m->outside / 1000),
                m->outside_of ? m->outside_of : "-");
    if (now - m->t0 >= g_slow_ns)
        fprintf(g_log, "%llu\t%s\t%lld\t%llu\t-\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t0\n",
                (unsigned long long)m->t0, call, (long long)pos, (unsigned long long)((now - m->t0) / 1000),
                US(free_wait_ns), US(drain_ns), US(map_ns), US(access_ns), US(create_ns), US(unmap_ns),
                US(release_ns), US(demand_ns), US(demand_hold_ns),
                (unsigned long long)((m->t_locked - m->t0) / 1000), N(evictions), N(planned_outs),
                (unsigned long long)bytes);
    t_exit = now;
    t_exit_of = call;
}

void slow_named_out(const struct sblock *b, uint64_t ops_since)
{
    if (g_slow_state <= 0)
        return;
    static const char *const state[] = {"resident", "out_pending", "out", "in_pending"};
    fprintf(g_log, "%llu\tnamed_out\t%lld\t0\t%s%s\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t0\t%llu\t%llu\n",
            (unsigned long long)shim_now_ns(), (long long)plan_hint_position(), state[b->state],
            (b->flags & SBF_GIVEN) ? "_given" : "", (unsigned long long)b->vsize, (unsigned long long)ops_since);
}

void slow_flush(void)
{
    if (g_slow_state > 0) {
        pthread_mutex_lock(&g_mu);
        fflush(g_log);
        pthread_mutex_unlock(&g_mu);
    }
}
