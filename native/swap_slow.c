/*
 * The slow-call log of swap mode (PYOBMEM_SLOW_LOG=FILE; docs/swap.md "Analysing a swap run"):
 * where a host gap of a swap run went, call by call. NOTE swap.waits sums the executor's waits
 * over the whole run; a gap at one op (the 46 ms before GPT medium's embedding backward at 50%,
 * session 24) needs them per call. One tab-separated line per executor call whose time, the
 * wait for g_mu included, reaches PYOBMEM_SLOW_US (default 1000): "op" and "op_end" (an op's
 * begin and end), "alloc" (an allocation the shim served), "alloc_not_served" (one it passed to
 * the driver), "free" (of a shim block); one per stretch of a thread's time outside the executor
 * as long ("outside", after the call that began it; after "op" it is the launch itself; its pos
 * is the call's that ended it); and, whatever the threshold, one per block an op names that is
 * not resident ("named_out"). The waits nest as the counters of struct swap_waits do: demand
 * (a demand swap-in, whole) holds its hold, drain and map; map holds create and access; unmap
 * holds release. Lines are appended, each with its pid and in one write, so that processes
 * sharing the path keep them whole (the header is written to an empty file). Off (the default):
 * each executor call makes three calls here that return at a load.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "swap_state.h"

static int g_fd = -1;      /* the log; -1: off */
static uint64_t g_slow_ns; /* the threshold */
static int g_slow_state;   /* 0: not read yet; 1: on; -1: off */
static SHIM_TLS uint64_t t_exit;       /* this thread's last exit from an executor call (0: none yet) */
static SHIM_TLS const char *t_exit_of; /* which call that was */

#define HEADER "pid\tt_ns\tcall\tpos\tus\tafter\tfree_wait_us\tdrain_us\tmap_us\taccess_us\tcreate_us\tunmap_us" \
               "\trelease_us\tdemand_us\thold_us\tlock_us\tevictions\tplanned_outs\tbytes\tops_since\n"

static int slow_on(void)
{
    int state = __atomic_load_n(&g_slow_state, __ATOMIC_ACQUIRE);
    if (SHIM_LIKELY(state))
        return state > 0;
    pthread_mutex_lock(&g_mu);
    if (!g_slow_state) {
        const char *path = getenv(PYOBMEM_ENV_SLOW_LOG);
        g_fd = path && *path ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
        g_slow_ns = shim_env_u64(PYOBMEM_ENV_SLOW_US, 1000, UINT64_MAX / 1000) * 1000;
        struct stat st;
        if (g_fd >= 0 && fstat(g_fd, &st) == 0 && st.st_size == 0 && write(g_fd, HEADER, sizeof HEADER - 1) < 0) {
            close(g_fd);
            g_fd = -1;
        }
        if (path && *path && g_fd < 0)
            ring_note("swap.warn=the slow-call log %s cannot be written; no log", path);
        __atomic_store_n(&g_slow_state, g_fd >= 0 ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_mu);
    return g_slow_state > 0;
}

/* One line, formatted on the stack and written in one write() (dprintf would take stdio's locks
 * and allocate, with g_mu held): the call's fields, then the waits (NULL: zeros); a failed or
 * short write loses it. */
static void line(uint64_t t, const char *call, int64_t pos, uint64_t us, const char *after, const uint64_t *parts,
                 uint64_t lock_us, uint64_t bytes, uint64_t ops_since)
{
    static const uint64_t none[11];
    const uint64_t *p = parts ? parts : none;
    char buf[512];
    int n = snprintf(buf, sizeof buf, "%d\t%llu\t%s\t%lld\t%llu\t%s\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu\t%llu"
                      "\t%llu\t%llu\t%llu\n",
                (int)g_shim.pid, (unsigned long long)t, call, (long long)pos, (unsigned long long)us, after,
                (unsigned long long)p[0], (unsigned long long)p[1], (unsigned long long)p[2],
                (unsigned long long)p[3], (unsigned long long)p[4], (unsigned long long)p[5],
                (unsigned long long)p[6], (unsigned long long)p[7], (unsigned long long)p[8],
                (unsigned long long)lock_us, (unsigned long long)p[9], (unsigned long long)p[10],
                (unsigned long long)bytes, (unsigned long long)ops_since);
    if (n > 0 && (size_t)n < sizeof buf) {
        ssize_t w = write(g_fd, buf, (size_t)n);
        (void)w;
    }
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

void slow_end(struct slow_mark *m, const char *call, int64_t pos, uint64_t bytes)
{
    if (!m->t0)
        return;
    uint64_t now = shim_now_ns();
    if (m->outside_of && m->outside >= g_slow_ns) /* none before a thread's first call */
        line(m->t0 - m->outside, "outside", pos, m->outside / 1000, m->outside_of, NULL, 0, 0, 0);
    if (now - m->t0 >= g_slow_ns) {
#define D(f) (g_waits.f - m->w.f)
        const uint64_t parts[11] = {D(free_wait_ns) / 1000, D(drain_ns) / 1000, D(map_ns) / 1000,
                                    D(access_ns) / 1000, D(create_ns) / 1000, D(unmap_ns) / 1000,
                                    D(release_ns) / 1000, D(demand_ns) / 1000, D(demand_hold_ns) / 1000,
                                    D(evictions), D(planned_outs)};
#undef D
        line(m->t0, call, pos, (now - m->t0) / 1000, "-", parts, (m->t_locked - m->t0) / 1000, bytes, 0);
    }
    t_exit = now;
    t_exit_of = call;
}

void slow_named(const struct slow_mark *m, const struct swap_op *op)
{
    static uint64_t ops; /* ops begun while the log is on (g_mu held) */
    static const char *const state[] = {"resident", "out_pending", "out", "in_pending"};
    if (!m->t0)
        return;
    ops++;
    for (uint32_t i = 0; i < op->n; i++) {
        struct sblock *b = block_at(op->addrs[i]);
        if (!b)
            continue;
        if (b->state != SB_RESIDENT) {
            char what[32];
            snprintf(what, sizeof what, "%s%s", state[b->state], (b->flags & SBF_GIVEN) ? "_given" : "");
            line(shim_now_ns(), "named_out", op->pos, 0, what, NULL, 0, b->vsize, ops - b->named_op);
        }
        b->named_op = ops;
    }
}
