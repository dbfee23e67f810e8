/*
 * The release thread of swap mode (swap_state.h): the physical memory of swap-outs whose copy
 * has completed goes back (or stays as a spare handle) without waiting for the next op.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "swap_state.h"

static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_releaser;      /* 1: started; -1: off (PYOBMEM_RELEASER=0, or it could not start) */
static int g_releaser_stop; /* set at exit: the thread makes no driver call after it */

/* A swap-out whose memory another block took (SBF_GIVEN; its SWAP_OUT record was written then),
 * its copy done: only its range is unmapped (the memory is the other block's, counted there).
 * Returns 0 when the unmap failed (tried again at the next poll). */
static int given_out(struct sblock *b)
{
    if (real_cuMemUnmap(b->addr, b->vsize) != CUDA_SUCCESS)
        return 0;
    b->handle = 0;
    b->flags &= ~SBF_GIVEN;
    b->state = SB_OUT;
    g_out_pending--;
    forget_uses(b);
    return 1;
}

/* Blocks freed while their range still mapped memory they had handed over (SBF_GIVEN), out of
 * the table: finished (free_finish) once their copy out has ended and the range is unmapped, so
 * that a cuMemFreeAsync never waits for that copy on the host. */
#define MAX_FREED 256
static struct sblock *g_freed[MAX_FREED];
static size_t g_nfreed;

int given_freed(struct sblock *b)
{
    if (g_nfreed == MAX_FREED)
        return 0;
    g_freed[g_nfreed++] = b;
    return 1;
}

void settle_handle(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; g_out_pending && i < g_tab.n; i++)
        if ((block_of(i)->flags & SBF_GIVEN) && block_of(i)->handle == h)
            settle_out(block_of(i));
    for (size_t i = 0; g_out_pending && i < g_nfreed; i++)
        if ((g_freed[i]->flags & SBF_GIVEN) && g_freed[i]->handle == h)
            settle_out(g_freed[i]); /* finished at the next poll */
}

void settle_out(struct sblock *b)
{
    if (b->state != SB_OUT_PENDING || !(b->flags & SBF_GIVEN))
        return;
    uint64_t t0 = shim_now_ns();
    real_cuEventSynchronize(b->copy_ev);
    g_waits.drain_ns += shim_now_ns() - t0;
    g_waits.drains++;
    given_out(b);
}

/* By the issue order of their last piece: a handoff issues a whole swap-out at once, between the
 * pieces of the one at the head of the queue (issue_now), so the first piece's order is not the
 * order they complete in. */
static int by_issue(const void *x, const void *y)
{
    uint64_t a = (*(struct sblock *const *)x)->out_seq, b = (*(struct sblock *const *)y)->out_seq;
    return (a > b) - (a < b);
}

/* OUT_PENDING blocks whose copy has completed: release their physical memory. Every swap-out is
 * on the one device-to-host stream, so they complete in issue order: the oldest is queried first
 * and the first still copying ends the poll: one cuEventQuery a poll, not one per swap-out in
 * flight (every op polls; GPT medium's forward pass keeps ~100 in flight). On the H200 this did
 * not move the step time (1.135 against 1.134 at 75%, session 10): the cost is the driver calls. */
void poll_releases(void)
{
    static struct sblock **pend;
    static size_t cap;
    size_t n = 0;
    int ordered = 1;
    for (size_t i = 0; i < g_tab.n && n < g_out_pending; i++) {
        struct sblock *b = block_of(i);
        if (b->state != SB_OUT_PENDING || b->queued)
            continue;
        if (n == cap) {
            size_t c = cap ? 2 * cap : 256;
            struct sblock **t = realloc(pend, c * sizeof *t);
            if (!t) {
                ordered = 0; /* no memory for the order: every one is queried, as it comes */
                break;
            }
            pend = t;
            cap = c;
        }
        pend[n++] = b;
    }
    if (ordered)
        qsort(pend, n, sizeof *pend, by_issue);
    for (size_t k = 0, i = 0; g_out_pending && (ordered ? k < n : i < g_tab.n); k++, i++) {
        struct sblock *b = ordered ? pend[k] : block_of(i);
        if (b->state != SB_OUT_PENDING || b->queued)
            continue;
        CUresult q = real_cuEventQuery(b->copy_ev);
        if (q == CUDA_ERROR_NOT_READY) {
            if (ordered)
                break; /* the later ones are behind it on the stream */
            continue;
        }
        if (b->flags & SBF_GIVEN) {
            given_out(b);
            continue;
        }
        g_leaving -= b->vsize; /* unmap_block_keep weighs the spare against the budget without it */
        CUresult u = q == CUDA_SUCCESS ? unmap_block_keep(b, 1) : q;
        g_leaving += b->vsize;
        if (u != CUDA_SUCCESS) {
            cancel_out(b); /* keep it resident; the host copy is dropped */
            continue;
        }
        b->state = SB_OUT;
        g_out_pending--;
        g_leaving -= b->vsize;
        forget_uses(b);
        emit_swap(PYOBMEM_EV_SWAP_OUT, b->out_cause, b, shim_now_ns() - b->t_issue);
    }
    for (size_t i = g_nfreed; i-- > 0;) {
        struct sblock *b = g_freed[i];
        if ((b->flags & SBF_GIVEN) && (real_cuEventQuery(b->copy_ev) == CUDA_ERROR_NOT_READY || !given_out(b)))
            continue;
        g_freed[i] = g_freed[--g_nfreed];
        free_finish(b);
    }
    issue_outs(0); /* the copy engine has room for more */
}

/* The release thread: while swap-outs are in flight it polls their copy events every 100 us and
 * releases the memory of those done. Without it a block is released at the first op the host
 * issues after its copy ends, and a host waiting in loss.item() at the end of an iteration
 * issues none: the memory of everything swapped out during the backward pass would stay mapped
 * until the next iteration. It never waits in the driver (cuEventQuery only), runs with the
 * RELAXED capture mode, and stops calling the driver at exit. */
static void *releaser(void *arg)
{
    (void)arg;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    real_cuThreadExchangeStreamCaptureMode(&mode);
    struct timespec nap = {0, 100000};
    pthread_mutex_lock(&g_mu);
    int pushed = ctx_enter();
    while (!g_releaser_stop) {
        if (!g_out_pending) {
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        uint64_t t0 = shim_now_ns();
        poll_releases();
        g_waits.releaser_ns += shim_now_ns() - t0;
        g_waits.releaser_polls++;
        pthread_mutex_unlock(&g_mu);
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&g_mu);
    }
    (void)pushed; /* the context stays current on this thread until the process ends */
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

static void releaser_exit(void)
{
    if (g_releaser <= 0) /* a fork child inherits the handler, not the thread */
        return;
    pthread_mutex_lock(&g_mu);
    g_releaser_stop = 1;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* Start the thread at the first swap-out (g_mu held); wake it at every one. */
void releaser_kick(void)
{
    if (!g_releaser) {
        const char *env = getenv(PYOBMEM_ENV_RELEASER);
        pthread_t t;
        pthread_attr_t attr;
        g_releaser = -1;
        if ((!env || strcmp(env, "0") != 0) && pthread_attr_init(&attr) == 0) {
            sigset_t all, old;
            sigfillset(&all);
            pthread_sigmask(SIG_SETMASK, &all, &old); /* the application's signals never land on it */
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            if (pthread_create(&t, &attr, releaser, NULL) == 0) {
                g_releaser = 1;
                atexit(releaser_exit);
            }
            pthread_sigmask(SIG_SETMASK, &old, NULL);
            pthread_attr_destroy(&attr);
        }
    }
    if (g_releaser > 0)
        pthread_cond_signal(&g_cv);
}

void drain_until(uint64_t need, uint64_t budget)
{
    issue_outs(1); /* the memory is needed now: every queued copy goes to the engine */
    while (g_out_pending && resident_bytes() + g_leaving + need > budget) {
        struct sblock *oldest = NULL;
        for (size_t i = 0; i < g_tab.n; i++) {
            struct sblock *b = block_of(i);
            if (b->state == SB_OUT_PENDING && !(b->flags & SBF_GIVEN) && (!oldest || b->out_seq < oldest->out_seq))
                oldest = b;
        }
        if (!oldest)
            break;
        uint64_t t0 = shim_now_ns();
        CUresult r = real_cuEventSynchronize(oldest->copy_ev);
        g_waits.drain_ns += shim_now_ns() - t0;
        g_waits.drains++;
        unsigned before = g_out_pending;
        poll_releases();
        if (r != CUDA_SUCCESS || g_out_pending == before)
            break; /* nothing released (an unmap failed): no busy loop */
    }
}

/* Finish every swap-out in flight (synchronise the device-to-host stream only) and release. */
void drain_outs(void)
{
    if (!g_out_pending)
        return;
    issue_outs(1);
    uint64_t t0 = shim_now_ns();
    CUresult r = real_cuStreamSynchronize(g_d2h);
    g_waits.drain_ns += shim_now_ns() - t0;
    g_waits.drains++;
    if (r == CUDA_SUCCESS)
        poll_releases();
}

int releaser_running(void) { return g_releaser > 0; }

void releaser_atfork_child(void)
{
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    g_cv = cv;
    g_releaser = -1; /* no thread in the child, and none to start */
}
