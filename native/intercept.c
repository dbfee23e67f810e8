/*
 * Interception: lazy initialisation, the real-function table, cuInit, cuGetProcAddress(_v2)
 * and dlsym. Everything here that lists hooked functions is generated from hooks.def.
 *
 * How calls reach the wrappers:
 *   - exported symbols with the driver's versioned names (an app linked with -lcuda);
 *   - cuGetProcAddress/_v2: the real one answers first; if the pointer it hands out is the
 *     real pointer of a hooks.def entry, ours replaces it. The answer depends on the name, the
 *     requested version and the flags, and only the driver knows the mapping, so nothing is
 *     cached by name: the pointer decides;
 *   - dlsym: a hooks.def name whose real result lives in libcuda gets our wrapper.
 * dlopen is never interposed (C19).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shim.h"

struct shim_state g_shim = {.gpuclock_next = UINT64_MAX};
SHIM_TLS int shim_tls_guard;

#define HOOK(ret, name, params, args) pfn_##name real_##name;
#define CALL(ret, name, params) pfn_##name real_##name;
#include "hooks.def"

struct hook_entry {
    const char *name;
    void *hook;   /* our wrapper */
    void **real;  /* where the real pointer lives */
};

static const struct hook_entry g_hooks[] = {
#define HOOK(ret, name, params, args) {#name, (void *)&name, (void **)&real_##name},
#include "hooks.def"
};
#define N_HOOKS (sizeof g_hooks / sizeof g_hooks[0])

static const struct {
    const char *name;
    void **real;
} g_calls[] = {
#define CALL(ret, name, params) {#name, (void **)&real_##name},
#include "hooks.def"
};

/* ---- the real dlsym ---- */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;

static dlsym_fn real_dlsym(void)
{
    dlsym_fn f = __atomic_load_n(&g_real_dlsym, __ATOMIC_ACQUIRE);
    if (SHIM_UNLIKELY(!f)) {
        f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!f)
            f = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        __atomic_store_n(&g_real_dlsym, f, __ATOMIC_RELEASE);
    }
    return f;
}

/* ---- initialisation ---- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void atfork_prepare(void)
{
    swap_atfork_prepare();
    params_atfork_prepare();
    graphs_atfork_prepare();
    graph_conds_atfork_prepare();
    host_alias_atfork_prepare();
    blocks_atfork_prepare();
}

static void atfork_parent(void)
{
    blocks_atfork_parent();
    host_alias_atfork_parent();
    graphs_atfork_parent();
    graph_conds_atfork_parent();
    params_atfork_parent();
    swap_atfork_parent();
}

static void atfork_child(void)
{
    blocks_reset_after_fork();
    host_alias_atfork_child();
    graphs_atfork_child();
    graph_conds_atfork_child();
    params_atfork_child();
    swap_atfork_child();
    gpuclock_atfork_child();
    ring_reset_after_fork();
    g_shim.ppid = g_shim.pid;
    g_shim.pid = (uint32_t)getpid();
    g_shim.op_seq = 0;
    g_shim.cuinit_done = 0;
    __atomic_store_n(&g_shim.need_process, 1, __ATOMIC_RELEASE);
}

static void shim_init(void)
{
    shim_tls_guard++;
    g_shim.pid = (uint32_t)getpid();
    g_shim.ppid = (uint32_t)getppid();
    const char *dis = getenv(PYOBMEM_ENV_DISABLE);
    g_shim.disabled = dis && strcmp(dis, "1") == 0;

    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    g_shim.libcuda = h;
    dlsym_fn ds = real_dlsym();
    if (h && ds) {
        for (size_t i = 0; i < N_HOOKS; i++)
            *g_hooks[i].real = ds(h, g_hooks[i].name);
        for (size_t i = 0; i < sizeof g_calls / sizeof g_calls[0]; i++)
            *g_calls[i].real = ds(h, g_calls[i].name);
    }
    if (h && !g_shim.disabled && ring_open(getenv(PYOBMEM_ENV_RING))) {
        int v = 0;
        if (!real_cuDriverGetVersion || real_cuDriverGetVersion(&v) != CUDA_SUCCESS)
            v = 0;
        g_shim.driver_version = v;
        pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
        g_shim.need_process = 1;
        /* Swap mode needs the ring (its events) and a valid control file; it is decided
         * here, once, before any hook records. */
        const char *ctl = getenv(PYOBMEM_ENV_CONTROL);
        if (ctl && *ctl) {
            shim_emit_process(); /* the process's first record, before the swap notes */
            g_shim.swap = swap_open(ctl);
        }
        gpuclock_init();
        __atomic_store_n(&g_shim.recording, 1, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&g_shim.init_done, 1, __ATOMIC_RELEASE);
    shim_tls_guard--;
}

void shim_init_wait(void)
{
    pthread_once(&g_once, shim_init);
}

/* The rank a launcher gave this process in its environment: the first family present. */
static const struct {
    int source;
    const char *rank, *local_rank, *world_size;
} g_rank_env[] = {
    {PYOBMEM_RANK_TORCH, "RANK", "LOCAL_RANK", "WORLD_SIZE"},
    {PYOBMEM_RANK_OMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"},
    {PYOBMEM_RANK_PMI, "PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"},
    {PYOBMEM_RANK_SLURM, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"},
};

uint64_t shim_env_u64(const char *name, uint64_t dflt, uint64_t max)
{
    const char *e = getenv(name);
    if (!e || !*e)
        return dflt;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    if (*end)
        return dflt;
    return v > max ? max : v;
}

/* A decimal environment value below 2^32 - 1, else PYOBMEM_RANK_UNKNOWN. */
static uint32_t env_u32(const char *name)
{
    const char *v = getenv(name);
    if (!v || *v < '0' || *v > '9')
        return PYOBMEM_RANK_UNKNOWN;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    return (*end || errno || x >= PYOBMEM_RANK_UNKNOWN) ? PYOBMEM_RANK_UNKNOWN : (uint32_t)x;
}

/* The rank fields of PROCESS (abi.h). */
static void process_rank(struct pyobmem_ev_process *p)
{
    p->rank = p->local_rank = PYOBMEM_RANK_UNKNOWN;
    for (size_t i = 0; i < sizeof g_rank_env / sizeof g_rank_env[0]; i++) {
        uint32_t rank = env_u32(g_rank_env[i].rank);
        if (rank == PYOBMEM_RANK_UNKNOWN)
            continue;
        uint32_t size = env_u32(g_rank_env[i].world_size);
        p->rank = rank;
        p->local_rank = env_u32(g_rank_env[i].local_rank);
        p->world_size = size == PYOBMEM_RANK_UNKNOWN ? 0 : size;
        p->rank_source = (uint8_t)g_rank_env[i].source;
        return;
    }
}

void shim_emit_process(void)
{
    if (!__atomic_exchange_n(&g_shim.need_process, 0, __ATOMIC_ACQ_REL))
        return;
    int src = __atomic_load_n(&g_shim.cupti_active, __ATOMIC_ACQUIRE) ? PYOBMEM_SOURCE_CUPTI : PYOBMEM_SOURCE_HOOKS;
    struct pyobmem_record r = {.type = PYOBMEM_EV_PROCESS,
                               .process = {.ppid = g_shim.ppid, .driver_version = (uint64_t)(int64_t)g_shim.driver_version,
                                           .source = (uint64_t)src}};
    process_rank(&r.process);
    ring_write(&r, 1);
}

/* ---- cuInit: device notes and CUPTI, once per process after the first success ---- */

static void notes_after_cuinit(void)
{
    ring_note(PYOBMEM_NOTE_DRIVER_VERSION "=%d", g_shim.driver_version);
    int n = 0;
    if (!real_cuDeviceGetCount || real_cuDeviceGetCount(&n) != CUDA_SUCCESS)
        n = 0;
    ring_note(PYOBMEM_NOTE_DEVICE_COUNT "=%d", n);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        if (!real_cuDeviceGet || real_cuDeviceGet(&d, i) != CUDA_SUCCESS)
            continue;
        char name[256];
        if (real_cuDeviceGetName && real_cuDeviceGetName(name, (int)sizeof name, d) == CUDA_SUCCESS) {
            name[sizeof name - 1] = 0;
            ring_note(PYOBMEM_NOTE_DEVICE "%d.name=%s", i, name);
        }
        size_t bytes;
        if (real_cuDeviceTotalMem_v2 && real_cuDeviceTotalMem_v2(&bytes, d) == CUDA_SUCCESS)
            ring_note(PYOBMEM_NOTE_DEVICE "%d.total_bytes=%zu", i, bytes);
        int major, minor;
        if (real_cuDeviceGetAttribute &&
            real_cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) == CUDA_SUCCESS &&
            real_cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d) == CUDA_SUCCESS)
            ring_note(PYOBMEM_NOTE_DEVICE "%d.cc=%d.%d", i, major, minor);
    }
}

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    int rec = shim_begin();
    CUresult r = REAL(cuInit, (Flags));
    if (rec && r == CUDA_SUCCESS && !__atomic_exchange_n(&g_shim.cuinit_done, 1, __ATOMIC_ACQ_REL)) {
        shim_tls_guard++;
        notes_after_cuinit();
        cupti_start();
        if (__atomic_load_n(&g_shim.cupti_active, __ATOMIC_ACQUIRE)) {
            /* The first PROCESS record said HOOKS: CUPTI only starts after cuInit. */
            __atomic_store_n(&g_shim.need_process, 1, __ATOMIC_RELEASE);
            shim_emit_process();
        }
        shim_tls_guard--;
    }
    return r;
}

/* ---- cuGetProcAddress ---- */

static const struct hook_entry *hook_by_real(void *p)
{
    if (!p)
        return NULL;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (*g_hooks[i].real == p)
            return &g_hooks[i];
    return NULL;
}

static const struct hook_entry *hook_by_name(const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u')
        return NULL;
    for (size_t i = 0; i < N_HOOKS; i++)
        if (strcmp(g_hooks[i].name, name) == 0)
            return &g_hooks[i];
    return NULL;
}

static const char *const g_families[] = {
    "cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease", "cuLaunch",
    "cuGraphLaunch", "cuGraphInstantiate", "cuGraphExec", "cuGraphAddNode", "cuMemcpy", "cuMemset",
    /* the calls that free kernel handles (params.c) */
    "cuModuleUnload", "cuLibraryUnload", "cuCtxDestroy", "cuCtxDetach", "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset", "cuGreenCtxDestroy",
};

/* Names in those families that never touch device memory: not worth a note. */
static const char *const g_host_only[] = {"cuLaunchHostFunc", "cuMemAllocHost", "cuMemFreeHost", "cuGraphExecHostNode",
                                          "cuGraphExecEvent", "cuGraphExecExternalSemaphores", "cuGraphExecGetFlags"};

static int in_family(const char *name)
{
    for (size_t i = 0; i < sizeof g_host_only / sizeof g_host_only[0]; i++)
        if (strncmp(name, g_host_only[i], strlen(g_host_only[i])) == 0)
            return 0;
    for (size_t i = 0; i < sizeof g_families / sizeof g_families[0]; i++)
        if (strncmp(name, g_families[i], strlen(g_families[i])) == 0)
            return 1;
    return 0;
}

#define UNHOOKED_MAX 256
static pthread_mutex_t g_unhooked_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_unhooked[UNHOOKED_MAX];
static unsigned g_unhooked_n;

void note_unhooked(const char *name, int version)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a of name@version */
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)(uint32_t)version) * 1099511628211ull;
    int fresh = 1;
    pthread_mutex_lock(&g_unhooked_mu);
    for (unsigned i = 0; i < g_unhooked_n; i++)
        if (g_unhooked[i] == h)
            fresh = 0;
    if (fresh && g_unhooked_n < UNHOOKED_MAX)
        g_unhooked[g_unhooked_n++] = h;
    else
        fresh = 0;
    pthread_mutex_unlock(&g_unhooked_mu);
    if (fresh)
        ring_note(PYOBMEM_NOTE_UNHOOKED "=%s@%d", name, version);
}

/* After the real cuGetProcAddress answered: swap in our wrapper if the answer is a hooked
 * function's real pointer. */
static void fix_proc_address(const char *symbol, void **pfn, int cudaVersion, int rec)
{
    if (!pfn || !*pfn)
        return;
    const struct hook_entry *e = hook_by_real(*pfn);
    if (!e) {
        /* Not one of the pointers resolved at init (the driver may hand out an exported alias):
         * identify it by the exported symbol at exactly that address, never by the requested
         * name, so the variant is the one the driver chose. */
        Dl_info info;
        if (dladdr(*pfn, &info) && info.dli_saddr == *pfn && info.dli_sname && info.dli_fname &&
            strstr(info.dli_fname, "libcuda.so"))
            e = hook_by_name(info.dli_sname);
        if (e && *e->real == NULL)
            *e->real = *pfn;
        else if (e && *e->real != *pfn)
            e = NULL; /* same name, different function: not ours to wrap */
    }
    if (e)
        *pfn = e->hook;
    else if (rec && symbol && in_family(symbol))
        note_unhooked(symbol, cudaVersion);
}

CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    if (shim_tls_guard)
        return REAL(cuGetProcAddress, (symbol, pfn, cudaVersion, flags));
    int rec = shim_begin();
    CUresult r = REAL(cuGetProcAddress, (symbol, pfn, cudaVersion, flags));
    if (r == CUDA_SUCCESS && !g_shim.disabled)
        fix_proc_address(symbol, pfn, cudaVersion, rec);
    return r;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *symbolStatus)
{
    if (shim_tls_guard)
        return REAL(cuGetProcAddress_v2, (symbol, pfn, cudaVersion, flags, symbolStatus));
    int rec = shim_begin();
    CUresult r = REAL(cuGetProcAddress_v2, (symbol, pfn, cudaVersion, flags, symbolStatus));
    if (r == CUDA_SUCCESS && !g_shim.disabled)
        fix_proc_address(symbol, pfn, cudaVersion, rec);
    return r;
}

/* ---- dlsym ---- */

static int in_libcuda(void *p)
{
    Dl_info info;
    return p && dladdr(p, &info) && info.dli_fname && strstr(info.dli_fname, "libcuda.so") != NULL;
}

static int in_self(void *p)
{
    Dl_info a, b;
    return p && dladdr(p, &a) && dladdr((void *)&in_self, &b) && a.dli_fbase == b.dli_fbase;
}

/* Return NULL for `name` with dlerror() saying so, as the real dlsym does. The lookups above end
 * with a successful dlclose, which clears dlerror(): a program following dlsym(3) (clear
 * dlerror, dlsym, check dlerror) would take the NULL for a found symbol's value. A lookup after
 * our own library fails with the real "undefined symbol" message; in the rare case it finds the
 * name (an object between us and the caller defines it), a lookup of a version that cannot
 * exist fails instead. */
/* dlsym(RTLD_NEXT, name) as asked by this library: never a tail call, or the real dlsym would
 * take our caller for the asker and could find our own export again. */
static __attribute__((noinline)) void *next_after_self(dlsym_fn ds, const char *name)
{
    void *p = ds(RTLD_NEXT, name);
    __asm__ volatile("" : "+r"(p));
    return p;
}

static void *not_found(dlsym_fn ds, const char *name)
{
    if (next_after_self(ds, name) != NULL)
        (void)dlvsym(RTLD_NEXT, name, "PYOBMEM_NO_SUCH_VERSION");
    return NULL;
}

/* dlsym(RTLD_NEXT, ...) from the application: glibc would search after *our* library, since
 * we are the caller it sees. Search the objects after the real caller instead: the first one
 * that defines the symbol itself. */
static void *dlsym_next(dlsym_fn ds, const char *name, void *caller)
{
    Dl_info info;
    struct link_map *lm = NULL;
    if (!dladdr1(caller, &info, (void **)&lm, RTLD_DL_LINKMAP) || !lm)
        return ds(RTLD_NEXT, name);
    for (struct link_map *l = lm->l_next; l; l = l->l_next) {
        if (!l->l_name || !l->l_name[0])
            continue;
        /* a handle with its lookup scope set up (a bare link_map of a startup object has none) */
        void *h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
        if (!h)
            continue;
        void *p = ds(h, name);
        dlclose(h);
        struct link_map *owner = NULL;
        if (p && dladdr1(p, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == l)
            return p; /* the successful dlclose left dlerror() clear, as a found symbol should */
    }
    return not_found(ds, name);
}

void *shim_next(const char *name)
{
    dlsym_fn ds = real_dlsym();
    return ds ? dlsym_next(ds, name, (void *)&shim_next) : NULL;
}

SHIM_EXPORT void *dlsym(void *handle, const char *name)
{
    dlsym_fn ds = real_dlsym();
    if (!ds)
        return NULL;
    void *p = handle == RTLD_NEXT ? dlsym_next(ds, name, __builtin_return_address(0)) : ds(handle, name);
    if (!p || shim_tls_guard)
        return p;
    const struct hook_entry *e = hook_by_name(name);
    if (!e) {
        void *hook = nccl_hook(name);
        if (!hook)
            return p;
        /* An NCCL name (nccl.c): our wrapper when p is the function it forwards to (the first
         * libnccl after us); our own export found with no libnccl behind it: not found, as
         * without us, so that probing for NCCL still finds none. */
        void *real = nccl_real(name);
        const char *dis = getenv(PYOBMEM_ENV_DISABLE);
        if (p == real && !(dis && strcmp(dis, "1") == 0))
            return hook;
        if (in_self(p) && !real)
            return not_found(ds, name);
        return p;
    }
    if (in_libcuda(p)) {
        if (getenv(PYOBMEM_ENV_DISABLE) && strcmp(getenv(PYOBMEM_ENV_DISABLE), "1") == 0)
            return p;
        return e->hook;
    }
    /* RTLD_DEFAULT found our own export: only say so if there is a libcuda behind it, so that
     * a process probing for CUDA without a driver still finds none. Without libcuda the answer
     * is what the lookup would have found without us: the next definition after our library,
     * or NULL with the real "undefined symbol" in dlerror() (not our failed probe's message). */
    if (in_self(p)) {
        void *cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (!cu)
            cu = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
        if (!cu)
            return next_after_self(ds, name);
        dlclose(cu);
    }
    return p;
}
