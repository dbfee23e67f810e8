/*
 * Kernel parameter layouts, cached per function handle.
 *
 * Querying a layout costs driver calls (about 17 us per launch on the H200), so each handle is
 * queried once: cuFuncGetParamInfo first, then cuKernelGetParamInfo (runtime launches pass a
 * CUkernel cast to CUfunction), iterating paramIndex until CUDA_ERROR_INVALID_VALUE. Failures
 * are cached too. The first sight of a handle also emits its KERNEL_NAME records. Each known layout
 * also keeps one byte per 8-byte argument word: what the driver said of an address there (launch.c).
 *
 * The cache is an open-addressing hash read without locks: an inserter (under a mutex) fills
 * the entry's layout, then publishes the key with a release store; a reader that sees the key
 * with an acquire load sees the layout. Entries are never removed. When the table is 3/4 full,
 * new handles are no longer cached or queried: their launches are NO_LAYOUT.
 *
 * A handle is not forever: after a module or library is unloaded the driver may hand the freed
 * address out again for another kernel (XLA's autotuner loads and unloads candidate kernels by
 * the hundred), and a stale layout would read past that kernel's argument array, as far as a
 * segmentation fault (seen under JAX on the H200). So every call that hands out a function or
 * kernel handle (cuModuleGetFunction, cuModuleEnumerateFunctions, cuLibraryGetKernel,
 * cuLibraryEnumerateKernels, cuKernelGetFunction) queries a cached handle again
 * (params_refresh) if a handle may have been freed since it was queried: the calls that free
 * handles (cuModuleUnload, cuLibraryUnload, context destruction) advance an epoch. A changed
 * layout replaces the cached one, whose memory is kept for a launch on another thread that may
 * still read it. The epoch matters for cost: cuDNN's LSTM asks for its kernels' handles ~180
 * times a step, and querying each again cost 2.2 µs (12% of a launch-bound step on the H200).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define CACHE_BITS 16
#define CACHE_SIZE (1u << CACHE_BITS)
#define CACHE_LIMIT (CACHE_SIZE / 4 * 3)
#define MAX_PARAMS 8192 /* 32 KiB of parameters at 4 bytes each: more than the driver allows */

struct entry {
    uintptr_t key; /* atomic; 0 = empty */
    struct param_layout *layout;
};

static struct entry g_table[CACHE_SIZE];
static uint32_t g_used;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct param_layout g_unknown = {0};

static inline uint32_t slot_of(uintptr_t h)
{
    uint64_t x = (uint64_t)h * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(x >> (64 - CACHE_BITS));
}

typedef CUresult (*param_info_fn)(void *handle, size_t index, size_t *offset, size_t *size);

/* Query the layout with one of the two entry points. Returns 1 on success (count may be 0). */
static int query(param_info_fn fn, uintptr_t handle, struct param_layout *out)
{
    uint32_t cap = 0, n = 0;
    uint32_t *off = NULL, *sz = NULL;
    for (;;) {
        size_t o = 0, s = 0;
        CUresult r = fn((void *)handle, n, &o, &s);
        if (r == CUDA_ERROR_INVALID_VALUE)
            break; /* past the last parameter (or a kernel without parameters) */
        if (r != CUDA_SUCCESS || n >= MAX_PARAMS) {
            free(off);
            free(sz);
            return 0;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *no = realloc(off, cap * sizeof *no);
            if (no)
                off = no;
            uint32_t *ns = no ? realloc(sz, cap * sizeof *ns) : NULL;
            if (!no || !ns) {
                free(off);
                free(sz);
                return 0;
            }
            sz = ns;
        }
        off[n] = (uint32_t)o;
        sz[n] = (uint32_t)s;
        n++;
    }
    out->known = 1;
    out->count = n;
    out->offset = off;
    out->size = sz;
    return 1;
}

static CUresult func_info(void *h, size_t i, size_t *o, size_t *s)
{
    return real_cuFuncGetParamInfo((CUfunction)h, i, o, s);
}

static CUresult kernel_info(void *h, size_t i, size_t *o, size_t *s)
{
    return real_cuKernelGetParamInfo((CUkernel)h, i, o, s);
}

/* The KERNEL_NAME records of a handle (cuFuncGetName, else cuKernelGetName). */
static void first_sight_name(uintptr_t handle)
{
    const char *name = NULL;
    if (!(real_cuFuncGetName && real_cuFuncGetName(&name, (CUfunction)handle) == CUDA_SUCCESS && name))
        if (!(real_cuKernelGetName && real_cuKernelGetName(&name, (CUkernel)handle) == CUDA_SUCCESS && name))
            name = NULL;
    if (name)
        ring_text(PYOBMEM_EV_KERNEL_NAME, handle, name);
}

/* The queried layout q in one allocation with its scan list, arrays and slots (freed with free();
 * q's arrays are freed): a launch reads the layout, the scan list and the slots, on one or two cache
 * lines for a kernel of a few parameters instead of several separate ones. NULL: out of memory. */
static struct param_layout *packed(struct param_layout *q)
{
    uint32_t end = 0, n_scan = 0, k0;
    for (uint32_t i = 0; i < q->count; i++) {
        if (q->offset[i] + q->size[i] > end)
            end = q->offset[i] + q->size[i];
        n_scan += param_word_range(q->offset[i], q->size[i], &k0) > 0;
    }
    uint32_t n_slots = q->known && q->count > 0 ? (end + 7) / 8 : 0;
    size_t arrays = (size_t)q->count * sizeof *q->offset, scans = (size_t)n_scan * sizeof(struct param_scan);
    struct param_layout *l = calloc(1, sizeof *l + scans + 2 * arrays + n_slots);
    if (l) {
        *l = *q;
        struct param_scan *scan = (struct param_scan *)(l + 1);
        l->offset = (uint32_t *)(scan + n_scan);
        l->size = l->offset + q->count;
        if (arrays) {
            memcpy(l->offset, q->offset, arrays);
            memcpy(l->size, q->size, arrays);
        }
        for (uint32_t i = 0, k = 0; i < q->count; i++) {
            uint32_t n = param_word_range(q->offset[i], q->size[i], &k0);
            if (n)
                scan[k++] = (struct param_scan){.index = i, .offset = q->offset[i], .end = q->offset[i] + q->size[i],
                                                .k0 = k0, .n = n, .slot0 = (q->offset[i] + k0) / 8};
        }
        l->n_scan = n_scan;
        l->scan = scan;
        l->n_slots = n_slots;
        l->slots = n_slots ? (uint8_t *)(l->size + q->count) : NULL; /* zero: SLOT_UNASKED */
    }
    free(q->offset);
    free(q->size);
    return l;
}

static struct param_layout *first_sight(uintptr_t handle, int emit_name)
{
    struct param_layout q = {0};
    uint64_t epoch = __atomic_load_n(&g_shim.handle_epoch, __ATOMIC_ACQUIRE); /* before the queries */
    struct param_layout viaf = {0}, viak = {0};
    int okf = real_cuFuncGetParamInfo && query(func_info, handle, &viaf);
    if (okf && viaf.count > 0) {
        q = viaf;
    } else {
        /* Failed, or zero parameters, which is also what a CUkernel looks like through the
         * CUfunction entry point on some drivers: ask the CUkernel one. */
        int okk = real_cuKernelGetParamInfo && query(kernel_info, handle, &viak);
        if (okk && (viak.count > 0 || !okf))
            q = viak;
        else if (okf)
            q = viaf;
        if (q.offset != viaf.offset) {
            free(viaf.offset);
            free(viaf.size);
        }
        if (q.offset != viak.offset) {
            free(viak.offset);
            free(viak.size);
        }
    }
    struct param_layout *l = packed(&q);
    if (!l)
        return NULL;
    if (emit_name)
        first_sight_name(handle);
    l->epoch = epoch;
    return l;
}

static const struct param_layout *find(uintptr_t handle)
{
    for (uint32_t i = slot_of(handle), k = 0; k < CACHE_SIZE; i = (i + 1) & (CACHE_SIZE - 1), k++) {
        uintptr_t key = __atomic_load_n(&g_table[i].key, __ATOMIC_ACQUIRE);
        if (key == handle)
            return __atomic_load_n(&g_table[i].layout, __ATOMIC_ACQUIRE);
        if (key == 0)
            return NULL;
    }
    return NULL;
}

void params_prefetch(uintptr_t handle)
{
    const struct entry *e = &g_table[slot_of(handle)]; /* its first slot: where nearly every handle is */
    if (__atomic_load_n(&e->key, __ATOMIC_ACQUIRE) == handle) {
        const char *l = (const char *)__atomic_load_n(&e->layout, __ATOMIC_ACQUIRE);
        __builtin_prefetch(l);
        __builtin_prefetch(l + 64); /* the offsets, sizes and slots of a few parameters */
    }
}

const struct param_layout *params_get(uintptr_t handle)
{
    if (!handle)
        return &g_unknown;
    const struct param_layout *l = find(handle);
    if (SHIM_LIKELY(l != NULL))
        return l;
    pthread_mutex_lock(&g_mu);
    l = find(handle);
    if (!l && g_used < CACHE_LIMIT) {
        struct param_layout *nl = first_sight(handle, 1);
        if (nl) {
            uint32_t i = slot_of(handle);
            while (g_table[i].key != 0)
                i = (i + 1) & (CACHE_SIZE - 1);
            g_table[i].layout = nl;
            __atomic_store_n(&g_table[i].key, handle, __ATOMIC_RELEASE);
            g_used++;
            l = nl;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return l ? l : &g_unknown;
}

static int same_layout(const struct param_layout *a, const struct param_layout *b)
{
    return a->known == b->known && a->count == b->count &&
           (!a->count || (!memcmp(a->offset, b->offset, a->count * sizeof *a->offset) &&
                          !memcmp(a->size, b->size, a->count * sizeof *a->size)));
}

/* params_refresh once some call freed handles (epoch > 0). */
static __attribute__((noinline)) void refresh_since(uintptr_t handle, uint64_t epoch)
{
    const struct param_layout *cur = find(handle);
    if (!cur || __atomic_load_n(&cur->epoch, __ATOMIC_ACQUIRE) == epoch)
        return; /* not cached (its first launch queries it), or nothing was freed since */
    pthread_mutex_lock(&g_mu);
    for (uint32_t i = slot_of(handle), k = 0; k < CACHE_SIZE; i = (i + 1) & (CACHE_SIZE - 1), k++) {
        uintptr_t key = __atomic_load_n(&g_table[i].key, __ATOMIC_ACQUIRE);
        if (key == 0)
            break; /* not cached: its first launch queries it */
        if (key != handle)
            continue;
        if (__atomic_load_n(&g_table[i].layout->epoch, __ATOMIC_ACQUIRE) == __atomic_load_n(&g_shim.handle_epoch, __ATOMIC_ACQUIRE))
            break; /* another thread queried it meanwhile */
        struct param_layout *nl = first_sight(handle, 0);
        if (nl && same_layout(nl, g_table[i].layout)) {
            __atomic_store_n(&g_table[i].layout->epoch, nl->epoch, __ATOMIC_RELEASE);
            free(nl); /* the same kernel handed out again (one allocation: packed) */
        } else if (nl) {
            first_sight_name(handle);
            __atomic_store_n(&g_table[i].layout, nl, __ATOMIC_RELEASE);
        }
        break;
    }
    pthread_mutex_unlock(&g_mu);
}

/* A cached handle the driver handed out again: query its layout again if a module, library or
 * context was freed since it was last queried (the address may be another kernel's now). Epoch 0:
 * no call that frees handles has run, every cached layout is current: one load, of the line
 * shim_begin read (no probe of the table: a cache miss, and the layout's another). cuDNN asks ~180
 * times a step. */
static inline void params_refresh(uintptr_t handle)
{
    if (!handle)
        return;
    ST_BEGIN(t0);
    uint64_t epoch = __atomic_load_n(&g_shim.handle_epoch, __ATOMIC_ACQUIRE);
    if (SHIM_UNLIKELY(epoch))
        refresh_since(handle, epoch);
    ST_END(t0, ST_PARAMS_REFRESH);
}

/* ---- the calls that hand out function and kernel handles: N of them at OUT ---- */

#define DEF_GETTER(NAME, PARAMS, ARGS, OUT, N)                             \
    CUresult CUDAAPI NAME PARAMS                                           \
    {                                                                      \
        int rec = shim_begin();                                            \
        CUresult r = REAL(NAME, ARGS);                                     \
        if (rec && r == CUDA_SUCCESS && (OUT))                             \
            for (unsigned i_ = 0; i_ < (unsigned)(N); i_++)                \
                params_refresh((uintptr_t)(OUT)[i_]);                      \
        return r;                                                          \
    }
DEF_GETTER(cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name), (hfunc, hmod, name), hfunc, 1)
DEF_GETTER(cuModuleEnumerateFunctions, (CUfunction *functions, unsigned int numFunctions, CUmodule mod),
           (functions, numFunctions, mod), functions, numFunctions)
DEF_GETTER(cuLibraryGetKernel, (CUkernel *pKernel, CUlibrary library, const char *name), (pKernel, library, name),
           pKernel, 1)
DEF_GETTER(cuLibraryEnumerateKernels, (CUkernel *kernels, unsigned int numKernels, CUlibrary lib),
           (kernels, numKernels, lib), kernels, numKernels)
DEF_GETTER(cuKernelGetFunction, (CUfunction *pFunc, CUkernel kernel), (pFunc, kernel), pFunc, 1)

/* ---- the calls that free handles: the epoch advances before (a getter racing with the call
 * queries again) and after (one that ran during it, before the handles were gone, too) ---- */

#define DEF_FREER(NAME, PARAMS, ARGS)                           \
    CUresult CUDAAPI NAME PARAMS                                \
    {                                                           \
        shim_init_once();                                       \
        __atomic_add_fetch(&g_shim.handle_epoch, 1, __ATOMIC_ACQ_REL);      \
        CUresult r = REAL(NAME, ARGS);                          \
        __atomic_add_fetch(&g_shim.handle_epoch, 1, __ATOMIC_ACQ_REL);      \
        return r;                                               \
    }
DEF_FREER(cuModuleUnload, (CUmodule hmod), (hmod))
DEF_FREER(cuLibraryUnload, (CUlibrary library), (library))
DEF_FREER(cuCtxDestroy_v2, (CUcontext ctx), (ctx))
DEF_FREER(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))
DEF_FREER(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))
DEF_FREER(cuCtxDestroy, (CUcontext ctx), (ctx))
DEF_FREER(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev))
DEF_FREER(cuDevicePrimaryCtxReset, (CUdevice dev), (dev))
DEF_FREER(cuCtxDetach, (CUcontext ctx), (ctx))
DEF_FREER(cuGreenCtxDestroy, (CUgreenCtx hCtx), (hCtx))

void params_atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
void params_atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
void params_atfork_child(void)
{
    /* Handles of the parent's context mean nothing in the child, and kernel names are per
     * process in the capture: start empty (the parent's layouts are left allocated). */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_mu = fresh;
    if (g_used) {
        memset(g_table, 0, sizeof g_table);
        g_used = 0;
    }
}
