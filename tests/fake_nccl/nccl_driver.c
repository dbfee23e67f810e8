/*
 * NCCL test driver (tests/test_nccl.py, tests/test_ranks.py): a CUDA program on the fake libcuda
 * (entry points through cuGetProcAddress, as a runtime) that calls the fake libnccl. Built twice:
 * with -DLINKED against libnccl.so.2 (calls bind to the exported names, as PyTorch's do), and
 * without, reaching libnccl with dlopen (argv[2]: "global", "local" (RTLD_LOCAL, then
 * dlsym(handle)) or "absent" (never loaded)). Results are "key=value" lines.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "fake_nccl.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

#define S1 ((cudaStream_t)0x77)
#define FUNC_A ((CUfunction)0x1000) /* the fake's kernel_a: (ptr, int, ptr) */
#define MIB ((size_t)1 << 20)

static gpa_fn gpa;
static alloc_fn p_alloc;
static htod_fn p_htod;
static dtoh_fn p_dtoh;
static launch_fn p_launch;

static void *get(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    return gpa(name, &p, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS ? p : NULL;
}

#ifdef LINKED
#define NCCL(name) (&name)
#else
static void *nccl = RTLD_DEFAULT; /* where the NCCL functions are looked up */
#define NCCL(name) ((__typeof__(&name))must_sym(#name))
static void *must_sym(const char *name)
{
    void *p = dlsym(nccl, name);
    if (!p) {
        printf("error=no %s\n", name);
        exit(6);
    }
    return p;
}
#endif

static void setup(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        exit(3);
    gpa = (gpa_fn)dlsym(lib, "cuGetProcAddress_v2");
    ((CUresult(*)(unsigned))get("cuInit"))(0);
    p_alloc = (alloc_fn)get("cuMemAlloc");
    p_htod = (htod_fn)get("cuMemcpyHtoD");
    p_dtoh = (dtoh_fn)get("cuMemcpyDtoH");
    p_launch = (launch_fn)get("cuLaunchKernel");
}

static CUdeviceptr must_alloc(size_t n)
{
    CUdeviceptr p = 0;
    if (p_alloc(&p, n) != CUDA_SUCCESS) {
        printf("error=alloc\n");
        exit(4);
    }
    return p;
}

static void touch(CUdeviceptr x) /* kernel_a(x, 0, 0) */
{
    int n = 0;
    CUdeviceptr zero = 0;
    void *args[] = {&x, &n, &zero};
    p_launch(FUNC_A, 1, 1, 1, 1, 1, 1, 0, (CUstream)S1, args, NULL);
}

static void fill(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 7 + seed);
    p_htod(p, h, n);
    free(h);
}

static long check(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char *h = calloc(1, n);
    long bad = p_dtoh(h, p, n) == CUDA_SUCCESS ? 0 : (long)n;
    for (size_t i = 0; !bad && i < n; i++)
        bad += h[i] != (unsigned char)(i * 7 + seed);
    free(h);
    return bad;
}

/* Every hooked call once, on buffers inside two blocks; results printed in order. */
static int scenario_calls(void)
{
    CUdeviceptr a = must_alloc(MIB), b = must_alloc(MIB);
    touch(a);
    touch(b);
    char *A = (char *)(uintptr_t)a, *B = (char *)(uintptr_t)b;
    ncclComm_t comm = NCCL(fakeNcclComm)(1, 4, 0), other = NCCL(fakeNcclComm)(0, 2, 0);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\ncomm=%" PRIu64 "\nother=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b,
           (uint64_t)(uintptr_t)comm, (uint64_t)(uintptr_t)other);
    printf("rc_allreduce=%d\n", NCCL(ncclAllReduce)(A + 64, B + 128, 1000, ncclFloat32, ncclSum, comm, S1));
    printf("rc_broadcast=%d\n", NCCL(ncclBroadcast)(A, B, 10, ncclBfloat16, 3, comm, S1));
    printf("rc_bcast=%d\n", NCCL(ncclBcast)(B + 8, 5, ncclFloat64, 2, comm, S1));
    printf("rc_reduce=%d\n", NCCL(ncclReduce)(A, B, 7, ncclInt32, ncclMax, 1, comm, S1));
    printf("rc_allgather=%d\n", NCCL(ncclAllGather)(A + 256, B, 100, ncclFloat16, comm, S1));
    printf("rc_reducescatter=%d\n", NCCL(ncclReduceScatter)(A, B + 512, 100, ncclFloat16, ncclSum, other, S1));
    printf("rc_alltoall=%d\n", NCCL(ncclAlltoAll)(A, B, 3, ncclInt8, comm, S1));
    printf("rc_gather=%d\n", NCCL(ncclGather)(A, B, 4, ncclInt8, 0, comm, S1));
    printf("rc_scatter=%d\n", NCCL(ncclScatter)(A, B, 4, ncclInt8, 2, comm, S1));
    printf("rc_send=%d\n", NCCL(ncclSend)(A + 1024, 16, ncclFloat32, 3, comm, S1));
    printf("rc_recv=%d\n", NCCL(ncclRecv)(B + 2048, 16, ncclFloat32, 0, comm, S1));
    printf("rc_allreduce_config=%d\n",
           NCCL(ncclAllReduceConfig)(A, A, 2, 12345, ncclSum, comm, S1, (const ncclCollConfig_t *)0x5151));
    void *handle = NULL;
    printf("rc_register=%d\n", NCCL(ncclCommRegister)(comm, B, MIB, &handle));
    printf("handle=%" PRIu64 "\n", (uint64_t)(uintptr_t)handle);
    ncclWindow_t win = NULL;
    printf("rc_window=%d\n", NCCL(ncclCommWindowRegister)(comm, A + 4096, 8192, &win, 1));
    printf("win=%" PRIu64 "\n", (uint64_t)(uintptr_t)win);
    void *m = NULL;
    printf("rc_memalloc=%d\n", NCCL(ncclMemAlloc)(&m, 3 * MIB));
    printf("m=%" PRIu64 "\n", (uint64_t)(uintptr_t)m);
    printf("rc_host=%d\n", NCCL(ncclAllReduce)(&handle, &handle, 1, ncclInt8, ncclSum, comm, S1)); /* in no block */
    return 0;
}

/* Swap mode, budget of two 2 MiB blocks: a is swapped out to make room for c; an all-reduce on a
 * brings it back before NCCL sees it, and a stays resident however tight the budget gets. */
static int scenario_swap(void)
{
    long (*advance)(long) = (long (*)(long))dlsym(RTLD_DEFAULT, "fakeAdvance");
    long long (*access)(CUdeviceptr) = (long long (*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "fakeAccess");
    long long (*counter)(const char *) = (long long (*)(const char *))dlsym(RTLD_DEFAULT, "fakeCounter");
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    touch(a);
    touch(b);
    CUdeviceptr c = must_alloc(2 * MIB); /* over the budget: a (least recently used) goes */
    printf("c=%" PRIu64 "\n", (uint64_t)c);
    for (int i = 0; i < 4 && access(a) != -1; i++) {
        advance(-1);
        touch(c); /* the copy done, the release happens at the next op */
    }
    printf("a_out=%d\n", access(a) == -1);
    ncclComm_t comm = NCCL(fakeNcclComm)(0, 2, 0);
    char *A = (char *)(uintptr_t)a;
    printf("rc_allreduce=%d\n", NCCL(ncclAllReduce)(A + 64, A + 64, 256, ncclFloat32, ncclSum, comm, S1));
    printf("a_in=%d\n", access(a) != -1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1));
    for (int i = 0; i < 3; i++) { /* more pressure: never a again */
        CUdeviceptr d = must_alloc(2 * MIB);
        fill(d, 2 * MIB, 9);
        touch(d);
        advance(-1);
        touch(c);
    }
    advance(-1);
    touch(c);
    printf("a_still_in=%d\n", access(a) != -1);
    printf("bad_a_end=%ld\n", check(a, 2 * MIB, 1));
    printf("faults=%lld\n", counter("faults"));
    return 0;
}

/* Just initialise and allocate (the PROCESS record's rank fields). */
static int scenario_init(void)
{
    CUdeviceptr a = must_alloc(MIB);
    touch(a);
    printf("pid=%d\n", (int)getpid());
    return 0;
}

#ifndef LINKED
/* No libnccl in the process: a probe for an NCCL function finds none, with the shim loaded. */
static int scenario_absent(void)
{
    dlerror();
    void *p = dlsym(RTLD_DEFAULT, "ncclAllReduce");
    const char *err = dlerror();
    printf("found=%d\nerror_set=%d\n", p != NULL, err != NULL);
    printf("found_memalloc=%d\n", dlsym(RTLD_DEFAULT, "ncclMemAlloc") != NULL);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setup();
#ifndef LINKED
    const char *how = argc > 2 ? argv[2] : "global";
    if (!strcmp(argv[1], "absent"))
        return scenario_absent(), printf("done=1\n"), 0;
    nccl = dlopen("libnccl.so.2", RTLD_NOW | (!strcmp(how, "local") ? RTLD_LOCAL : RTLD_GLOBAL));
    if (!nccl) {
        printf("error=%s\n", dlerror());
        return 5;
    }
    if (strcmp(how, "local"))
        nccl = RTLD_DEFAULT;
#endif
    int rc = 2;
    if (!strcmp(argv[1], "calls"))
        rc = scenario_calls();
    else if (!strcmp(argv[1], "swap"))
        rc = scenario_swap();
    else if (!strcmp(argv[1], "init"))
        rc = scenario_init();
    printf("done=1\n");
    return rc;
}
