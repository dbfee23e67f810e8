/*
 * Self-timing (shim.h, ST_BEGIN/ST_END; a build with -DPYOBMEM_SELF_TIME only): per part of the
 * shim, the calls and the time inside them, summed over the process and printed to stderr at
 * exit as `pyobmem selftime PART calls=N ns_each=X total_ms=Y`. Ticks are the TSC on x86-64
 * (about 10 ns per pair of reads: the figures include it), converted to ns against
 * CLOCK_MONOTONIC over the process's life; elsewhere CLOCK_MONOTONIC itself.
 */
#ifdef PYOBMEM_SELF_TIME
#include <stdio.h>
#ifdef __x86_64__
#include <x86intrin.h>
#endif

#include "shim.h"

static uint64_t g_ticks[ST_PARTS], g_calls[ST_PARTS]; /* atomic */
static uint64_t g_tick0, g_ns0;

uint64_t st_now(void)
{
#ifdef __x86_64__
    return __rdtsc();
#else
    return shim_now_ns();
#endif
}

void st_add(enum st_part part, uint64_t ticks)
{
    __atomic_add_fetch(&g_ticks[part], ticks, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_calls[part], 1, __ATOMIC_RELAXED);
}

void st_more(enum st_part part, uint64_t ticks) { __atomic_add_fetch(&g_ticks[part], ticks, __ATOMIC_RELAXED); }

__attribute__((constructor)) static void st_start(void)
{
    g_tick0 = st_now();
    g_ns0 = shim_now_ns();
}

__attribute__((destructor)) static void st_report(void)
{
    static const char *const names[ST_PARTS] = {"launch_driver", "launch_record", "copy_record", "ring_write",
                                                "params_refresh", "gpuclock_sample", "gpuclock_capturing",
                                                "gpuclock_ctx", "gpuclock_record"};
    uint64_t ns = shim_now_ns() - g_ns0, ticks = st_now() - g_tick0;
    double ns_per_tick = ticks ? (double)ns / (double)ticks : 1.0;
    for (int k = 0; k < ST_PARTS; k++) {
        uint64_t n = __atomic_load_n(&g_calls[k], __ATOMIC_RELAXED);
        double t = (double)__atomic_load_n(&g_ticks[k], __ATOMIC_RELAXED) * ns_per_tick;
        if (n)
            fprintf(stderr, "pyobmem selftime %s calls=%llu ns_each=%.1f total_ms=%.3f\n", names[k],
                    (unsigned long long)n, t / (double)n, t / 1e6);
    }
}
#endif
