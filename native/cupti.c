/*
 * The CUPTI subscriber: opt-in (pyobmem-run --cupti; PYOBMEM_CUPTI set to "1" or a path). By
 * default launches are traced from the shim's own hooks, which attribute every launch at lower
 * cost, and CUPTI stays free for torch.profiler/Kineto, Nsight and other tools of the process.
 *
 * When asked for, after the first successful cuInit libcupti is dlopen'ed and subscribed to
 * exactly the launch callback ids; the API_EXIT callback of a launch that succeeded runs the same
 * record_launch() as the hooks, flagged VIA_CUPTI, and the launch hooks stop recording (no double
 * count). Graph launches stay with their hook. CUPTI allows one subscriber per process: when it
 * is taken (Nsight, compute-sanitizer, a profiler), libcupti is missing or any CUPTI call fails,
 * the shim says so once in a NOTE naming the library's path, its version and the error, and
 * keeps recording from its hooks (C05, C25).
 *
 * libcupti is found, in order: one already mapped in the process under a known soname (a
 * framework's, C25: never a second copy), else $PYOBMEM_CUPTI when it is a path (an explicit
 * path is not silently replaced by another library), else ("1") libcupti.so.13, .12,
 * libcupti.so, $CUDA_HOME/lib64/libcupti.so, /usr/local/cuda/lib64/libcupti.so,
 * /usr/local/cuda/extras/CUPTI/lib64/libcupti.so. CUPTI is only called through dlsym'ed
 * pointers; the headers give the callback ids and the parameter structs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#include <cupti_callbacks.h>
#include <cupti_driver_cbid.h>
#include <generated_cuda_meta.h>

typedef CUptiResult(CUPTIAPI *subscribe_fn)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult(CUPTIAPI *enable_fn)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
typedef CUptiResult(CUPTIAPI *unsubscribe_fn)(CUpti_SubscriberHandle);
typedef CUptiResult(CUPTIAPI *result_string_fn)(CUptiResult, const char **);

static const CUpti_CallbackId g_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,          CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
};

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

/* A launch as a callback sees it (decode). */
struct cupti_launch {
    uintptr_t f;
    CUstream s;
    int per_thread;
    uint64_t grid;
    void **kp, **extra;
    uint16_t flags;
};

/* The launch a callback is about (the one switch over the callback ids, for both paths); 0: none.
 * The _ptsz params have the fields of the plain ones in the same order (asserted below). */
static int decode(CUpti_CallbackId cbid, const void *params, struct cupti_launch *l)
{
    memset(l, 0, sizeof *l);
    l->flags = PYOBMEM_LAUNCH_VIA_CUPTI;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        l->per_thread = 1;
        /* fallthrough */
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel: {
        const cuLaunchKernel_params *p = params;
        *l = (struct cupti_launch){(uintptr_t)p->f, p->hStream, l->per_thread, GRID(p->gridDimX, p->gridDimY, p->gridDimZ),
                                   p->kernelParams, p->extra, l->flags};
        return 1;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
        l->per_thread = 1;
        /* fallthrough */
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx: {
        const cuLaunchKernelEx_params *p = params;
        if (!p->config)
            return 0;
        *l = (struct cupti_launch){(uintptr_t)p->f, p->config->hStream, l->per_thread,
                                   GRID(p->config->gridDimX, p->config->gridDimY, p->config->gridDimZ), p->kernelParams,
                                   p->extra, (uint16_t)(l->flags | launch_config_flags(p->config))};
        return 1;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        l->per_thread = 1;
        /* fallthrough */
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel: {
        const cuLaunchCooperativeKernel_params *p = params;
        *l = (struct cupti_launch){(uintptr_t)p->f, p->hStream, l->per_thread, GRID(p->gridDimX, p->gridDimY, p->gridDimZ),
                                   p->kernelParams, NULL, (uint16_t)(l->flags | PYOBMEM_LAUNCH_COOPERATIVE)};
        return 1;
    }
    default:
        return 0;
    }
}

/* Swap mode: the launch path runs at API_ENTER (blocks back, waits) and API_EXIT (record,
 * last-use events, planned swap-outs), with the scan carried between them in this thread. A
 * callback cannot refuse the launch: if a block cannot be brought back, the launch still runs
 * (noted once by the executor). */
static __thread struct launch_swap tls_launch;
static __thread int tls_launch_open;

static void swap_callback(CUpti_CallbackId cbid, const CUpti_CallbackData *d)
{
    struct cupti_launch l;
    if (!decode(cbid, d->functionParams, &l))
        return;
    if (d->callbackSite == CUPTI_API_ENTER) {
        tls_launch_open = 0;
        if (!shim_begin())
            return;
        tls_launch_open = launch_swap_begin(&tls_launch, l.f, swap_norm_stream(l.s, l.per_thread), l.kp, l.extra,
                                            l.flags) == CUDA_SUCCESS;
    } else if (d->callbackSite == CUPTI_API_EXIT && tls_launch_open) {
        tls_launch_open = 0;
        CUresult r = d->functionReturnValue ? *(const CUresult *)d->functionReturnValue : CUDA_ERROR_UNKNOWN;
        launch_swap_end(&tls_launch, l.f, (uint64_t)(uintptr_t)l.s, l.grid, r);
    }
}

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *cbdata)
{
    (void)userdata;
    const CUpti_CallbackData *d = cbdata;
    if (SHIM_UNLIKELY(g_shim.swap)) {
        if (domain == CUPTI_CB_DOMAIN_DRIVER_API && d && d->functionParams)
            swap_callback(cbid, d);
        return;
    }
    /* At exit, so that a launch the driver refused is not recorded (as the hooks do). */
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || !d || d->callbackSite != CUPTI_API_EXIT || !d->functionParams ||
        !d->functionReturnValue || *(const CUresult *)d->functionReturnValue != CUDA_SUCCESS)
        return;
    if (!shim_begin())
        return;
    struct cupti_launch l;
    if (decode(cbid, d->functionParams, &l))
        record_launch(l.f, (uint64_t)(uintptr_t)l.s, l.grid, l.kp, l.extra, l.flags);
}

_Static_assert(sizeof(cuLaunchKernel_params) == sizeof(cuLaunchKernel_ptsz_params), "ptsz params layout");
_Static_assert(sizeof(cuLaunchKernelEx_params) == sizeof(cuLaunchKernelEx_ptsz_params), "ptsz params layout");
_Static_assert(sizeof(cuLaunchCooperativeKernel_params) == sizeof(cuLaunchCooperativeKernel_ptsz_params),
               "ptsz params layout");

/* Sonames a framework or profiler loads libcupti under: one already mapped is reused (C25). */
static const char *const g_sonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};

static void *open_cupti(const char *env, const char **why)
{
    for (size_t i = 0; i < sizeof g_sonames / sizeof g_sonames[0]; i++) {
        void *h = dlopen(g_sonames[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        if (h)
            return h;
    }
    if (strcmp(env, "1") != 0) {
        void *h = dlopen(env, RTLD_NOW | RTLD_LOCAL);
        *why = "PYOBMEM_CUPTI library could not be loaded";
        return h;
    }
    char cuda_home[4096] = "";
    const char *ch = getenv("CUDA_HOME");
    if (ch && *ch)
        snprintf(cuda_home, sizeof cuda_home, "%s/lib64/libcupti.so", ch);
    const char *candidates[] = {
        "libcupti.so.13", "libcupti.so.12", "libcupti.so", cuda_home[0] ? cuda_home : NULL,
        "/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
    };
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        if (!candidates[i])
            continue;
        void *h = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    *why = "libcupti not found";
    return NULL;
}

/* "PATH (CUPTI version V)" of an opened libcupti, for the one line that says what happened. */
static void describe(void *lib, char *buf, size_t n)
{
    struct link_map *lm = NULL;
    const char *path = dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0] ? lm->l_name : "libcupti";
    typedef CUptiResult(CUPTIAPI * version_fn)(uint32_t *);
    version_fn ver = (version_fn)dlsym(lib, "cuptiGetVersion");
    uint32_t v = 0;
    if (ver && ver(&v) == CUPTI_SUCCESS)
        snprintf(buf, n, "%s (CUPTI version %u)", path, v);
    else
        snprintf(buf, n, "%s (CUPTI version unknown)", path);
}

static const char *result_name(void *lib, CUptiResult r, char *buf, size_t n)
{
    result_string_fn rs = (result_string_fn)dlsym(lib, "cuptiGetResultString");
    const char *s = NULL;
    if (rs && rs(r, &s) == CUPTI_SUCCESS && s)
        return s;
    snprintf(buf, n, "CUptiResult %d", (int)r);
    return buf;
}

void cupti_start(void)
{
    const char *env = getenv(PYOBMEM_ENV_CUPTI);
    if (!env || !*env || strcmp(env, "0") == 0) {
        ring_note(PYOBMEM_NOTE_CUPTI "=off (the default; --cupti subscribes)");
        return;
    }
    const char *why = "unknown";
    char buf[64], lib_text[256];
    void *lib = open_cupti(env, &why);
    if (!lib) {
        ring_note(PYOBMEM_NOTE_CUPTI "=unavailable: %s", why);
        return;
    }
    describe(lib, lib_text, sizeof lib_text);
    subscribe_fn sub = (subscribe_fn)dlsym(lib, "cuptiSubscribe");
    enable_fn enable = (enable_fn)dlsym(lib, "cuptiEnableCallback");
    unsubscribe_fn unsub = (unsubscribe_fn)dlsym(lib, "cuptiUnsubscribe");
    if (!sub || !enable) {
        ring_note(PYOBMEM_NOTE_CUPTI "=unavailable: %s: cuptiSubscribe/cuptiEnableCallback missing", lib_text);
        return;
    }
    CUpti_SubscriberHandle h = NULL;
    CUptiResult r = sub(&h, on_callback, NULL);
    if (r != CUPTI_SUCCESS) {
        ring_note(PYOBMEM_NOTE_CUPTI "=unavailable: %s: cuptiSubscribe: %s", lib_text, result_name(lib, r, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < sizeof g_cbids / sizeof g_cbids[0]; i++) {
        r = enable(1, h, CUPTI_CB_DOMAIN_DRIVER_API, g_cbids[i]);
        if (r != CUPTI_SUCCESS) {
            if (unsub)
                unsub(h);
            ring_note(PYOBMEM_NOTE_CUPTI "=unavailable: %s: cuptiEnableCallback: %s", lib_text, result_name(lib, r, buf, sizeof buf));
            return;
        }
    }
    __atomic_store_n(&g_shim.cupti_active, 1, __ATOMIC_RELEASE);
    ring_note(PYOBMEM_NOTE_CUPTI "=active: %s", lib_text);
}
