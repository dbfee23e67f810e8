/*
 * GPU clock: when ops really run on the GPU, sampled without CUPTI.
 *
 * Every PYOBMEM_GPU_CLOCK_EVERY-th op (default 32; 0 turns sampling off) the hook that issued it
 * records a timing event from a pool the shim owns on the op's own stream, right after the op.
 * The event completes when the op (and everything before it on that stream) has run. A shim
 * thread polls pending events with cuEventQuery (never waiting in the driver), converts each
 * completed one to CLOCK_MONOTONIC ns with cuEventElapsedTime against a reference event whose
 * host time it measured, and writes a GPU_TIME record (abi.h) into the ring.
 *
 * Rules kept here, from cases.md:
 *   - never on a stream that is capturing a graph (C11): cuStreamIsCapturing first; on the
 *     legacy stream it fails while any blocking stream captures, and the sample is skipped;
 *   - never adds work the op's stream would wait for: a record is the last thing on the stream,
 *     nothing waits on it, and the shim's own reference records go to its own non-blocking stream;
 *   - the application's thread never waits on its own work: a full pool (PYOBMEM_GPU_CLOCK_POOL
 *     events per context, default 256) skips the sample (counted). The one exception is the
 *     first sample of a context, which sets the context up on the application's thread (its
 *     stream, events, and a reference event timed on that idle stream: well under a ms, once);
 *   - per-thread default streams are CU_STREAM_PER_THREAD (the hook normalises NULL);
 *   - each context (device) has its own pool, reference events and stream (GC_MAX_CTX of them);
 *   - fork: the child starts with no pool and no thread (the parent's events are not its own);
 *   - the daemon dying: the ring drops, nothing waits.
 * Events are recycled in their pool and live as long as their context.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim.h"

#define GC_DEFAULT_EVERY 32
#define GC_DEFAULT_POOL 256
#define GC_MAX_POOL 4096
#define GC_MAX_CTX 8
#define GC_REFS 4                     /* reference events per context: one current, older ones retiring */
#define GC_REF_PERIOD_NS 1000000000ull /* a new reference every second: float ms stays sub-µs */
/* A reference is timed between the return of its record and that of the synchronisation after
 * it; a renewal whose window is wider than this is not used (the current reference stays) and is
 * tried again GC_REF_RETRY_NS later. */
#define GC_REF_SLACK_NS 200000ull
#define GC_REF_RETRY_NS 10000000ull
/* The thread's nap adapts to the rate samples complete: each wake takes CPU time from an
 * application that shares its core, so it sleeps as long as the pool allows: doubled while a
 * pass reads under 1/16 of the pool, back to the least at once when it reads over 1/4 (a burst
 * after an idle phase must not overflow the pool), within [GC_NAP_MIN_NS, GC_NAP_MAX_NS]. The
 * exit wakes it (a condition variable), so a long nap never delays or outlives the exit. */
#define GC_NAP_MIN_NS 1000000ull
#define GC_NAP_MAX_NS 16000000ull
/* Unless PYOBMEM_GPU_CLOCK_EVERY is set, the interval follows the GPU time its ops take. A
 * launch-bound program (a cuDNN LSTM: ~445 ops of ~10 us a step) got a sample every ~0.3 ms of GPU
 * time, each ~2.1 us of the application's thread (its cuEventRecord 1.76), 0.6% of its step. After
 * each pass the thread doubles the interval (up to GC_EVERY_MAX_FACTOR times the least, 32) when
 * it read at least GC_GAP_MIN_SEEN gaps between consecutive samples of a stream and each, scaled to
 * the interval in force, was under GC_GAP_SHORT_NS of GPU time, and halves it as soon as one
 * exceeds GC_GAP_LONG_NS. So samples stay ~1-2 ms of GPU time apart at most where 32 ops take less;
 * a program of ms-long ops (GPT medium: 45 samples in its 1,461-op iteration, a 32-op gap ~10 ms
 * of GPU time, one or two gaps a pass) keeps 32. */
#define GC_EVERY_MAX_FACTOR 8
#define GC_GAP_SHORT_NS 1000000ull
#define GC_GAP_LONG_NS 2000000ull
#define GC_GAP_MIN_SEEN 4

enum { SLOT_FREE = 0, SLOT_TAKEN = 1, SLOT_PENDING = 2 };
enum { CTX_EMPTY = 0, CTX_FILLING = 1, CTX_READY = 2, CTX_FAILED = 3 };

struct gc_slot {
    int state; /* atomic: SLOT_* */
    uint32_t ref;
    CUevent ev;
    uint64_t seq;
    uint64_t stream;
};

struct gc_ctx {
    int state; /* atomic: CTX_* */
    CUcontext ctx;
    CUstream own;
    uint32_t cursor; /* atomic */
    uint32_t cur_ref; /* atomic: index of the reference new samples use */
    CUevent ref_ev[GC_REFS];
    uint64_t ref_host[GC_REFS];
    int ref_live[GC_REFS];
    uint64_t ref_at;
    struct gc_slot *slots;
    uint64_t last_seq, last_stream; /* the thread's: the last sample it read, for the gaps */
    int64_t last_t;
};

/* The gaps between consecutive samples of a stream that one pass read (adaptive interval). */
struct gaps {
    unsigned n, short_, long_;
};

SHIM_TLS uint64_t shim_tls_op;

static uint64_t g_every_min, g_pool; /* PYOBMEM_GPU_CLOCK_EVERY (0: off), the pool's size */
static uint64_t g_every;      /* atomic: the interval in force */
static uint64_t g_every_most; /* the largest interval used (the NOTE's every_max) */
static int g_adaptive;        /* PYOBMEM_GPU_CLOCK_EVERY unset: the interval adapts */
static uint64_t g_nap_fixed_ns; /* PYOBMEM_GPU_CLOCK_POLL_US: a fixed nap; 0: adaptive */
static pthread_mutex_t g_nap_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_nap_cv; /* CLOCK_MONOTONIC; signalled by gpuclock_exit */
static struct gc_ctx g_ctx[GC_MAX_CTX];
static int g_thread; /* atomic: 0 not started, 1 running, -1 could not start */
static int g_stop, g_stopped; /* atomic */
static uint64_t g_samples, g_skipped; /* atomic */
static uint64_t g_refs, g_ref_rejects; /* atomic: references in use, renewals refused */
static int g_inited;

/* CUDA 12.8 added cuEventElapsedTime_v2 (same arguments); the first one is kept for older drivers. */
static pfn_cuEventElapsedTime g_elapsed;

static int have_driver(void)
{
    g_elapsed = real_cuEventElapsedTime_v2 ? real_cuEventElapsedTime_v2 : real_cuEventElapsedTime;
    return real_cuEventCreate && real_cuEventRecord && real_cuEventQuery && g_elapsed &&
           real_cuStreamSynchronize && real_cuStreamCreate && real_cuStreamGetCtx && real_cuStreamIsCapturing &&
           real_cuCtxGetCurrent && real_cuCtxPushCurrent_v2 && real_cuCtxPopCurrent_v2 &&
           real_cuThreadExchangeStreamCaptureMode;
}

static void nap_init(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&g_nap_cv, &a);
    pthread_condattr_destroy(&a);
}

/* Sleep ns, or less when the exit asks the thread to stop. */
static void nap(uint64_t ns)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    uint64_t t = (uint64_t)until.tv_nsec + ns;
    until.tv_sec += (time_t)(t / 1000000000ull);
    until.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&g_nap_mu);
    while (!__atomic_load_n(&g_stop, __ATOMIC_ACQUIRE) &&
           pthread_cond_timedwait(&g_nap_cv, &g_nap_mu, &until) == 0)
        ;
    pthread_mutex_unlock(&g_nap_mu);
}

void gpuclock_init(void)
{
    const char *e = getenv(PYOBMEM_ENV_GPU_CLOCK_EVERY);
    g_adaptive = !e || !*e;
    g_every = g_every_most = g_every_min = shim_env_u64(PYOBMEM_ENV_GPU_CLOCK_EVERY, GC_DEFAULT_EVERY, UINT32_MAX);
    uint64_t pool = shim_env_u64(PYOBMEM_ENV_GPU_CLOCK_POOL, GC_DEFAULT_POOL, GC_MAX_POOL);
    g_nap_fixed_ns = shim_env_u64(PYOBMEM_ENV_GPU_CLOCK_POLL_US, 0, GC_NAP_MAX_NS / 1000) * 1000;
    nap_init();
    g_pool = 1;
    while (g_pool < pool) /* a power of two: the cursor wraps with a mask */
        g_pool <<= 1;
    g_inited = 1;
    __atomic_store_n(&g_shim.gpuclock_next, g_every && have_driver() ? g_every : UINT64_MAX, __ATOMIC_RELEASE);
}

/* ---- the polling thread ---- */

/* A sample of c read (op seq, stream, GPU time t): its gap to the stream's last one, into g. */
static void gap_seen(struct gc_ctx *c, uint64_t seq, uint64_t stream, int64_t t, struct gaps *g)
{
    if (c->last_t && stream == c->last_stream && seq > c->last_seq && t > c->last_t) {
        uint64_t every = __atomic_load_n(&g_every, __ATOMIC_RELAXED);
        uint64_t scaled = (uint64_t)(t - c->last_t) / (seq - c->last_seq) * every;
        g->n++;
        g->short_ += scaled < GC_GAP_SHORT_NS;
        g->long_ += scaled > GC_GAP_LONG_NS;
    }
    c->last_seq = seq;
    c->last_stream = stream;
    c->last_t = t;
}

/* After a pass: the interval for the samples to come (adaptive only). */
static void adapt_every(const struct gaps *g)
{
    uint64_t e = __atomic_load_n(&g_every, __ATOMIC_RELAXED);
    if (g->long_ && e > g_every_min)
        e /= 2;
    else if (g->n >= GC_GAP_MIN_SEEN && g->short_ == g->n && e < g_every_min * GC_EVERY_MAX_FACTOR)
        e *= 2;
    else
        return;
    __atomic_store_n(&g_every, e, __ATOMIC_RELAXED);
    if (e > g_every_most)
        g_every_most = e;
}

/* Record reference i on the shim's idle stream and time it on the host; `first`: the context's
 * first reference, used however wide its window (there is no other). Why not the midpoint of the
 * whole call: while the application's launch queue is full, the record itself can wait in the
 * driver for tens of ms before it is issued, and that midpoint put GPT medium's GPU times up to
 * 52 ms (unswapped) and 258 ms (swap mode's first steps) before their own launches (session 10). */
static int ref_record(struct gc_ctx *c, uint32_t i, int first)
{
    if (real_cuEventRecord(c->ref_ev[i], c->own) != CUDA_SUCCESS)
        return 0;
    uint64_t t0 = shim_now_ns(); /* issued: the event runs after this */
    if (real_cuStreamSynchronize(c->own) != CUDA_SUCCESS)
        return 0;
    uint64_t t1 = shim_now_ns();
    if (!first && t1 - t0 > GC_REF_SLACK_NS) {
        __atomic_add_fetch(&g_ref_rejects, 1, __ATOMIC_RELAXED);
        c->ref_at = t1 - GC_REF_PERIOD_NS + GC_REF_RETRY_NS;
        return 0;
    }
    c->ref_host[i] = t0 + (t1 - t0) / 2;
    c->ref_live[i] = 1;
    c->ref_at = t1;
    __atomic_add_fetch(&g_refs, 1, __ATOMIC_RELAXED);
    return 1;
}

/* Pool, stream and first reference of a context (the thread, context pushed). */
static int ctx_setup(struct gc_ctx *c)
{
    if (real_cuStreamCreate(&c->own, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return 0;
    for (int i = 0; i < GC_REFS; i++)
        if (real_cuEventCreate(&c->ref_ev[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS)
            return 0;
    struct gc_slot *s = calloc(g_pool, sizeof *s);
    if (!s)
        return 0;
    for (uint64_t i = 0; i < g_pool; i++)
        if (real_cuEventCreate(&s[i].ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
            free(s); /* the events made so far belong to the context; it is not used again */
            return 0;
        }
    c->slots = s;
    return ref_record(c, 0, 1);
}

static void emit_sample(struct gc_ctx *c, struct gc_slot *s, struct gaps *g)
{
    float ms = 0;
    if (g_elapsed(&ms, c->ref_ev[s->ref], s->ev) != CUDA_SUCCESS || !(ms > -1e9f && ms < 1e9f))
        return;
    double ns = (double)ms * 1e6; /* rounded to the nearest ns without libm (the shim links none) */
    int64_t t = (int64_t)c->ref_host[s->ref] + (int64_t)(ns >= 0 ? ns + 0.5 : ns - 0.5);
    if (ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_GPU_TIME,
                                            .gpu_time = {.op = s->seq, .stream = s->stream, .t_gpu = t,
                                                         .context = (uint64_t)(uintptr_t)c->ctx}}, 1))
        __atomic_add_fetch(&g_samples, 1, __ATOMIC_RELAXED);
    if (g_adaptive)
        gap_seen(c, s->seq, s->stream, t, g);
}

/* One pass over a context's pending samples; a new reference when the current one is old.
 * Returns how many had completed (read and freed). */
static uint64_t ctx_poll(struct gc_ctx *c, uint64_t now, struct gaps *g)
{
    int used[GC_REFS] = {0};
    uint64_t ready = 0;
    for (uint64_t i = 0; i < g_pool; i++) {
        struct gc_slot *s = &c->slots[i];
        if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != SLOT_PENDING)
            continue;
        CUresult q = real_cuEventQuery(s->ev);
        if (q == CUDA_ERROR_NOT_READY) {
            used[s->ref] = 1;
            continue;
        }
        if (q == CUDA_SUCCESS)
            emit_sample(c, s, g);
        __atomic_store_n(&s->state, SLOT_FREE, __ATOMIC_RELEASE);
        ready++;
    }
    uint32_t cur = __atomic_load_n(&c->cur_ref, __ATOMIC_ACQUIRE);
    for (uint32_t r = 0; r < GC_REFS; r++)
        if (r != cur && !used[r])
            c->ref_live[r] = 0; /* no pending sample names it: free to record again */
    if (now - c->ref_at < GC_REF_PERIOD_NS)
        return ready;
    for (uint32_t r = 0; r < GC_REFS; r++)
        if (!c->ref_live[r]) {
            if (ref_record(c, r, 0))
                __atomic_store_n(&c->cur_ref, r, __ATOMIC_RELEASE);
            break;
        }
    return ready;
}

static uint64_t next_nap(uint64_t cur, uint64_t ready)
{
    if (g_nap_fixed_ns)
        return g_nap_fixed_ns;
    if (ready > g_pool / 4)
        return GC_NAP_MIN_NS;
    if (ready < g_pool / 16 && cur < GC_NAP_MAX_NS)
        return cur * 2;
    return cur;
}

static void *poller(void *arg)
{
    (void)arg;
    shim_tls_guard++; /* nothing this thread calls is the application's */
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    real_cuThreadExchangeStreamCaptureMode(&mode);
    uint64_t nap_ns = GC_NAP_MIN_NS;
    for (;;) {
        int last = __atomic_load_n(&g_stop, __ATOMIC_ACQUIRE);
        uint64_t now = shim_now_ns(), ready = 0;
        struct gaps gaps = {0};
        for (int i = 0; i < GC_MAX_CTX; i++) {
            struct gc_ctx *c = &g_ctx[i];
            if (__atomic_load_n(&c->state, __ATOMIC_ACQUIRE) != CTX_READY)
                continue;
            if (real_cuCtxPushCurrent_v2(c->ctx) != CUDA_SUCCESS) {
                __atomic_store_n(&c->state, CTX_FAILED, __ATOMIC_RELEASE);
                continue;
            }
            uint64_t n = ctx_poll(c, now, &gaps);
            ready = n > ready ? n : ready;
            CUcontext popped;
            real_cuCtxPopCurrent_v2(&popped);
        }
        if (last)
            break; /* one last pass after the stop: what completed by exit is written */
        if (g_adaptive)
            adapt_every(&gaps);
        nap_ns = next_nap(nap_ns, ready);
        nap(nap_ns);
    }
    uint64_t n = __atomic_load_n(&g_samples, __ATOMIC_RELAXED), k = __atomic_load_n(&g_skipped, __ATOMIC_RELAXED);
    ring_note(PYOBMEM_NOTE_GPU_CLOCK "=every=%llu every_max=%llu pool=%llu samples=%llu skipped=%llu refs=%llu "
              "ref_rejects=%llu",
              (unsigned long long)g_every_min, (unsigned long long)g_every_most, (unsigned long long)g_pool,
              (unsigned long long)n, (unsigned long long)k,
              (unsigned long long)__atomic_load_n(&g_refs, __ATOMIC_RELAXED),
              (unsigned long long)__atomic_load_n(&g_ref_rejects, __ATOMIC_RELAXED));
    __atomic_store_n(&g_stopped, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* At exit: stop the thread and let it finish its pass (bounded), before the driver goes away. */
static void gpuclock_exit(void)
{
    if (__atomic_load_n(&g_thread, __ATOMIC_ACQUIRE) != 1)
        return;
    pthread_mutex_lock(&g_nap_mu);
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
    pthread_cond_signal(&g_nap_cv);
    pthread_mutex_unlock(&g_nap_mu);
    struct timespec wait = {0, 100000};
    for (int i = 0; i < 2000 && !__atomic_load_n(&g_stopped, __ATOMIC_ACQUIRE); i++)
        nanosleep(&wait, NULL);
}

static void start_thread(void)
{
    int expect = 0;
    if (!__atomic_compare_exchange_n(&g_thread, &expect, -1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    pthread_attr_t attr;
    pthread_t t;
    if (pthread_attr_init(&attr) != 0)
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals never land on it */
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, poller, NULL) == 0) {
        __atomic_store_n(&g_thread, 1, __ATOMIC_RELEASE);
        atexit(gpuclock_exit);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* ---- the application's side ---- */

/* The context's entry, set up on first sight by the thread that saw it (once per context: a
 * stream, the pool's events and a reference event timed on that idle stream; the capture mode is
 * relaxed meanwhile so that a capture elsewhere is never invalidated). NULL: take no sample. */
static struct gc_ctx *ctx_of(CUcontext ctx)
{
    for (int i = 0; i < GC_MAX_CTX; i++) {
        struct gc_ctx *c = &g_ctx[i];
        int st = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
        if (st == CTX_EMPTY && __atomic_compare_exchange_n(&c->state, &st, CTX_FILLING, 0, __ATOMIC_ACQ_REL,
                                                           __ATOMIC_ACQUIRE)) {
            c->ctx = ctx;
            CUcontext cur = NULL, popped;
            int push = real_cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cur != ctx;
            int ok = !push || real_cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
            CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
            int relaxed = real_cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS;
            ok = ok && ctx_setup(c);
            if (relaxed)
                real_cuThreadExchangeStreamCaptureMode(&mode);
            if (push)
                real_cuCtxPopCurrent_v2(&popped);
            __atomic_store_n(&c->state, ok ? CTX_READY : CTX_FAILED, __ATOMIC_RELEASE);
            if (ok)
                start_thread();
            return ok ? c : NULL;
        }
        if (st == CTX_FILLING) /* another thread is setting this entry up */
            return NULL;
        if (c->ctx == ctx)
            return st == CTX_READY ? c : NULL;
    }
    return NULL;
}

void gpuclock_sample(uint64_t seq, CUstream s)
{
    uint64_t next = __atomic_load_n(&g_shim.gpuclock_next, __ATOMIC_RELAXED);
    uint64_t every = __atomic_load_n(&g_every, __ATOMIC_RELAXED);
    if (seq < next || !__atomic_compare_exchange_n(&g_shim.gpuclock_next, &next, seq + every, 0, __ATOMIC_RELAXED,
                                                  __ATOMIC_RELAXED))
        return; /* another thread took this one */
    ST_BEGIN(t0);
    shim_tls_guard++;
    CUcontext ctx = NULL;
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    struct gc_ctx *c = NULL;
    /* The capture query first: it is the one call made for a stream that may be capturing. */
    ST_BEGIN(t1);
    int idle = real_cuStreamIsCapturing(s, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_NONE;
    ST_END(t1, ST_GPUCLOCK_CAPTURING);
    if (idle) {
        ST_BEGIN(t2);
        int got = real_cuStreamGetCtx(s, &ctx) == CUDA_SUCCESS && ctx;
        ST_END(t2, ST_GPUCLOCK_CTX);
        if (got)
            c = ctx_of(ctx);
    }
    struct gc_slot *slot = NULL;
    if (c) {
        uint32_t i = __atomic_fetch_add(&c->cursor, 1, __ATOMIC_RELAXED) & (uint32_t)(g_pool - 1);
        int expect = SLOT_FREE;
        if (__atomic_compare_exchange_n(&c->slots[i].state, &expect, SLOT_TAKEN, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            slot = &c->slots[i];
    }
    if (slot) {
        slot->seq = seq;
        slot->stream = (uint64_t)(uintptr_t)s;
        slot->ref = __atomic_load_n(&c->cur_ref, __ATOMIC_ACQUIRE);
        ST_BEGIN(t3);
        int ok = real_cuEventRecord(slot->ev, s) == CUDA_SUCCESS;
        ST_END(t3, ST_GPUCLOCK_RECORD);
        __atomic_store_n(&slot->state, ok ? SLOT_PENDING : SLOT_FREE, __ATOMIC_RELEASE);
        if (!ok)
            slot = NULL;
    }
    if (!slot)
        __atomic_add_fetch(&g_skipped, 1, __ATOMIC_RELAXED);
    shim_tls_guard--;
    ST_END(t0, ST_GPUCLOCK_SAMPLE);
}

void gpuclock_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_nap_mu = fresh; /* the parent's poller may have held it at the fork */
    if (g_inited)
        nap_init();
    memset(g_ctx, 0, sizeof g_ctx);
    g_thread = 0;
    g_stop = g_stopped = 0;
    g_samples = g_skipped = g_refs = g_ref_rejects = 0;
    g_every = g_every_most = g_every_min;
    shim_tls_op = 0;
    if (g_inited)
        __atomic_store_n(&g_shim.gpuclock_next, g_every && have_driver() ? g_every : UINT64_MAX, __ATOMIC_RELEASE);
}
