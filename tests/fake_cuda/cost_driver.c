/*
 * The shim's cost per op kind on the fake libcuda: one op kind called N times through the
 * entry points cuGetProcAddress hands out (as a CUDA runtime gets them), with L live blocks in
 * the table. Run it under `valgrind --tool=callgrind` with and without the shim preloaded, at two
 * values of N: the difference of the differences over the extra calls is the instructions the
 * shim adds per call (scripts/shim_cost.py). tests/test_shim_cost.py checks the records it makes.
 *
 *     cost_driver OP N L      OP: launch, launch_ex, memcpy_async, htod_async, memset_async,
 *                                 alloc_free_async, launch_vs_alloc, launch_struct, launch_foreach,
 *                                 launch_rot, get_function, launch_offsets
 *
 * COST_EVICT_KB=K: after each op the driver writes K KiB of its own memory, as the real driver's
 * few µs of work per launch do, so that a self-timing shim (scripts/shim_cost.py --time) times
 * its path with the caches about as cold as they are on a GPU host.
 *
 * launch_struct: a kernel without a layout whose packed argument buffer (`extra`) is 512 bytes,
 * like a framework's elementwise kernels that take a struct of sizes and strides by value: two
 * pointers, then 62 words that are no address.
 *
 * launch_foreach: a foreach kernel (FAKE_FUNC_T) naming 150 addresses, as PyTorch's
 * multi_tensor_apply does: in 120 distinct blocks (the last 30 fall in the first 30 blocks again,
 * at other offsets); the live blocks are at least 152 then.
 *
 * launch_rot: as launch, but its two pointers move over the first live blocks from launch to launch
 * (as a training step's do): the block lookups' branches cannot be learnt.
 *
 * launch_offsets: a kernel with a known layout taking a 1,200-byte struct by value, like PyTorch's
 * elementwise kernels' OffsetCalculator: two pointers, then 148 words of uint32 sizes and strides
 * in pairs (no address; not small integers either: each one's slot of the layout is read).
 *
 * get_function: cuModuleGetFunction of a kernel launched once before (cuDNN asks for its kernels'
 * handles ~180 times a step): the shim checks the handle's cached layout is current.
 *
 * launch_vs_alloc: N launches on two VMM mappings (above every cuMemAlloc address) while another
 * thread allocates 4,096 blocks twice and frees them: the table grows past its first array, and
 * each insertion and removal moves the two launched blocks' entries under the launches' lock-free
 * lookups.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*get_function_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*copy_async_fn)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
typedef CUresult (*htod_async_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*memset32a_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);

static gpa_fn gpa;

static char *g_evict;
static size_t g_evict_bytes;

/* COST_EVICT_KB: write that much memory, one store per cache line. */
static void evict(void)
{
    for (size_t i = 0; i < g_evict_bytes; i += 64)
        g_evict[i]++;
    __asm__ volatile("" ::: "memory");
}
#define EACH(call) \
    do {           \
        call;      \
        evict();   \
    } while (0)

static void *get(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !p) {
        printf("error=no %s\n", name);
        exit(3);
    }
    return p;
}

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        printf("error=%s %d\n", what, (int)r);
        exit(4);
    }
}

#define CHURN_BLOCKS 4096
#define FOREACH_BLOCKS 120
static void *churn(void *arg)
{
    alloc_fn alloc = (alloc_fn)get("cuMemAlloc");
    free_fn fr = (free_fn)get("cuMemFree");
    static CUdeviceptr p[CHURN_BLOCKS];
    (void)arg;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < CHURN_BLOCKS; i++)
            check(alloc(&p[i], 4096), "churn alloc");
        for (int i = 0; i < CHURN_BLOCKS; i++)
            check(fr(p[i]), "churn free");
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: cost_driver OP N LIVE_BLOCKS\n");
        return 2;
    }
    const char *op = argv[1];
    long n = atol(argv[2]), live = atol(argv[3]);
    const char *ek = getenv("COST_EVICT_KB");
    g_evict_bytes = ek ? (size_t)atol(ek) * 1024 : 0;
    g_evict = g_evict_bytes ? calloc(1, g_evict_bytes) : NULL;
    if ((!strcmp(op, "launch_foreach") || !strcmp(op, "launch_rot")) && live < FAKE_T_PTRS + 2)
        live = FAKE_T_PTRS + 2;
    void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda) {
        printf("error=%s\n", dlerror());
        return 3;
    }
    gpa = (gpa_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    check(((init_fn)get("cuInit"))(0), "cuInit");
    alloc_fn alloc = (alloc_fn)get("cuMemAlloc");

    /* The live blocks: the two the ops touch sit in the middle of the table (launch_vs_alloc: at
     * its top, as VMM mappings). */
    int vmm = !strcmp(op, "launch_vs_alloc");
    CUdeviceptr a = 0, b = 0, other = 0;
    static CUdeviceptr first[FAKE_T_PTRS]; /* the first live blocks (launch_foreach) */
    long n_first = 0;
    for (long i = 0; i < live / 2; i++) {
        check(alloc(&other, 4096), "alloc");
        if (n_first < FAKE_T_PTRS)
            first[n_first++] = other;
    }
    if (vmm) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle h[2];
        check(((reserve_fn)get("cuMemAddressReserve"))(&a, 4 << 20, 0, 0, 0), "reserve");
        b = a + (2 << 20);
        for (int i = 0; i < 2; i++) {
            check(((create_fn)get("cuMemCreate"))(&h[i], 2 << 20, &prop, 0), "create");
            check(((map_fn)get("cuMemMap"))(i ? b : a, 2 << 20, 0, h[i], 0), "map");
        }
    } else {
        check(alloc(&a, 1 << 20), "alloc");
        check(alloc(&b, 1 << 20), "alloc");
    }
    for (long i = live / 2 + 2; i < live; i++) {
        check(alloc(&other, 4096), "alloc");
        if (n_first < FAKE_T_PTRS)
            first[n_first++] = other;
    }

    CUstream s = (CUstream)0x77;
    CUdeviceptr x = a + 256, y = b;
    int k = 7;
    void *args[] = {&x, &k, &y};
    struct { CUdeviceptr p, q; } pair = {b + 16, a + 1000};
    CUdeviceptr third = a;
    void *args_b[] = {&pair, &third};
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 128;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = s;
    char host[256] = {0};

    if (!strcmp(op, "launch")) {
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        for (long i = 0; i < n; i++)
            EACH(check(f(FAKE_FUNC_A, 2, 1, 1, 128, 1, 1, 0, s, args, NULL), "launch"));
    } else if (!strcmp(op, "launch_ex")) {
        launch_ex_fn f = (launch_ex_fn)get("cuLaunchKernelEx");
        for (long i = 0; i < n; i++)
            EACH(check(f(&cfg, FAKE_KERN_B, args_b, NULL), "launch_ex"));
    } else if (!strcmp(op, "memcpy_async")) {
        copy_async_fn f = (copy_async_fn)get("cuMemcpyAsync");
        for (long i = 0; i < n; i++)
            EACH(check(f(b, a, 4096, s), "memcpy_async"));
    } else if (!strcmp(op, "htod_async")) {
        htod_async_fn f = (htod_async_fn)get("cuMemcpyHtoDAsync");
        for (long i = 0; i < n; i++)
            EACH(check(f(a + 64, host, sizeof host, s), "htod_async"));
    } else if (!strcmp(op, "memset_async")) {
        memset32a_fn f = (memset32a_fn)get("cuMemsetD32Async");
        for (long i = 0; i < n; i++)
            EACH(check(f(b, 0, 1024, s), "memset_async"));
    } else if (!strcmp(op, "alloc_free_async")) {
        alloc_async_fn aa = (alloc_async_fn)get("cuMemAllocAsync");
        free_async_fn fa = (free_async_fn)get("cuMemFreeAsync");
        for (long i = 0; i < n; i++) {
            CUdeviceptr p = 0;
            check(aa(&p, 8192, s), "alloc_async");
            check(fa(p, s), "free_async");
        }
    } else if (!strcmp(op, "launch_struct")) {
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        uint64_t packed[64];
        packed[0] = a + 256;
        packed[1] = b;
        for (int i = 2; i < 64; i++)
            packed[i] = (i & 1) ? (uint64_t)i * 4096 : 0x3f8000003f800000ull; /* strides; floats */
        size_t size = sizeof packed;
        void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        for (long i = 0; i < n; i++)
            EACH(check(f(FAKE_FUNC_C, 2, 1, 1, 128, 1, 1, 0, s, NULL, extra), "launch_struct"));
    } else if (!strcmp(op, "launch_foreach")) {
        /* int @0, then FAKE_T_PTRS addresses @8, in the first FOREACH_BLOCKS live blocks (4 KiB
         * each), at an offset inside */
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        struct { int n; CUdeviceptr p[FAKE_T_PTRS]; } targ;
        targ.n = FAKE_T_PTRS;
        for (int i = 0; i < FAKE_T_PTRS; i++)
            targ.p[i] = first[i % FOREACH_BLOCKS] + 8 * (i % 7);
        void *args_t[] = {&targ.n, targ.p};
        for (long i = 0; i < n; i++)
            EACH(check(f(FAKE_FUNC_T, 1, 1, 1, 128, 1, 1, 0, s, args_t, NULL), "launch_foreach"));
    } else if (!strcmp(op, "launch_rot")) {
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        for (long i = 0; i < n; i++) {
            x = first[i % FAKE_T_PTRS] + 64;
            y = first[(i * 37 + 11) % FAKE_T_PTRS];
            EACH(check(f(FAKE_FUNC_A, 2, 1, 1, 128, 1, 1, 0, s, args, NULL), "launch_rot"));
        }
    } else if (!strcmp(op, "launch_offsets")) {
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        struct { int n; uint64_t w[FAKE_T_PTRS]; } targ; /* FAKE_FUNC_T's layout: int @0, 1,200 bytes @8 */
        targ.n = 1;
        targ.w[0] = a + 256;
        targ.w[1] = b;
        for (int i = 2; i < FAKE_T_PTRS; i++)
            targ.w[i] = ((uint64_t)(i + 1) << 32) | (uint32_t)(i * 4096);
        void *args_t[] = {&targ.n, targ.w};
        for (long i = 0; i < n; i++)
            EACH(check(f(FAKE_FUNC_T, 1, 1, 1, 128, 1, 1, 0, s, args_t, NULL), "launch_offsets"));
    } else if (!strcmp(op, "get_function")) {
        get_function_fn g = (get_function_fn)get("cuModuleGetFunction");
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        CUfunction r = NULL;
        check(g(&r, (CUmodule)0x99, "r3"), "get_function");
        check(f(r, 1, 1, 1, 128, 1, 1, 0, s, args, NULL), "launch"); /* its layout is cached now */
        for (long i = 0; i < n; i++)
            EACH(check(g(&r, (CUmodule)0x99, "r3"), "get_function"));
    } else if (!strcmp(op, "launch_vs_alloc")) {
        launch_fn f = (launch_fn)get("cuLaunchKernel");
        pthread_t t;
        pthread_create(&t, NULL, churn, NULL);
        for (long i = 0; i < n; i++)
            check(f(FAKE_FUNC_A, 2, 1, 1, 128, 1, 1, 0, s, args, NULL), "launch");
        pthread_join(t, NULL);
    } else {
        fprintf(stderr, "unknown op %s\n", op);
        return 2;
    }
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\ndone=1\n", (uint64_t)a, (uint64_t)b);
    return 0;
}
