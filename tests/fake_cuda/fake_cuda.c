/*
 * A tiny fake libcuda.so.1 for the shim's CPU tests: just enough of the driver API for the
 * scenarios in driver.c. Built with -Wl,-Bsymbolic so that, like the real driver, the pointers
 * it hands out through cuGetProcAddress are its own functions, not the preloaded shim's.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_cuda.h"

#include <cupti_driver_cbid.h>
#include <generated_cuda_meta.h>

#define API __attribute__((visibility("default")))

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x10000000000ull;   /* device allocations */
static uint64_t next_va = 0x20000000000ull;     /* VMM reservations */
static int param_queries;

#define MAX_LIVE 65536
static uint64_t live[MAX_LIVE];
static size_t live_size[MAX_LIVE];
static unsigned char live_managed[MAX_LIVE];
static int n_live;

/* ---- device capacity (FAKE_DEVICE_BYTES, default 1 TiB): legacy allocations and cuMemCreate ----
 * dev_used: every byte taken (managed allocations too, as before); managed_used: the managed part;
 * dev_peak: the high-water mark of dev_used - managed_used, the device memory a budget is about
 * (counter "device_peak"). */
static uint64_t dev_used, managed_used, dev_peak;
static uint64_t capacity(void)
{
    const char *e = getenv("FAKE_DEVICE_BYTES");
    return e && *e ? strtoull(e, NULL, 0) : (1ull << 40);
}
static void note_peak(void)
{
    if (dev_used - managed_used > dev_peak)
        dev_peak = dev_used - managed_used;
}
static int take_as(uint64_t n, int managed)
{
    if (dev_used + n > capacity())
        return 0;
    dev_used += n;
    if (managed)
        managed_used += n;
    note_peak();
    return 1;
}
static int take(uint64_t n) { return take_as(n, 0); }

static uint64_t bump(uint64_t *next, size_t size)
{
    pthread_mutex_lock(&mu);
    uint64_t a = *next;
    *next += (size + 0xFFFu) & ~(uint64_t)0xFFFu;
    *next += 0x1000; /* a gap between allocations */
    pthread_mutex_unlock(&mu);
    return a;
}

static CUresult alloc_as(CUdeviceptr *dptr, size_t size, int managed)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > FAKE_OOM_ABOVE)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    int ok = take_as(size, managed);
    pthread_mutex_unlock(&mu);
    if (!ok)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t a = bump(&next_addr, size);
    pthread_mutex_lock(&mu);
    if (n_live < MAX_LIVE) {
        live_size[n_live] = size;
        live_managed[n_live] = (unsigned char)managed;
        live[n_live++] = a;
    }
    pthread_mutex_unlock(&mu);
    *dptr = a;
    return CUDA_SUCCESS;
}

static CUresult alloc(CUdeviceptr *dptr, size_t size) { return alloc_as(dptr, size, 0); }

static CUresult release(CUdeviceptr p)
{
    if (p == 0)
        return CUDA_SUCCESS;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    for (int i = n_live - 1; i >= 0; i--)
        if (live[i] == p) {
            dev_used -= live_size[i];
            if (live_managed[i])
                managed_used -= live_size[i];
            live_size[i] = live_size[n_live - 1];
            live_managed[i] = live_managed[n_live - 1];
            live[i] = live[--n_live];
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mu);
    return r;
}

API CUresult fakeAllocHidden(CUdeviceptr *dptr, size_t bytesize) { return alloc(dptr, bytesize); }
API int fakeParamQueries(void) { return __atomic_load_n(&param_queries, __ATOMIC_RELAXED); }

/* ---- init and devices ---- */
API CUresult cuInit(unsigned int flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *d, int i) { if (i != 0) return CUDA_ERROR_INVALID_DEVICE; *d = 0; return CUDA_SUCCESS; }
API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    (void)d;
    strncpy(name, "Fake H200", (size_t)len);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = 150754820096ull; return CUDA_SUCCESS; }
API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d)
{
    (void)d;
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) { *pi = 9; return CUDA_SUCCESS; }
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) { *pi = 0; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
#define FAKE_CTX ((CUcontext)0xC7C0)
static CUcontext cur_ctx = FAKE_CTX; /* fakeSetContext: another context made current */
API void fakeSetContext(CUcontext c) { cur_ctx = c; }
API CUresult cuCtxGetCurrent(CUcontext *c) { *c = cur_ctx; return CUDA_SUCCESS; }
API CUresult cuCtxPushCurrent_v2(CUcontext c) { return c ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuCtxPopCurrent_v2(CUcontext *c) { if (c) *c = FAKE_CTX; return CUDA_SUCCESS; }
API CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice p) { (void)d; (void)p; *can = 0; return CUDA_SUCCESS; }
API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) { (void)p; memset(h, 0, sizeof *h); return CUDA_SUCCESS; }

/* ---- memory ---- */
API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return alloc(dptr, size); }
/* legacy 32-bit entry point: never hooked by the shim */
API CUresult cuMemAlloc(unsigned int *dptr, unsigned int size) { (void)size; *dptr = 0x1000; return CUDA_SUCCESS; }
API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int e)
{
    (void)e;
    *pitch = (w + 511) & ~(size_t)511;
    return alloc(dptr, *pitch * h);
}
API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) { (void)flags; return alloc_as(dptr, size, 1); }
API CUresult cuMemFree_v2(CUdeviceptr p) { return release(p); }
API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) { (void)s; return alloc(dptr, size); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s) { (void)s; return alloc(dptr, size); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return alloc(dptr, size); }
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return alloc(dptr, size); }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return release(p); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return release(p); }

#include "fake_vmm.inc"

/* a copy family member the shim does not hook */
API CUresult cuLaunchHostFunc(CUstream st, CUhostFn fn, void *ud)
{
    (void)st; (void)fn; (void)ud;
    return CUDA_SUCCESS;
}
/* a copy the shim does not hook (its unhooked note) */
API CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *p, CUstream st)
{
    (void)st;
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- kernels ---- */
static const size_t a_off[] = {0, 8, 16}, a_size[] = {8, 4, 8};
static const size_t b_off[] = {0, 16}, b_size[] = {16, 8};
static const size_t t_off[] = {0, 8}, t_size[] = {4, 8 * FAKE_T_PTRS};

static CUresult info(const size_t *off, const size_t *sz, size_t n, size_t i, size_t *po, size_t *ps)
{
    __atomic_add_fetch(&param_queries, 1, __ATOMIC_RELAXED);
    if (i >= n)
        return CUDA_ERROR_INVALID_VALUE;
    if (po)
        *po = off[i];
    if (ps)
        *ps = sz[i];
    return CUDA_SUCCESS;
}

/* FAKE_FUNC_R's kernel now: 3 parameters (as kernel_a) or 1 pointer, as the last
 * cuModuleGetFunction named it. */
static const size_t r1_off[] = {0}, r1_size[] = {8};
static int r_params = 3;

API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    if (!f || !name || (strcmp(name, "r3") && strcmp(name, "r1")))
        return CUDA_ERROR_NOT_FOUND;
    __atomic_store_n(&r_params, name[1] == '3' ? 3 : 1, __ATOMIC_RELAXED);
    *f = FAKE_FUNC_R;
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule m)
{
    (void)m;
    return CUDA_SUCCESS;
}

API CUresult cuLibraryUnload(CUlibrary l)
{
    (void)l;
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    (void)d;
    return CUDA_SUCCESS;
}

API CUresult cuFuncGetParamInfo(CUfunction f, size_t i, size_t *po, size_t *ps)
{
    if (f == FAKE_FUNC_A)
        return info(a_off, a_size, 3, i, po, ps);
    if (f == FAKE_FUNC_T)
        return info(t_off, t_size, 2, i, po, ps);
    if (f == FAKE_FUNC_R)
        return __atomic_load_n(&r_params, __ATOMIC_RELAXED) == 3 ? info(a_off, a_size, 3, i, po, ps)
                                                               : info(r1_off, r1_size, 1, i, po, ps);
    __atomic_add_fetch(&param_queries, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuKernelGetParamInfo(CUkernel k, size_t i, size_t *po, size_t *ps)
{
    if ((CUfunction)k == FAKE_KERN_B)
        return info(b_off, b_size, 2, i, po, ps);
    __atomic_add_fetch(&param_queries, 1, __ATOMIC_RELAXED);
    return CUDA_ERROR_INVALID_HANDLE;
}

API CUresult cuFuncGetName(const char **name, CUfunction f)
{
    if (f != FAKE_FUNC_A)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = "kernel_a";
    return CUDA_SUCCESS;
}

API CUresult cuKernelGetName(const char **name, CUkernel k)
{
    if ((CUfunction)k != FAKE_KERN_B)
        return CUDA_ERROR_INVALID_HANDLE;
    *name = "kernel_b_with_a_rather_long_templated_name<float, 128, true>";
    return CUDA_SUCCESS;
}


/* The fake libcupti registers here; launches call it with their result, as CUPTI calls its
 * subscriber at API entry and exit. */
static fake_api_callback api_cb;
API void fakeSetApiCallback(fake_api_callback cb) { __atomic_store_n(&api_cb, cb, __ATOMIC_RELEASE); }
static void api_enter(unsigned cbid, const void *params)
{
    fake_api_callback cb = __atomic_load_n(&api_cb, __ATOMIC_ACQUIRE);
    if (cb)
        cb(cbid, params, NULL);
}
static CUresult api_exit(unsigned cbid, const void *params, CUresult r)
{
    fake_api_callback cb = __atomic_load_n(&api_cb, __ATOMIC_ACQUIRE);
    if (cb)
        cb(cbid, params, &r);
    return r;
}
#define LAUNCH_WITH_CALLBACK(CBID)                                                            \
    do {                                                                                      \
        cuLaunchKernel_params p_ = {f, gx, gy, gz, bx, by, bz, sh, s, kp, extra};            \
        api_enter(CBID, &p_);                                                                 \
        return api_exit(CBID, &p_, launch(f, s, kp, extra));                                  \
    } while (0)

#define LAUNCH_PARAMS CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, \
                      unsigned sh, CUstream s, void **kp
API CUresult cuLaunchKernel(LAUNCH_PARAMS, void **extra)
{
    LAUNCH_WITH_CALLBACK(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
}
API CUresult cuLaunchKernel_ptsz(LAUNCH_PARAMS, void **extra)
{
    LAUNCH_WITH_CALLBACK(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz);
}
API CUresult cuLaunchCooperativeKernel(LAUNCH_PARAMS)
{
    cuLaunchCooperativeKernel_params p = {f, gx, gy, gz, bx, by, bz, sh, s, kp};
    api_enter(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, &p);
    return api_exit(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, &p, launch(f, s, kp, NULL));
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra)
{
    cuLaunchKernelEx_params p = {c, f, kp, extra};
    api_enter(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &p);
    return api_exit(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &p, c ? launch(f, c->hStream, kp, extra) : CUDA_ERROR_INVALID_VALUE);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **kp, void **extra)
{
    cuLaunchKernelEx_params p = {c, f, kp, extra};
    api_enter(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, &p);
    return api_exit(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, &p, c ? launch(f, c->hStream, kp, extra) : CUDA_ERROR_INVALID_VALUE);
}

/* ---- graphs ---- */
API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
    const struct fake_graph *fg = (const struct fake_graph *)g;
    if (!fg || !n)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < fg->n && i < *n; i++)
            nodes[i] = (CUgraphNode)fg->nodes[i];
    *n = fg->n;
    return CUDA_SUCCESS;
}
API CUresult cuGraphNodeGetType(CUgraphNode h, CUgraphNodeType *t) { *t = ((struct fake_node *)h)->type; return CUDA_SUCCESS; }
API CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode h, CUDA_KERNEL_NODE_PARAMS *p)
{
    const struct fake_node *n = (const struct fake_node *)h;
    if (n->type != CU_GRAPH_NODE_TYPE_KERNEL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(p, 0, sizeof *p);
    p->func = n->func;
    p->kern = n->kern;
    p->kernelParams = n->kernelParams;
    p->gridDimX = p->gridDimY = p->gridDimZ = 1;
    return CUDA_SUCCESS;
}
API CUresult cuGraphMemsetNodeGetParams(CUgraphNode h, CUDA_MEMSET_NODE_PARAMS *p)
{
    const struct fake_node *n = (const struct fake_node *)h;
    memset(p, 0, sizeof *p);
    p->dst = n->dst;
    p->elementSize = 1;
    p->width = 64;
    p->height = 1;
    return CUDA_SUCCESS;
}
static uint64_t next_exec = 0xE000;
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long f)
{
    (void)f;
    if (!g)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_graph *fg = (const struct fake_graph *)g;
    pthread_mutex_lock(&fmu); /* like the driver: a memset node's unmapped destination is refused */
    int unmapped = 0;
    for (size_t i = 0; i < fg->n; i++)
        if (fg->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEMSET && fg->nodes[i]->dst >= VMM_BASE &&
            fg->nodes[i]->dst < VMM_END && !mapping_of(fg->nodes[i]->dst))
            unmapped = 1;
    pthread_mutex_unlock(&fmu);
    if (unmapped)
        return CUDA_ERROR_INVALID_VALUE;
    *e = (CUgraphExec)(uintptr_t)__atomic_add_fetch(&next_exec, 0x10, __ATOMIC_RELAXED);
    pthread_mutex_lock(&fmu);
    if (n_execs < MAX_EXECS) {
        execs[n_execs].e = *e;
        execs[n_execs++].g = (const struct fake_graph *)g;
    }
    pthread_mutex_unlock(&fmu);
    return CUDA_SUCCESS;
}
API CUresult cuGraphLaunch(CUgraphExec e, CUstream s) { return e ? graph_launch(e, s) : CUDA_ERROR_INVALID_VALUE; }
static CUresult kernel_set(CUgraphExec e, CUgraphNode h, CUfunction f, CUkernel k, void **kp)
{
    struct fake_node to = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = f, .kern = k, .kernelParams = kp};
    return exec_node_set(e, h, &to);
}
API CUresult cuGraphExecKernelNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return kernel_set(e, h, p->func, NULL, p->kernelParams);
}
API CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec e, CUgraphNode h, const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return kernel_set(e, h, p->func, p->kern, p->kernelParams);
}
API CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c)
{
    (void)c;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fmu); /* like the driver: a reserved address with nothing mapped is refused */
    int unmapped = p->dst >= VMM_BASE && p->dst < VMM_END && !mapping_of(p->dst);
    pthread_mutex_unlock(&fmu);
    if (unmapped)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_node to = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = p->dst};
    return exec_node_set(e, h, &to);
}
API CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec e, CUgraphNode h, CUgraph child)
{
    struct fake_node to = {.type = CU_GRAPH_NODE_TYPE_GRAPH};
    return child ? exec_node_set(e, h, &to) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuGraphExecBatchMemOpNodeSetParams(CUgraphExec e, CUgraphNode h, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p)
{
    struct fake_node to = {.type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP};
    return p ? exec_node_set(e, h, &to) : CUDA_ERROR_INVALID_VALUE;
}
API CUresult cuGraphExecNodeSetParams(CUgraphExec e, CUgraphNode h, CUgraphNodeParams *p)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL)
        return kernel_set(e, h, p->kernel.func, p->kernel.kern, p->kernel.kernelParams);
    struct fake_node to = {.type = p->type, .dst = p->type == CU_GRAPH_NODE_TYPE_MEMSET ? p->memset.dst : 0};
    return exec_node_set(e, h, &to);
}
/* Conditional nodes: up to 8, of up to 4 bodies each; the bodies are fake graphs the caller fills. */
#define MAX_COND 8
static struct fake_node cond_nodes[MAX_COND];
static struct fake_graph cond_bodies[MAX_COND][4];
static CUgraph cond_out[MAX_COND][4];
static int n_cond;
API CUresult cuGraphAddNode_v2(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, const CUgraphEdgeData *ed, size_t nd,
                               CUgraphNodeParams *p)
{
    (void)deps; (void)ed; (void)nd;
    struct fake_graph *fg = (struct fake_graph *)g;
    if (!ph || !fg || !p || fg->n >= 8)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned size = p->conditional.size;
    pthread_mutex_lock(&fmu);
    int i = n_cond < MAX_COND && size >= 1 && size <= 4 ? n_cond++ : -1;
    pthread_mutex_unlock(&fmu);
    if (i < 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned k = 0; k < size; k++)
        cond_out[i][k] = (CUgraph)&cond_bodies[i][k];
    p->conditional.phGraph_out = cond_out[i];
    cond_nodes[i] = (struct fake_node){.type = CU_GRAPH_NODE_TYPE_CONDITIONAL, .bodies = cond_bodies[i]};
    fg->nodes[fg->n++] = &cond_nodes[i];
    *ph = (CUgraphNode)&cond_nodes[i];
    return CUDA_SUCCESS;
}
API CUresult cuGraphAddNode(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraphNodeParams *p)
{
    return cuGraphAddNode_v2(ph, g, deps, NULL, nd, p);
}
API CUresult cuGraphDestroy(CUgraph g) { return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
API CUresult cuGraphDestroyNode(CUgraphNode n) { return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
/* A child-graph node's graph (fake_node.child). */
API CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode h, CUgraph *g)
{
    const struct fake_node *n = (const struct fake_node *)h;
    if (n->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *g = (CUgraph)n->child;
    return CUDA_SUCCESS;
}
API CUresult cuGraphExecDestroy(CUgraphExec e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

/* ---- cuGetProcAddress: names -> versioned symbols, like the real driver ---- */
struct sym {
    const char *name;   /* as requested */
    int min_version;    /* first CUDA version where this mapping applies */
    const char *symbol; /* default-stream symbol */
    void *fn;
    void *fn_ptsz;      /* per-thread variant, if any */
};

CUresult cuGetProcAddress(const char *symbol, void **pfn, int v, cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int v, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *st);

#define S(name, ver, fn, ptsz) {name, ver, #fn, (void *)fn, ptsz}
static const struct sym syms[] = {
    S("cuInit", 2000, cuInit, NULL),
    S("cuDriverGetVersion", 2020, cuDriverGetVersion, NULL),
    S("cuGetProcAddress", 11030, cuGetProcAddress, NULL),
    S("cuGetProcAddress", 12000, cuGetProcAddress_v2, NULL),
    S("cuCtxSynchronize", 2000, cuCtxSynchronize, NULL),
    S("cuStreamSynchronize", 2000, cuStreamSynchronize, NULL),
    S("cuMemAlloc", 2000, cuMemAlloc, NULL),
    S("cuMemAlloc", 3020, cuMemAlloc_v2, NULL),
    S("cuMemFree", 3020, cuMemFree_v2, NULL),
    S("cuMemAllocManaged", 6000, cuMemAllocManaged, NULL),
    S("cuMemAllocAsync", 11020, cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz),
    S("cuMemFreeAsync", 11020, cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz),
    S("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz),
    S("cuMemAddressReserve", 10020, cuMemAddressReserve, NULL),
    S("cuMemCreate", 10020, cuMemCreate, NULL),
    S("cuMemMap", 10020, cuMemMap, NULL),
    S("cuMemUnmap", 10020, cuMemUnmap, NULL),
    S("cuMemRelease", 10020, cuMemRelease, NULL),
    S("cuMemSetAccess", 10020, cuMemSetAccess, NULL),
    S("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, NULL),
    S("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, NULL),
    S("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, NULL),
    S("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, NULL),
    S("cuMemcpyAsync", 4000, cuMemcpyAsync, NULL),
    S("cuMemcpy2D", 3020, cuMemcpy2D_v2, NULL),
    S("cuMemcpyBatchAsync", 12080, cuMemcpyBatchAsync, (void *)cuMemcpyBatchAsync_ptsz),
    S("cuMemcpyBatchAsync", 13000, cuMemcpyBatchAsync_v2, (void *)cuMemcpyBatchAsync_v2_ptsz),
    S("cuMemcpy3DBatchAsync", 12080, cuMemcpy3DBatchAsync, (void *)cuMemcpy3DBatchAsync_ptsz),
    S("cuMemcpy3DBatchAsync", 13000, cuMemcpy3DBatchAsync_v2, (void *)cuMemcpy3DBatchAsync_v2_ptsz),
    S("cuMemcpy3DPeerAsync", 4000, cuMemcpy3DPeerAsync, NULL),
    S("cuLaunchHostFunc", 10000, cuLaunchHostFunc, NULL),
    S("cuMemsetD8", 3020, cuMemsetD8_v2, NULL),
    S("cuMemsetD32Async", 3020, cuMemsetD32Async, NULL),
    S("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, NULL),
    S("cuMemAllocPitch", 3020, cuMemAllocPitch_v2, NULL),
    S("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle, NULL),
    S("cuPointerGetAttribute", 4000, cuPointerGetAttribute, NULL),
    S("cuMemHostAlloc", 2020, cuMemHostAlloc, NULL),
    S("cuMemAllocHost", 3020, cuMemAllocHost_v2, NULL),
    S("cuMemFreeHost", 2000, cuMemFreeHost, NULL),
    S("cuMemHostRegister", 6050, cuMemHostRegister_v2, NULL),
    S("cuMemHostUnregister", 4000, cuMemHostUnregister, NULL),
    S("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2, NULL),
    S("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2, NULL),
    S("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, NULL),
    S("cuStreamEndCapture", 10000, cuStreamEndCapture, NULL),
    S("cuLaunchKernel", 4000, cuLaunchKernel, (void *)cuLaunchKernel_ptsz),
    S("cuModuleGetFunction", 2000, cuModuleGetFunction, NULL),
    S("cuModuleUnload", 2000, cuModuleUnload, NULL),
    S("cuLibraryUnload", 12000, cuLibraryUnload, NULL),
    S("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2, NULL),
    S("cuLaunchKernelEx", 11060, cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz),
    S("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel, NULL),
    S("cuGraphInstantiate", 11000, cuGraphInstantiateWithFlags, NULL),
    S("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags, NULL),
    S("cuGraphLaunch", 10000, cuGraphLaunch, NULL),
    S("cuGraphExecKernelNodeSetParams", 10010, cuGraphExecKernelNodeSetParams, NULL),
    S("cuGraphExecKernelNodeSetParams", 12000, cuGraphExecKernelNodeSetParams_v2, NULL),
    S("cuGraphExecMemsetNodeSetParams", 10020, cuGraphExecMemsetNodeSetParams, NULL),
    S("cuGraphExecChildGraphNodeSetParams", 11010, cuGraphExecChildGraphNodeSetParams, NULL),
    S("cuGraphExecBatchMemOpNodeSetParams", 11070, cuGraphExecBatchMemOpNodeSetParams, NULL),
    S("cuGraphExecNodeSetParams", 12020, cuGraphExecNodeSetParams, NULL),
    S("cuGraphAddNode", 12020, cuGraphAddNode, NULL),
    S("cuGraphAddNode", 12030, cuGraphAddNode_v2, NULL),
    S("cuGraphDestroy", 10000, cuGraphDestroy, NULL),
    S("cuGraphDestroyNode", 10000, cuGraphDestroyNode, NULL),
    S("cuGraphExecDestroy", 10000, cuGraphExecDestroy, NULL),
};

API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int v, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *st)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sym *best = NULL;
    int found = 0;
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        if (strcmp(syms[i].name, symbol) != 0)
            continue;
        found = 1;
        if (syms[i].min_version <= v && (!best || syms[i].min_version > best->min_version))
            best = &syms[i];
    }
    if (!best) {
        *pfn = NULL;
        if (st)
            *st = found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->fn_ptsz ? best->fn_ptsz : best->fn;
    if (st)
        *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

API CUresult cuGetProcAddress(const char *symbol, void **pfn, int v, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, v, flags, NULL);
}
