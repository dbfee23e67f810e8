/*
 * Test driver: behaves like a CUDA runtime against the fake libcuda. It dlopens libcuda.so.1,
 * takes cuGetProcAddress_v2 with dlsym, asks it for cuGetProcAddress itself, and then gets
 * every entry point through that (C01/C02). Scenarios are chosen by argv[1]; results are
 * printed as "key=value" lines for tests/test_shim.py.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_fn gpa;
static void *libcuda;
static int (*fakeParamQueries_p)(void);
static CUresult (*fakeAllocHidden_p)(CUdeviceptr *, size_t);
#define fakeParamQueries fakeParamQueries_p
#define fakeAllocHidden fakeAllocHidden_p

static void *get(const char *name, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gpa(name, &p, version, flags, &st);
    if (r != CUDA_SUCCESS)
        return NULL;
    return p;
}
#define GET(type, name) ((type)get(name, 12080, CU_GET_PROC_ADDRESS_DEFAULT))

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*coop_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void **);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*dtod_fn)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*memset8_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*memset32a_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*inst_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*glaunch_fn)(CUgraphExec, CUstream);

static init_fn p_cuInit;
static alloc_fn p_alloc;
static free_fn p_free;
static launch_fn p_launch;

static void setup(void)
{
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda) {
        printf("error=%s\n", dlerror());
        exit(3);
    }
    fakeParamQueries_p = (int (*)(void))dlsym(libcuda, "fakeParamQueries");
    fakeAllocHidden_p = (CUresult(*)(CUdeviceptr *, size_t))dlsym(libcuda, "fakeAllocHidden");
    gpa_fn via_dlsym = (gpa_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = via_dlsym("cuGetProcAddress", &self, 12000, 0, &st);
    printf("gpa_self_rc=%d\n", (int)r);
    /* The shim (when loaded) hands out its own wrapper for both lookups. */
    void *exported = dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    printf("gpa_dlsym_is_export=%d\n", (void *)via_dlsym == exported);
    printf("gpa_self_is_export=%d\n", self == exported);
    gpa = self ? (gpa_fn)self : via_dlsym;
    p_cuInit = GET(init_fn, "cuInit");
    p_alloc = GET(alloc_fn, "cuMemAlloc");
    p_free = GET(free_fn, "cuMemFree");
    p_launch = GET(launch_fn, "cuLaunchKernel");
}

static CUdeviceptr must_alloc(size_t n)
{
    CUdeviceptr p = 0;
    CUresult r = p_alloc(&p, n);
    if (r != CUDA_SUCCESS) {
        printf("error=alloc %d\n", (int)r);
        exit(4);
    }
    return p;
}

static void launch_a(CUdeviceptr x, int n, CUdeviceptr y)
{
    void *args[] = {&x, &n, &y};
    CUresult r = p_launch(FAKE_FUNC_A, 2, 3, 4, 128, 1, 1, 0, (CUstream)0x77, args, NULL);
    if (r != CUDA_SUCCESS)
        printf("error=launch %d\n", (int)r);
}

static int scenario_basic(void)
{
    printf("init_rc=%d\n", (int)p_cuInit(0));
    CUdeviceptr a = must_alloc(1 << 20), b = must_alloc(4096);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    CUdeviceptr oom = 0;
    printf("oom_rc=%d\n", (int)p_alloc(&oom, FAKE_OOM_ABOVE + 1));

    launch_a(a + 256, 7, b);
    int q = fakeParamQueries();
    launch_a(b, 1, b + 8); /* same block twice: one access */
    printf("queries_after_first=%d\nqueries_after_second=%d\n", q, fakeParamQueries());

    /* cuLaunchKernelEx with a CUkernel (layout from cuKernelGetParamInfo): struct of two
     * pointers, then a pointer; cooperative through an attribute. */
    struct { CUdeviceptr p, q; } pair = {b + 16, a + 1000};
    CUdeviceptr third = a;
    void *args[] = {&pair, &third};
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 5; cfg.gridDimY = 1; cfg.gridDimZ = 2;
    cfg.blockDimX = 32; cfg.blockDimY = 1; cfg.blockDimZ = 1;
    cfg.hStream = (CUstream)0x88;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    launch_ex_fn ex = GET(launch_ex_fn, "cuLaunchKernelEx");
    printf("ex_rc=%d\n", (int)ex(&cfg, FAKE_KERN_B, args, NULL));

    /* No layout: the packed buffer of `extra` is scanned, the launch is opaque. */
    struct { int n; int pad; CUdeviceptr p; } packed = {3, 0, b + 100};
    size_t size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    printf("opaque_rc=%d\n", (int)p_launch(FAKE_FUNC_C, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));

    /* Cooperative launch, and a failing launch whose error passes through unrecorded. */
    coop_fn coop = GET(coop_fn, "cuLaunchCooperativeKernel");
    int n = 0;
    void *cargs[] = {&a, &n, &b};
    printf("coop_rc=%d\n", (int)coop(FAKE_FUNC_A, 1, 1, 1, 1, 1, 1, 0, NULL, cargs));
    printf("bad_launch_rc=%d\n", (int)p_launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));

    /* Copies and sets. */
    char host[64];
    GET(htod_fn, "cuMemcpyHtoD")(a + 64, host, 64);
    GET(dtoh_fn, "cuMemcpyDtoH")(host, b + 8, 32);
    GET(dtod_fn, "cuMemcpyDtoD")(b, a, 4096);
    GET(memset8_fn, "cuMemsetD8")(a + 16, 0xAB, 100);
    GET(memset32a_fn, "cuMemsetD32Async")(b, 7, 10, (CUstream)0x99);

    printf("free_b_rc=%d\n", (int)p_free(b));
    printf("free_a_rc=%d\n", (int)p_free(a));
    return 0;
}

static int scenario_untracked(void)
{
    p_cuInit(0);
    CUdeviceptr hidden = 0;
    fakeAllocHidden(&hidden, 8192);
    printf("hidden=%" PRIu64 "\n", (uint64_t)hidden);
    printf("free_hidden_rc=%d\n", (int)p_free(hidden));
    printf("free_bogus_rc=%d\n", (int)p_free(0xdead0000));
    printf("free_null_rc=%d\n", (int)p_free(0));
    return 0;
}

static int scenario_async(void)
{
    p_cuInit(0);
    alloc_async_fn aa = GET(alloc_async_fn, "cuMemAllocAsync");
    alloc_async_fn aa_ptsz = (alloc_async_fn)get("cuMemAllocAsync", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    free_async_fn fa = GET(free_async_fn, "cuMemFreeAsync");
    CUdeviceptr x = 0, y = 0;
    printf("aa_rc=%d\n", (int)aa(&x, 3000, (CUstream)0x55));
    printf("aa_ptsz_rc=%d\n", (int)aa_ptsz(&y, 5000, (CUstream)0x66));
    printf("x=%" PRIu64 "\ny=%" PRIu64 "\n", (uint64_t)x, (uint64_t)y);
    printf("aa_ptsz_is_export=%d\n", (void *)aa_ptsz == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"));
    fa(x, (CUstream)0x55);
    fa(y, (CUstream)0x66);
    return 0;
}

static int scenario_vmm(void)
{
    p_cuInit(0);
    CUdeviceptr va = 0;
    GET(reserve_fn, "cuMemAddressReserve")(&va, 8 << 20, 0, 0, 0);
    CUmemGenericAllocationHandle h1, h2;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    GET(create_fn, "cuMemCreate")(&h1, 2 << 20, &prop, 0);
    GET(create_fn, "cuMemCreate")(&h2, 2 << 20, &prop, 0);
    map_fn map = GET(map_fn, "cuMemMap");
    map(va, 2 << 20, 0, h1, 0);
    map(va + (2 << 20), 2 << 20, 0, h2, 0);
    printf("bad_map_rc=%d\n", (int)map(va + (4 << 20), 2 << 20, 0, 0, 0));
    printf("va=%" PRIu64 "\n", (uint64_t)va);
    launch_a(va + 8, 0, va + (2 << 20) + 24);
    unmap_fn unmap = GET(unmap_fn, "cuMemUnmap");
    unmap(va, 4 << 20);
    unmap(va + (6 << 20), 2 << 20);
    return 0;
}

static int scenario_graph(void)
{
    p_cuInit(0);
    CUdeviceptr a = must_alloc(1 << 16), b = must_alloc(1 << 16), c = must_alloc(1 << 16);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    CUdeviceptr x = a + 32, y = b;
    int n = 5;
    void *args1[] = {&x, &n, &y};
    struct { CUdeviceptr p, q; } pair = {b + 64, b + 128};
    CUdeviceptr z = a;
    void *args2[] = {&pair, &z};
    struct fake_node k1 = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args1};
    struct fake_node k2 = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .kern = (CUkernel)FAKE_KERN_B, .kernelParams = args2};
    struct fake_node ms = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = c + 4};
    struct fake_graph g = {.n = 3, .nodes = {&k1, &k2, &ms}};
    CUgraphExec exec = NULL;
    printf("inst_rc=%d\n", (int)GET(inst_fn, "cuGraphInstantiateWithFlags")(&exec, (CUgraph)&g, 0));
    printf("exec=%" PRIu64 "\n", (uint64_t)(uintptr_t)exec);
    glaunch_fn gl = GET(glaunch_fn, "cuGraphLaunch");
    gl(exec, (CUstream)0x42);
    gl(exec, (CUstream)0x42);
    gl((CUgraphExec)0x5555, NULL); /* never instantiated through us */
    return 0;
}

/* An executable graph's nodes changed in place (XLA's command buffers): each launch names the
 * blocks of the parameters the exec has now. Graph a..d: kernel (a, n, b), memset c, child graph
 * with kernel (d, n, 0). */
static int scenario_graph_update(void)
{
    typedef CUresult (*kset_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
    typedef CUresult (*kset1_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS_v1 *);
    typedef CUresult (*mset_fn)(CUgraphExec, CUgraphNode, const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
    typedef CUresult (*cset_fn)(CUgraphExec, CUgraphNode, CUgraph);
    typedef CUresult (*gset_fn)(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
    p_cuInit(0);
    CUdeviceptr a = must_alloc(1 << 16), b = must_alloc(1 << 16), c = must_alloc(1 << 16), d = must_alloc(1 << 16);
    int n = 5;
    CUdeviceptr x = a, y = b, zero = 0;
    void *args1[] = {&x, &n, &y}, *argsc[] = {&d, &n, &zero};
    struct fake_node k1 = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args1};
    struct fake_node ms = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = c};
    struct fake_node kc = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = argsc};
    struct fake_graph child = {.n = 1, .nodes = {&kc}}, empty = {.n = 0};
    struct fake_node cg = {.type = CU_GRAPH_NODE_TYPE_GRAPH, .child = &child};
    struct fake_graph g = {.n = 3, .nodes = {&k1, &ms, &cg}};
    CUgraphExec exec = NULL;
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&exec, (CUgraph)&g, 0);
    glaunch_fn gl = GET(glaunch_fn, "cuGraphLaunch");
    gl(exec, NULL); /* 1: a b c d */

    CUdeviceptr x2 = c + 8, y2 = d;
    void *args2[] = {&x2, &n, &y2};
    CUDA_KERNEL_NODE_PARAMS kp = {0};
    kp.func = FAKE_FUNC_A;
    kp.kernelParams = args2;
    printf("kset_rc=%d\n", (int)GET(kset_fn, "cuGraphExecKernelNodeSetParams")(exec, (CUgraphNode)&k1, &kp));
    CUDA_MEMSET_NODE_PARAMS mp = {0};
    mp.dst = a + 16;
    printf("mset_rc=%d\n", (int)GET(mset_fn, "cuGraphExecMemsetNodeSetParams")(exec, (CUgraphNode)&ms, &mp, NULL));
    printf("cset_rc=%d\n", (int)GET(cset_fn, "cuGraphExecChildGraphNodeSetParams")(exec, (CUgraphNode)&cg, (CUgraph)&empty));
    gl(exec, NULL); /* 2: c+8 d a+16 */

    CUdeviceptr x3 = b + 4, y3 = b + 8;
    void *args3[] = {&x3, &n, &y3};
    CUDA_KERNEL_NODE_PARAMS_v1 kp1 = {0};
    kp1.func = FAKE_FUNC_A;
    kp1.kernelParams = args3;
    kset1_fn set1 = (kset1_fn)get("cuGraphExecKernelNodeSetParams", 11000, CU_GET_PROC_ADDRESS_DEFAULT);
    printf("kset1_rc=%d\n", (int)set1(exec, (CUgraphNode)&k1, &kp1));
    printf("null1_rc=%d\n", (int)set1(exec, (CUgraphNode)&k1, NULL));
    printf("bad_rc=%d\n", (int)GET(mset_fn, "cuGraphExecMemsetNodeSetParams")(exec, (CUgraphNode)&k1, &mp, NULL));
    printf("null_rc=%d\n", (int)GET(kset_fn, "cuGraphExecKernelNodeSetParams")(exec, (CUgraphNode)&k1, NULL) +
                               (int)GET(mset_fn, "cuGraphExecMemsetNodeSetParams")(exec, (CUgraphNode)&ms, NULL, NULL) +
                               (int)GET(gset_fn, "cuGraphExecNodeSetParams")(exec, (CUgraphNode)&k1, NULL));
    gl(exec, NULL); /* 3: b+4 a+16 (the failed set changes nothing) */

    CUdeviceptr x4 = d + 32;
    void *args4[] = {&x4, &n, &zero};
    CUgraphNodeParams gp;
    memset(&gp, 0, sizeof gp);
    gp.type = CU_GRAPH_NODE_TYPE_KERNEL;
    gp.kernel.func = FAKE_FUNC_A;
    gp.kernel.kernelParams = args4;
    printf("gset_rc=%d\n", (int)GET(gset_fn, "cuGraphExecNodeSetParams")(exec, (CUgraphNode)&k1, &gp));
    gl(exec, NULL); /* 4: d+32 a+16 */

    struct fake_node bm = {.type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP}, cond = {.type = CU_GRAPH_NODE_TYPE_CONDITIONAL};
    struct fake_node host = {.type = CU_GRAPH_NODE_TYPE_HOST}, none = {.type = CU_GRAPH_NODE_TYPE_EMPTY};
    struct fake_graph g_bm = {.n = 1, .nodes = {&bm}}, g_cond = {.n = 2, .nodes = {&host, &cond}};
    struct fake_graph g_host = {.n = 2, .nodes = {&host, &none}};
    CUgraphExec e_bm = NULL, e_cond = NULL, e_host = NULL;
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e_bm, (CUgraph)&g_bm, 0);
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e_cond, (CUgraph)&g_cond, 0);
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e_host, (CUgraph)&g_host, 0);
    gl(e_bm, NULL);   /* 5: opaque (a batch memory op writes memory) */
    gl(e_cond, NULL); /* 6: opaque (a conditional's bodies cannot be read) */
    gl(e_host, NULL); /* 7: touches nothing */
    return 0;
}

/* Conditional nodes (C26): an IF node made by cuGraphAddNode (then: kernel on b; else: memset of
 * c+8 and a WHILE node, made through the 12.2 entry point, whose body runs a kernel on d) next
 * to a kernel on a. Launch 1 touches the union; after cuGraphDestroy the nodes are forgotten, and
 * a launch of an exec made from the same (fake) graph again is opaque. */
static int scenario_graph_cond(void)
{
    typedef CUresult (*add_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                               CUgraphNodeParams *);
    typedef CUresult (*add1_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
    typedef CUresult (*gdestroy_fn)(CUgraph);
    p_cuInit(0);
    CUdeviceptr a = must_alloc(1 << 16), b = must_alloc(1 << 16), c = must_alloc(1 << 16), d = must_alloc(1 << 16);
    int n = 5;
    CUdeviceptr zero = 0;
    void *args_a[] = {&a, &n, &zero}, *args_b[] = {&b, &n, &zero}, *args_d[] = {&d, &n, &zero};
    struct fake_node ka = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args_a};
    struct fake_node kb = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args_b};
    struct fake_node kd = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args_d};
    struct fake_node ms = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = c + 8};
    struct fake_graph g = {.n = 1, .nodes = {&ka}};
    CUgraphNodeParams ip, wp;
    memset(&ip, 0, sizeof ip);
    ip.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    ip.conditional.type = CU_GRAPH_COND_TYPE_IF;
    ip.conditional.size = 2;
    CUgraphNode in_node = NULL, while_node = NULL;
    printf("add_rc=%d\n", (int)GET(add_fn, "cuGraphAddNode")(&in_node, (CUgraph)&g, NULL, NULL, 0, &ip));
    struct fake_graph *then_g = (struct fake_graph *)ip.conditional.phGraph_out[0];
    struct fake_graph *else_g = (struct fake_graph *)ip.conditional.phGraph_out[1];
    then_g->nodes[then_g->n++] = &kb;
    else_g->nodes[else_g->n++] = &ms;
    memset(&wp, 0, sizeof wp);
    wp.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    wp.conditional.type = CU_GRAPH_COND_TYPE_WHILE;
    wp.conditional.size = 1;
    add1_fn add1 = (add1_fn)get("cuGraphAddNode", 12020, CU_GET_PROC_ADDRESS_DEFAULT);
    printf("add1_rc=%d\n", (int)add1(&while_node, (CUgraph)else_g, NULL, 0, &wp));
    struct fake_graph *loop_g = (struct fake_graph *)wp.conditional.phGraph_out[0];
    loop_g->nodes[loop_g->n++] = &kd;
    CUgraphExec e1 = NULL, e2 = NULL;
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e1, (CUgraph)&g, 0);
    glaunch_fn gl = GET(glaunch_fn, "cuGraphLaunch");
    gl(e1, NULL); /* 1: a b c+8 d */
    printf("destroy_rc=%d\n", (int)GET(gdestroy_fn, "cuGraphDestroy")((CUgraph)&g));
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e2, (CUgraph)&g, 0);
    gl(e2, NULL); /* 2: a, opaque */

    /* a conditional node destroyed alone: forgotten, the graph that still lists it opaque */
    typedef CUresult (*ndestroy_fn)(CUgraphNode);
    struct fake_graph g3 = {.n = 0};
    CUgraphNodeParams p3;
    memset(&p3, 0, sizeof p3);
    p3.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p3.conditional.size = 1;
    CUgraphNode n3 = NULL;
    GET(add_fn, "cuGraphAddNode")(&n3, (CUgraph)&g3, NULL, NULL, 0, &p3);
    struct fake_graph *b3 = (struct fake_graph *)p3.conditional.phGraph_out[0];
    b3->nodes[b3->n++] = &kb;
    CUgraphExec e3 = NULL, e4 = NULL;
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e3, (CUgraph)&g3, 0);
    gl(e3, NULL); /* 3: b, conditional */
    printf("ndestroy_rc=%d\n", (int)GET(ndestroy_fn, "cuGraphDestroyNode")(n3));
    GET(inst_fn, "cuGraphInstantiateWithFlags")(&e4, (CUgraph)&g3, 0);
    gl(e4, NULL); /* 4: opaque */
    return 0;
}

static int scenario_unhooked(void)
{
    void *legacy = get("cuMemAlloc", 3000, 0);
    void *modern = get("cuMemAlloc", 12000, 0);
    printf("legacy_is_fake=%d\n", legacy == dlsym(libcuda, "cuMemAlloc"));
    printf("modern_is_export=%d\n", modern == dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    for (int i = 0; i < 3; i++)
        get("cuMemcpy3DPeerAsync", 12080, 0);
    get("cuMemcpyBatchAsync", 12080, 0); /* hooked, at both versions: no note */
    get("cuMemcpyBatchAsync", 13000, 0);
    get("cuMemcpy3DBatchAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    get("cuMemAlloc", 3000, 0);
    get("cuLaunchHostFunc", 10000, 0); /* in the cuLaunch family, but host-only: no note */
    void *none = get("cuDoesNotExist", 12080, 0);
    printf("none=%d\n", none == NULL);
    void *unknown = get("cuDriverGetVersion", 12080, 0);
    printf("passthrough_is_fake=%d\n", unknown == dlsym(libcuda, "cuDriverGetVersion"));
    return 0;
}

/* Batched copies: cuMemcpyBatchAsync / cuMemcpy3DBatchAsync at 12080 (failIdx) and 13000 (none),
 * default and per-thread stream, each with its own shape; then refused batches. */
typedef CUresult (*batch12_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                               size_t *, CUstream);
typedef CUresult (*batch13_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                               CUstream);
typedef CUresult (*batch3d12_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, size_t *, unsigned long long, CUstream);
typedef CUresult (*batch3d13_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, unsigned long long, CUstream);

static CUmemcpy3DOperand ptr_operand(CUdeviceptr p, size_t row)
{
    CUmemcpy3DOperand o;
    memset(&o, 0, sizeof o);
    o.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    o.op.ptr.ptr = p;
    o.op.ptr.rowLength = row;
    return o;
}

static CUDA_MEMCPY3D_BATCH_OP op3d(CUdeviceptr dst, size_t drow, CUdeviceptr src, size_t srow, size_t w, size_t h)
{
    CUDA_MEMCPY3D_BATCH_OP o;
    memset(&o, 0, sizeof o);
    o.dst = ptr_operand(dst, drow);
    o.src = ptr_operand(src, srow);
    o.extent.width = w;
    o.extent.height = h;
    o.extent.depth = 1;
    o.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    return o;
}

#define HOSTP(p) ((CUdeviceptr)(uintptr_t)(p))

static int scenario_batch(void)
{
    p_cuInit(0);
    long long (*counter)(const char *) = (long long (*)(const char *))dlsym(libcuda, "fakeCounter");
    CUdeviceptr a = must_alloc(1 << 20), b = must_alloc(1 << 16), c = must_alloc(1 << 16);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    static char host[4096], host2[4096];
    printf("host=%" PRIu64 "\nhost2=%" PRIu64 "\n", (uint64_t)(uintptr_t)host, (uint64_t)(uintptr_t)host2);

    /* each (name, version, flags) gives the shim's export of the driver's versioned symbol */
    const cuuint64_t PT = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    batch12_fn b12 = (batch12_fn)get("cuMemcpyBatchAsync", 12080, 0);
    batch12_fn b12t = (batch12_fn)get("cuMemcpyBatchAsync", 12080, PT);
    batch13_fn b13 = (batch13_fn)get("cuMemcpyBatchAsync", 13000, 0);
    batch13_fn b13t = (batch13_fn)get("cuMemcpyBatchAsync", 13000, PT);
    batch3d12_fn t12 = (batch3d12_fn)get("cuMemcpy3DBatchAsync", 12080, 0);
    batch3d12_fn t12t = (batch3d12_fn)get("cuMemcpy3DBatchAsync", 12080, PT);
    batch3d13_fn t13 = (batch3d13_fn)get("cuMemcpy3DBatchAsync", 13000, 0);
    batch3d13_fn t13t = (batch3d13_fn)get("cuMemcpy3DBatchAsync", 13000, PT);
    const struct { const char *key, *sym; void *p; } eps[] = {
        {"b12", "cuMemcpyBatchAsync", (void *)b12}, {"b12t", "cuMemcpyBatchAsync_ptsz", (void *)b12t},
        {"b13", "cuMemcpyBatchAsync_v2", (void *)b13}, {"b13t", "cuMemcpyBatchAsync_v2_ptsz", (void *)b13t},
        {"t12", "cuMemcpy3DBatchAsync", (void *)t12}, {"t12t", "cuMemcpy3DBatchAsync_ptsz", (void *)t12t},
        {"t13", "cuMemcpy3DBatchAsync_v2", (void *)t13}, {"t13t", "cuMemcpy3DBatchAsync_v2_ptsz", (void *)t13t},
    };
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        printf("%s_is_export=%d\n", eps[i].key, eps[i].p && eps[i].p == dlsym(RTLD_DEFAULT, eps[i].sym));
        printf("%s_dlsym_is_export=%d\n", eps[i].key, dlsym(libcuda, eps[i].sym) == dlsym(RTLD_DEFAULT, eps[i].sym));
    }

    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t ai = 0;

    /* 1. 12.8: HtoD host -> a+64, DtoD b+16 -> c+32, DtoH a+128 -> host2 */
    CUdeviceptr d1[] = {a + 64, c + 32, HOSTP(host2)}, s1[] = {HOSTP(host), b + 16, a + 128};
    size_t z1[] = {100, 200, 300}, fail = 12345;
    printf("b12_rc=%d\n", (int)b12(d1, s1, z1, 3, &attr, &ai, 1, &fail, (CUstream)0x77));
    printf("b12_fail=%zu\nb12_stream=%lld\n", fail, counter("batch_stream"));
    /* 2. 13.0: b -> a+4096 */
    CUdeviceptr d2[] = {a + 4096}, s2[] = {b};
    size_t z2[] = {512};
    printf("b13_rc=%d\n", (int)b13(d2, s2, z2, 1, &attr, &ai, 1, (CUstream)0x78));
    printf("b13_stream=%lld\n", counter("batch_stream"));
    /* 3, 4. per-thread stream (NULL allowed): a -> c; c+8 -> host */
    CUdeviceptr d3[] = {c}, s3[] = {a};
    size_t z3[] = {8};
    fail = 12345;
    printf("b12t_rc=%d\n", (int)b12t(d3, s3, z3, 1, &attr, &ai, 1, &fail, NULL));
    printf("b12t_fail=%zu\n", fail);
    CUdeviceptr d4[] = {HOSTP(host)}, s4[] = {c + 8};
    size_t z4[] = {16};
    printf("b13t_rc=%d\n", (int)b13t(d4, s4, z4, 1, &attr, &ai, 1, NULL));
    /* 5. 3D at 12.8: a+1000 (rows of 256) -> b packed, 64 x 4; host -> c+100, 64 x 1 */
    CUDA_MEMCPY3D_BATCH_OP o5[] = {op3d(b, 0, a + 1000, 256, 64, 4), op3d(c + 100, 0, HOSTP(host), 0, 64, 1)};
    fail = 12345;
    printf("t12_rc=%d\n", (int)t12(2, o5, &fail, 0, (CUstream)0x79));
    printf("t12_fail=%zu\n", fail);
    /* 6. 3D at 13.0: c (rows of 64) -> host2, 32 x 2 */
    CUDA_MEMCPY3D_BATCH_OP o6[] = {op3d(HOSTP(host2), 0, c, 64, 32, 2)};
    printf("t13_rc=%d\n", (int)t13(1, o6, 0, (CUstream)0x7A));
    /* 7, 8. per-thread 3D: b+512 -> a, 16 x 1; a -> b+1024, 8 x 1 */
    CUDA_MEMCPY3D_BATCH_OP o7[] = {op3d(a, 0, b + 512, 0, 16, 1)}, o8[] = {op3d(b + 1024, 0, a, 0, 8, 1)};
    fail = 12345;
    printf("t12t_rc=%d\n", (int)t12t(1, o7, &fail, 0, NULL));
    printf("t13t_rc=%d\n", (int)t13t(1, o8, 0, NULL));

    /* refused by the driver: codes and failIdx unchanged, nothing recorded */
    size_t zbad[] = {100, 0};
    CUdeviceptr dbad[] = {a, b}, sbad[] = {b, c};
    fail = 12345;
    printf("bad12_rc=%d\n", (int)b12(dbad, sbad, zbad, 2, &attr, &ai, 1, &fail, (CUstream)0x77));
    printf("bad12_fail=%zu\n", fail);
    printf("bad13_rc=%d\n", (int)b13(d2, s2, z2, 1, &attr, &ai, 1, NULL)); /* legacy NULL stream */
    CUDA_MEMCPY3D_BATCH_OP obad[] = {op3d(b, 0, a, 0, 8, 1), op3d(c, 0, a, 0, 0, 1)};
    fail = 12345;
    printf("bad3d_rc=%d\n", (int)t12(2, obad, &fail, 0, (CUstream)0x79));
    printf("bad3d_fail=%zu\n", fail);

    const char *names[] = {"batch_calls", "batch_calls_ptsz", "batch_calls_v2", "batch_calls_v2_ptsz", "batch3d_calls",
                           "batch3d_calls_ptsz", "batch3d_calls_v2", "batch3d_calls_v2_ptsz", "batch_copies"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        printf("%s=%lld\n", names[i], counter(names[i]));
    return 0;
}

static int scenario_next(void)
{
    /* dlsym(RTLD_NEXT) from the program must search after the program, not after the shim */
    printf("next_puts_ok=%d\n", dlsym(RTLD_NEXT, "puts") == dlsym(RTLD_DEFAULT, "puts"));
    printf("next_missing_null=%d\n", dlsym(RTLD_NEXT, "no_such_symbol_anywhere") == NULL);
    return 0;
}

static int scenario_fork(void)
{
    p_cuInit(0);
    CUdeviceptr a = must_alloc(4096);
    launch_a(a, 0, 0);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr c = must_alloc(8192);
        launch_a(c, 0, a); /* a is the parent's: unknown here */
        printf("child_pid=%d\nchild_c=%" PRIu64 "\n", (int)getpid(), (uint64_t)c);
        fflush(stdout);
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    CUdeviceptr b = must_alloc(4096);
    launch_a(b, 0, 0);
    printf("parent_pid=%d\nchild_status=%d\n", (int)getpid(), st);
    return 0;
}

static int scenario_flood(int n)
{
    p_cuInit(0);
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = must_alloc(256);
        p_free(p);
    }
    return 0;
}

/* Pinned and registered host memory (host blocks) and launches attributed to them, to device
 * blocks, and to an address the driver knows in no recorded block (unattributed). */
typedef CUresult (*host_alloc_fn)(void **, size_t, unsigned int);
typedef CUresult (*alloc_host_fn)(void **, size_t);
typedef CUresult (*free_host_fn)(void *);
typedef CUresult (*host_register_fn)(void *, size_t, unsigned int);
typedef CUresult (*host_devptr_fn)(CUdeviceptr *, void *, unsigned int);
static long long counter(const char *name)
{
    long long (*c)(const char *) = (long long (*)(const char *))dlsym(libcuda, "fakeCounter");
    return c ? c(name) : -1;
}
static int scenario_hostmem(void)
{
    p_cuInit(0);
    CUdeviceptr dev = must_alloc(4096);
    void *pinned = NULL, *small = NULL, *reg = aligned_alloc(4096, 16384);
    printf("host_alloc_rc=%d\n", (int)GET(host_alloc_fn, "cuMemHostAlloc")(&pinned, 8192, 0));
    printf("alloc_host_rc=%d\n", (int)GET(alloc_host_fn, "cuMemAllocHost")(&small, 4096));
    printf("register_rc=%d\n", (int)GET(host_register_fn, "cuMemHostRegister")(reg, 16384, 0));
    CUdeviceptr alias = 0;
    printf("devptr_rc=%d\n", (int)GET(host_devptr_fn, "cuMemHostGetDevicePointer")(&alias, (char *)pinned + 512, 0));
    printf("dev=%" PRIu64 "\npinned=%" PRIu64 "\nsmall=%" PRIu64 "\nreg=%" PRIu64 "\nalias=%" PRIu64 "\n",
           (uint64_t)dev, (uint64_t)(uintptr_t)pinned, (uint64_t)(uintptr_t)small, (uint64_t)(uintptr_t)reg,
           (uint64_t)alias);
    CUdeviceptr hidden = 0;
    fakeAllocHidden(&hidden, 4096); /* device memory the shim never saw allocated */
    printf("hidden=%" PRIu64 "\n", (uint64_t)hidden);

    launch_a((CUdeviceptr)(uintptr_t)pinned + 64, 1, (CUdeviceptr)(uintptr_t)small); /* 1: host only */
    launch_a(dev, 2, (CUdeviceptr)(uintptr_t)reg + 8);                                 /* 2: device + host */
    launch_a(alias - 512 + 16, 3, 0);                                                  /* 3: the alias, host only */
    printf("queries_before=%lld\n", counter("pointer_queries"));
    for (int i = 0; i < 3; i++)
        launch_a(hidden + (CUdeviceptr)i * 8, 4, dev); /* 4..6: unattributed; asked once */
    printf("queries_hidden=%lld\n", counter("pointer_queries"));
    /* 7, 8: a word the driver does not know at offset 0 of kernel_b: asked once, not an address */
    launch_ex_fn ex = GET(launch_ex_fn, "cuLaunchKernelEx");
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    for (int i = 0; i < 2; i++) {
        struct { CUdeviceptr p, q; } pair = {0x123456789ull + (CUdeviceptr)i, dev};
        CUdeviceptr third = 0;
        void *args[] = {&pair, &third};
        ex(&cfg, FAKE_KERN_B, args, NULL);
    }
    printf("queries_after=%lld\n", counter("pointer_queries"));

    printf("free_pinned_rc=%d\n", (int)GET(free_host_fn, "cuMemFreeHost")(pinned));
    printf("free_small_rc=%d\n", (int)GET(free_host_fn, "cuMemFreeHost")(small));
    printf("unregister_rc=%d\n", (int)GET(free_host_fn, "cuMemHostUnregister")(reg));
    free(reg);
    p_free(dev);
    return 0;
}

static CUdeviceptr g_shared;
static int g_per_thread;

static void *thread_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < g_per_thread; i++)
        launch_a(g_shared + (CUdeviceptr)(i % 64) * 8, i, 0);
    return NULL;
}

static int scenario_threads(int threads, int per_thread)
{
    p_cuInit(0);
    g_shared = must_alloc(1 << 20);
    g_per_thread = per_thread;
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, thread_main, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return 0;
}

/* GPU clock samples (native/gpuclock.c): n kernels on stream 0x77, n on a stream that is
 * capturing a graph, n more on 0x77, n through the per-thread entry point on the NULL stream. */
static int scenario_gpuclock(int n)
{
    typedef CUresult (*begin_fn)(CUstream, CUstreamCaptureMode);
    typedef CUresult (*end_fn)(CUstream, CUgraph *);
    typedef long long (*counter_fn)(const char *);
    begin_fn begin = GET(begin_fn, "cuStreamBeginCapture");
    end_fn end = GET(end_fn, "cuStreamEndCapture");
    launch_fn ptsz = (launch_fn)get("cuLaunchKernel", 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    counter_fn counter = (counter_fn)dlsym(libcuda, "fakeCounter");
    p_cuInit(0);
    CUdeviceptr x = must_alloc(4096);
    for (int i = 0; i < n; i++)
        launch_a(x, 0, 0);
    CUstream cap = (CUstream)0x99;
    begin(cap, CU_STREAM_CAPTURE_MODE_GLOBAL);
    for (int i = 0; i < n; i++) {
        int k = 0;
        void *args[] = {&x, &k, &x};
        p_launch(FAKE_FUNC_A, 1, 1, 1, 1, 1, 1, 0, cap, args, NULL);
    }
    end(cap, NULL);
    for (int i = 0; i < n; i++)
        launch_a(x, 0, 0);
    for (int i = 0; i < n; i++) {
        int k = 0;
        void *args[] = {&x, &k, &x};
        ptsz(FAKE_FUNC_A, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
    }
    printf("capture_violations=%lld\nlegacy_records=%lld\n", counter("capture_violations"), counter("legacy_records"));
    return 0;
}

/* A full pool: n kernels on a stream that runs nothing until they are all issued. */
static int scenario_gpuclock_pool(int n)
{
    typedef long long (*counter_fn)(const char *);
    typedef void (*hold_fn)(CUstream, int);
    counter_fn counter = (counter_fn)dlsym(libcuda, "fakeCounter");
    hold_fn hold = (hold_fn)dlsym(libcuda, "fakeHold");
    p_cuInit(0);
    CUdeviceptr x = must_alloc(4096);
    hold((CUstream)0x77, 1);
    for (int i = 0; i < n; i++)
        launch_a(x, 0, 0);
    printf("events_live=%lld\n", counter("events_live"));
    hold((CUstream)0x77, 0);
    return 0;
}

/* The GPU clock's adaptive interval: `bursts` bursts of n kernels on stream 0x77, `ms` apart (the
 * poller reads each burst's samples in the pause after it). */
static int scenario_gpuclock_bursts(int bursts, int n, int ms)
{
    p_cuInit(0);
    CUdeviceptr x = must_alloc(4096);
    for (int b = 0; b < bursts; b++) {
        for (int i = 0; i < n; i++)
            launch_a(x, 0, 0);
        usleep((useconds_t)ms * 1000);
    }
    return 0;
}

/* A training loop for the live view: a persistent block, then per step an input copy, two
 * launches and a copy back through a transient block, `ms` milliseconds apart. */
static int scenario_steps(int steps, int ms)
{
    p_cuInit(0);
    CUdeviceptr weights = must_alloc(8 << 20);
    char host[64] = {0};
    htod_fn htod = GET(htod_fn, "cuMemcpyHtoD");
    dtoh_fn dtoh = GET(dtoh_fn, "cuMemcpyDtoH");
    for (int i = 0; i < steps; i++) {
        CUdeviceptr act = must_alloc(2 << 20);
        htod(act, host, sizeof host);
        launch_a(weights, i, act);
        launch_a(act, i, weights);
        dtoh(host, act, 8);
        p_free(act);
        printf("step=%d\n", i);
        fflush(stdout);
        usleep((useconds_t)ms * 1000);
    }
    return 0;
}

/* A module unloaded and another loaded: cuModuleGetFunction hands out the same handle for a
 * kernel of one pointer parameter. Its argument array has one entry; the word after it points
 * nowhere: a stale 3-parameter layout would read through it. Before the unload, the handle
 * handed out again is the same kernel (cuDNN asks for its handles before every launch). */
static int scenario_reuse(const char *freer)
{
    typedef CUresult (*get_fn)(CUfunction *, CUmodule, const char *);
    typedef CUresult (*unload_fn)(void *); /* CUmodule, CUlibrary or CUdevice (0) */
    get_fn getf = GET(get_fn, "cuModuleGetFunction");
    unload_fn unload = GET(unload_fn, freer);
    p_cuInit(0);
    CUdeviceptr x = must_alloc(4096), y = must_alloc(4096);
    CUfunction f = NULL;
    printf("get3_rc=%d\n", (int)getf(&f, (CUmodule)0x1, "r3"));
    int k = 0;
    void *args3[] = {&x, &k, &y};
    printf("launch3_rc=%d\n", (int)p_launch(f, 1, 1, 1, 1, 1, 1, 0, 0, args3, NULL));
    int q = fakeParamQueries();
    getf(&f, (CUmodule)0x1, "r3");
    printf("regets_queries=%d\n", fakeParamQueries() - q);
    printf("unload_rc=%d\n", unload ? (int)unload(strcmp(freer, "cuDevicePrimaryCtxReset") ? (void *)0x1 : NULL) : -1);
    printf("get1_rc=%d\n", (int)getf(&f, (CUmodule)0x2, "r1"));
    struct { void *args[1]; void *poison[2]; } one = {{&y}, {(void *)0x10, (void *)0x10}};
    printf("launch1_rc=%d\n", (int)p_launch(f, 1, 1, 1, 1, 1, 1, 0, 0, one.args, NULL));
    printf("x=%llu\ny=%llu\n", (unsigned long long)x, (unsigned long long)y);
    return 0;
}

/* A foreach kernel (PyTorch's multi_tensor_apply): one struct argument of tensor addresses, up to
 * 150 of them (depth 5 x 30). Launch 1 names 150 blocks, launch 2 names 300 (more than the shim
 * keeps: TRUNCATED). */
static int scenario_foreach(void)
{
    p_cuInit(0);
    enum { N = 300 };
    static CUdeviceptr ptrs[N];
    for (int i = 0; i < N; i++)
        ptrs[i] = must_alloc(4096) + 8 * (i % 7);
    for (int k = 0; k < 2; k++) {
        size_t size = (k ? N : 150) * sizeof(CUdeviceptr);
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, ptrs, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
        printf("launch%d_rc=%d\n", k + 1, (int)p_launch(FAKE_FUNC_C, 1, 1, 1, 1, 1, 1, 0, (CUstream)0x77, NULL, extra));
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setup();
    const char *s = argv[1];
    int rc = 2;
    if (!strcmp(s, "basic"))
        rc = scenario_basic();
    else if (!strcmp(s, "untracked"))
        rc = scenario_untracked();
    else if (!strcmp(s, "async"))
        rc = scenario_async();
    else if (!strcmp(s, "vmm"))
        rc = scenario_vmm();
    else if (!strcmp(s, "graph"))
        rc = scenario_graph();
    else if (!strcmp(s, "graph_update"))
        rc = scenario_graph_update();
    else if (!strcmp(s, "graph_cond"))
        rc = scenario_graph_cond();
    else if (!strcmp(s, "unhooked"))
        rc = scenario_unhooked();
    else if (!strcmp(s, "batch"))
        rc = scenario_batch();
    else if (!strcmp(s, "foreach"))
        rc = scenario_foreach();
    else if (!strcmp(s, "next"))
        rc = scenario_next();
    else if (!strcmp(s, "fork"))
        rc = scenario_fork();
    else if (!strcmp(s, "flood"))
        rc = scenario_flood(argc > 2 ? atoi(argv[2]) : 1000);
    else if (!strcmp(s, "reuse"))
        rc = scenario_reuse(argc > 2 ? argv[2] : "cuModuleUnload");
    else if (!strcmp(s, "hostmem"))
        rc = scenario_hostmem();
    else if (!strcmp(s, "steps"))
        rc = scenario_steps(argc > 2 ? atoi(argv[2]) : 10, argc > 3 ? atoi(argv[3]) : 0);
    else if (!strcmp(s, "threads"))
        rc = scenario_threads(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atoi(argv[3]) : 10000);
    else if (!strcmp(s, "gpuclock"))
        rc = scenario_gpuclock(argc > 2 ? atoi(argv[2]) : 10);
    else if (!strcmp(s, "gpuclock_pool"))
        rc = scenario_gpuclock_pool(argc > 2 ? atoi(argv[2]) : 100);
    else if (!strcmp(s, "gpuclock_bursts"))
        rc = scenario_gpuclock_bursts(argc > 2 ? atoi(argv[2]) : 6, argc > 3 ? atoi(argv[3]) : 512,
                                      argc > 4 ? atoi(argv[4]) : 30);
    printf("done=1\n");
    return rc;
}
