/*
 * Swap-mode test driver (tests/test_swap_shim.py): behaves like a training loop against the fake
 * libcuda (fake_vmm.inc), with entry points from cuGetProcAddress like a runtime. It prints
 * "pid=N" and waits for a line on stdin before the first CUDA call, and "sync=K" + a line at
 * each numbered sync point, so that the test can write plans for this pid into the control
 * file. Results are "key=value" lines.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_cuda.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*htod_fn)(CUdeviceptr, const void *, size_t);
typedef CUresult (*htoda_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*alloca_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*freea_fn)(CUdeviceptr, CUstream);
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*memset32a_fn)(CUdeviceptr, unsigned int, size_t, CUstream);
typedef CUresult (*access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*ipc_fn)(CUipcMemHandle *, CUdeviceptr);
typedef CUresult (*capture_fn)(CUstream, CUstreamCaptureMode);
typedef CUresult (*endcap_fn)(CUstream, CUgraph *);
typedef CUresult (*inst_fn)(CUgraphExec *, CUgraph, unsigned long long);
typedef CUresult (*glaunch_fn)(CUgraphExec, CUstream);

static gpa_fn gpa;
static void *lib;
static alloc_fn p_alloc;
static free_fn p_free;
static launch_fn p_launch;
static htod_fn p_htod;
static dtoh_fn p_dtoh;
static memset32a_fn p_memset;
static long (*fakeAdvance)(long);
static long long (*fakeCounter)(const char *);
static long long (*fakeAccess)(CUdeviceptr);

#define S1 ((CUstream)0x77) /* the application's stream */

static void *get_v(const char *name, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    return gpa(name, &p, version, flags, &st) == CUDA_SUCCESS ? p : NULL;
}

static void *get(const char *name) { return get_v(name, 12080, CU_GET_PROC_ADDRESS_DEFAULT); }

static void sync_point(int k)
{
    char line[64];
    printf("sync=%d\n", k);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(5);
}

static void setup(void)
{
    printf("pid=%d\n", (int)getpid());
    sync_point(0);
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        exit(3);
    gpa_fn g = (gpa_fn)dlsym(lib, "cuGetProcAddress_v2");
    void *self = NULL;
    CUdriverProcAddressQueryResult st;
    g("cuGetProcAddress", &self, 12000, 0, &st);
    gpa = self ? (gpa_fn)self : g;
    fakeAdvance = (long (*)(long))dlsym(lib, "fakeAdvance");
    fakeCounter = (long long (*)(const char *))dlsym(lib, "fakeCounter");
    fakeAccess = (long long (*)(CUdeviceptr))dlsym(lib, "fakeAccess");
    ((CUresult(*)(unsigned))get("cuInit"))(0);
    p_alloc = (alloc_fn)get("cuMemAlloc");
    p_free = (free_fn)get("cuMemFree");
    p_launch = (launch_fn)get("cuLaunchKernel");
    p_htod = (htod_fn)get("cuMemcpyHtoD");
    p_dtoh = (dtoh_fn)get("cuMemcpyDtoH");
    p_memset = (memset32a_fn)get("cuMemsetD32Async");
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

/* kernel_a: y[i] = x[i] + 1 for i < n (n = 0: it only touches x and y) */
static CUresult op_a(CUdeviceptr x, int n, CUdeviceptr y)
{
    void *args[] = {&x, &n, &y};
    return p_launch(FAKE_FUNC_A, 1, 1, 1, 1, 1, 1, 0, S1, args, NULL);
}

/* kernel_b: touches p (a CUkernel with a layout) */
static CUresult op_b(CUdeviceptr p)
{
    struct { CUdeviceptr p, q; } pair = {p, 0};
    CUdeviceptr third = 0;
    void *args[] = {&pair, &third};
    return p_launch(FAKE_KERN_B, 1, 1, 1, 1, 1, 1, 0, S1, args, NULL);
}

/* kernel_c: no layout (opaque), its packed buffer names p */
static CUresult op_c(CUdeviceptr p)
{
    struct { int n; int pad; CUdeviceptr p; } packed = {0, 0, p};
    size_t size = sizeof packed;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
    return p_launch(FAKE_FUNC_C, 1, 1, 1, 1, 1, 1, 0, S1, NULL, extra);
}

static void fill(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 7 + seed);
    p_htod(p, h, n);
    free(h);
}

/* Bytes of p that differ from the fill pattern plus `delta` (read through the shim). */
static long check(CUdeviceptr p, size_t n, unsigned seed, int delta)
{
    unsigned char *h = malloc(n);
    memset(h, 0, n);
    CUresult r = p_dtoh(h, p, n);
    long bad = r == CUDA_SUCCESS ? 0 : (long)n;
    for (size_t i = 0; r == CUDA_SUCCESS && i < n; i++)
        bad += h[i] != (unsigned char)(i * 7 + seed + delta);
    free(h);
    return bad;
}

static void counters(void)
{
    const char *names[] = {"faults", "unsafe_unmaps", "app_syncs", "ctx_syncs", "legacy_async", "capture_violations",
                           "handles", "mappings", "reservations", "pinned_bytes", "blocked_waits", "create_calls",
                           "map_calls", "device_peak", "htod_streams"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        printf("%s=%lld\n", names[i], fakeCounter(names[i]));
}

#define MIB ((size_t)1 << 20)
#define LEN (4 * MIB + 100) /* a block of 3 granules, the last one partly used */

/* a, b, c: three 2 MiB cuMemAlloc blocks, printed, filled with seeds 1, 2, 3 (the LRU order a, b, c). */
static void blocks_abc(CUdeviceptr *a, CUdeviceptr *b, CUdeviceptr *c)
{
    *a = must_alloc(2 * MIB);
    *b = must_alloc(2 * MIB);
    *c = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)*a, (uint64_t)*b, (uint64_t)*c);
    fill(*a, 2 * MIB, 1);
    fill(*b, 2 * MIB, 2);
    fill(*c, 2 * MIB, 3);
}

/* The read-backs of a, b and c of n bytes (filled with 1, 2, 3: blocks_abc's), each after the
 * streams ran. */
static void check_abc(CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, size_t n)
{
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, n, 1, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, n, 2, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, n, 3, 0));
}

/* Iterations of [op_b(T), op_a(A, LEN, B), op_b(T)]; the plan (written by the test) prefetches
 * A at 0 and swaps it out at 1. Odd iterations let the prefetch land before the consumer
 * (advance first), even ones do not (late). */
static CUdeviceptr must_alloc_ordered(size_t n, CUstream s)
{
    CUdeviceptr p = 0;
    CUresult r = ((alloca_fn)get("cuMemAllocAsync"))(&p, n, s);
    if (r != CUDA_SUCCESS) {
        printf("error=alloc_async %d\n", (int)r);
        exit(4);
    }
    return p;
}

/* s waits for an event of a stream nobody advances (the work before a free the host has issued
 * and the GPU has not run): only fakeAdvance, or a synchronisation, lets it go on. */
static void hold_back(CUstream s)
{
    CUevent ev = NULL;
    CUstream m = NULL;
    ((CUresult(*)(CUevent *, unsigned))dlsym(lib, "cuEventCreate"))(&ev, 0);
    ((CUresult(*)(CUstream *, unsigned))dlsym(lib, "cuStreamCreate"))(&m, 0);
    ((CUresult(*)(CUevent, CUstream))dlsym(lib, "cuEventRecord"))(ev, m);
    ((CUresult(*)(CUstream, CUevent, unsigned))dlsym(lib, "cuStreamWaitEvent"))(s, ev, 0);
}

/* ordered = 1: a and b are stream-ordered (cuMemAllocAsync on S1, freed with cuMemFreeAsync). */
static int scenario_roundtrip(int iters, int ordered)
{
    CUdeviceptr a = ordered ? must_alloc_ordered(LEN, S1) : must_alloc(LEN);
    CUdeviceptr b = ordered ? must_alloc_ordered(LEN, S1) : must_alloc(LEN), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)t);
    fill(a, LEN, 3);
    sync_point(1); /* the test writes the plan now */
    for (int i = 0; i < iters; i++) {
        op_b(t);
        if (i % 2)
            fakeAdvance(-1); /* the prefetch lands before its consumer */
        op_a(a, LEN, b);
        fakeAdvance(-1); /* the swap-out copy completes; released at the next op */
        op_b(t);
    }
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, LEN, 3, 0));
    printf("bad_b=%ld\n", check(b, LEN, 3, 1));
    counters();
    freea_fn fr = (freea_fn)get("cuMemFreeAsync");
    int fa = (int)(ordered ? fr(a, S1) : p_free(a)), fb = (int)(ordered ? fr(b, S1) : p_free(b));
    int ft = (int)p_free(t); /* in this order */
    printf("free_a_rc=%d\nfree_b_rc=%d\nfree_t_rc=%d\n", fa, fb, ft);
    printf("after_free_handles=%lld\nafter_free_reservations=%lld\n", fakeCounter("handles"),
           fakeCounter("reservations"));
    return 0;
}

/* C17: a peer's access granted by the app is granted again after the remap. */
static int scenario_remap(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)t);
    fill(a, 2 * MIB, 5);
    CUmemAccessDesc d;
    memset(&d, 0, sizeof d);
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = 1;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    printf("set_access_rc=%d\n", (int)((access_fn)get("cuMemSetAccess"))(a, 2 * MIB, &d, 1));
    printf("access_before=%lld\n", fakeAccess(a));
    sync_point(1); /* plan [b, b, a]: prefetch a at 1, swap it out after 2 */
    op_b(t);
    op_b(t);
    op_a(a, 0, 0);
    fakeAdvance(-1);
    op_b(t); /* release */
    printf("access_out=%lld\n", fakeAccess(a));
    op_b(t); /* prefetch */
    fakeAdvance(-1);
    op_a(a, 0, 0);
    printf("access_after=%lld\n", fakeAccess(a));
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 5, 0));
    counters();
    return 0;
}

/* C17: cuMemMap fails (FAKE_FAIL_MAP lists call numbers): at allocation -> the real allocator;
 * at a swap-in -> the op is refused with the driver's code, the block keeps its host copy. */
static int scenario_mapfail(void)
{
    CUdeviceptr a = must_alloc(2 * MIB); /* map call 1 fails: legacy */
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    printf("after_fail_handles=%lld\nafter_fail_reservations=%lld\nafter_fail_mappings=%lld\n",
           fakeCounter("handles"), fakeCounter("reservations"), fakeCounter("mappings"));
    CUdeviceptr b = must_alloc(2 * MIB); /* map call 2: VMM */
    printf("b=%" PRIu64 "\n", (uint64_t)b);
    fill(b, 2 * MIB, 9);
    sync_point(1); /* plan: swap b out after op 1 */
    op_b(a);
    op_a(b, 0, 0);
    fakeAdvance(-1);
    op_b(a); /* release of b */
    printf("b_out=%d\n", fakeAccess(b) == -1);
    printf("swapin_fail_rc=%d\n", (int)op_a(b, 0, 0)); /* map call 3 fails */
    printf("b_still_out=%d\n", fakeAccess(b) == -1);
    printf("swapin_ok_rc=%d\n", (int)op_a(b, 0, 0)); /* map call 4 */
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 9, 0));
    counters();
    return 0;
}

/* A foreach launch (the optimizer's multi_tensor_apply) names FAKE_T_PTRS blocks, more than the
 * 64 the shim once kept: it is not TRUNCATED, so a's swap-out, still copying, goes on. */
static int scenario_foreach(void)
{
    CUdeviceptr a = must_alloc(2 * MIB);
    static struct { CUdeviceptr p[FAKE_T_PTRS]; } list;
    for (int i = 0; i < FAKE_T_PTRS; i++)
        list.p[i] = must_alloc(MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 1);
    sync_point(1); /* plan: [op_b(a), foreach]; swap-out of a after op 0 */
    int chunk = 65536;
    void *args[] = {&chunk, &list};
    for (int it = 0; it < 2; it++) {
        op_b(a); /* iteration 2: a comes back */
        printf("foreach%d_rc=%d\n", it, (int)p_launch(FAKE_FUNC_T, 1, 1, 1, 1, 1, 1, 0, S1, args, NULL));
        fakeAdvance(-1);
    }
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    counters();
    return 0;
}

/* C08: an opaque launch names A: A is never swapped; it brings B (out) back first. */
static int scenario_opaque(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    sync_point(1); /* plan: [op_b(b), op_c(a)]; swap-out of a and b after op 0, of a after op 1 */
    op_b(b);
    fakeAdvance(-1);
    op_c(a); /* opaque: b must come back, a is marked */
    fakeAdvance(-1);
    op_b(b);
    fakeAdvance(-1);
    op_c(a);
    fakeAdvance(-1);
    printf("a_mapped=%d\n", fakeAccess(a) != -1);
    printf("bad_a=%ld\nbad_b=%ld\n", check(a, 2 * MIB, 1, 0), check(b, 2 * MIB, 2, 0));
    counters();
    return 0;
}

/* The plans' iteration [op_b(t), op_a(a)], run once under the plan sync_point(1) waits for, and
 * op_b(t) again: a swap-out the plan puts after op 1 has been released. */
static void plan_point(CUdeviceptr a, CUdeviceptr t)
{
    sync_point(1);
    op_b(t);
    op_a(a, 0, 0);
    fakeAdvance(-1);
    op_b(t);
}

/* C11: A is out when a capture on stream S2 starts touching it: brought back synchronously,
 * nothing of the shim on the capturing stream, no planned action during the capture. */
static int scenario_capture(void)
{
    CUstream s2 = (CUstream)0x99;
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)t);
    fill(a, 2 * MIB, 4);
    plan_point(a, t); /* the plan: swap a out after op 1 */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    capture_fn begin = (capture_fn)dlsym(lib, "cuStreamBeginCapture_v2");
    endcap_fn end = (endcap_fn)dlsym(lib, "cuStreamEndCapture");
    begin(s2, CU_STREAM_CAPTURE_MODE_GLOBAL);
    int n = 0;
    CUdeviceptr zero = 0;
    void *args[] = {&a, &n, &zero};
    printf("captured_rc=%d\n", (int)p_launch(FAKE_FUNC_A, 1, 1, 1, 1, 1, 1, 0, s2, args, NULL));
    printf("a_in_during_capture=%d\n", fakeAccess(a) != -1);
    CUgraph g;
    end(s2, &g);
    op_b(t); /* a fresh iteration after the capture */
    printf("a_in_after_capture=%d\n", fakeAccess(a) != -1);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 4, 0));
    counters();
    return 0;
}

/* C18 and IPC: a managed block and an IPC-exported one are named by the plan, never swapped. */
static int scenario_never(void)
{
    CUdeviceptr m = 0;
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t, unsigned))get("cuMemAllocManaged");
    printf("managed_rc=%d\n", (int)managed(&m, 4 * MIB, CU_MEM_ATTACH_GLOBAL));
    CUdeviceptr x = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    CUipcMemHandle h;
    printf("ipc_rc=%d\n", (int)((ipc_fn)get("cuIpcGetMemHandle"))(&h, x));
    printf("m=%" PRIu64 "\nx=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)m, (uint64_t)x, (uint64_t)t);
    long long creates = fakeCounter("create_calls");
    sync_point(1); /* plan: [op_b(t), op_a(m, 0, x)], swap-outs of m and x after op 1 */
    for (int i = 0; i < 3; i++) {
        op_b(t);
        op_a(m, 0, x);
        fakeAdvance(-1);
    }
    printf("creates_during_plan=%lld\n", fakeCounter("create_calls") - creates);
    printf("x_mapped=%d\n", fakeAccess(x) != -1);
    counters();
    return 0;
}

/* Budget without a plan: LRU idle eviction before an allocation over the budget. */
static int scenario_budget(void)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    op_a(a, 0, 0);
    op_a(b, 0, 0);
    op_a(c, 0, 0);
    op_a(a, 0, 0); /* LRU order now: b, c, a */
    CUdeviceptr d = must_alloc(2 * MIB); /* over the budget of 3: b goes */
    fakeAdvance(-1);
    op_a(d, 0, 0); /* b released */
    printf("b_out=%d\nc_in=%d\n", fakeAccess(b) == -1, fakeAccess(c) != -1);
    CUdeviceptr e = must_alloc(2 * MIB); /* c goes (d is newer, a newer) */
    fakeAdvance(-1);
    op_a(e, 0, 0);
    printf("c_out=%d\n", fakeAccess(c) == -1);
    printf("d=%" PRIu64 "\ne=%" PRIu64 "\n", (uint64_t)d, (uint64_t)e);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0)); /* demand: b comes back */
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* Budget with nothing evictable: the allocation fails exactly as the driver says. */
static int scenario_oom(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    op_c(a); /* opaque: never swapped */
    op_c(b);
    CUdeviceptr c = 0;
    printf("oom_rc=%d\n", (int)p_alloc(&c, 2 * MIB));
    printf("c=%" PRIu64 "\n", (uint64_t)c);
    counters();
    return 0;
}

/* The pinned pool runs out: fewer blocks are swapped, none is corrupted. */
static int scenario_pool(void)
{
    CUdeviceptr x[3], t = must_alloc(2 * MIB);
    for (int i = 0; i < 3; i++) {
        x[i] = must_alloc(2 * MIB);
        fill(x[i], 2 * MIB, (unsigned)(10 + i));
        printf("x%d=%" PRIu64 "\n", i, (uint64_t)x[i]);
    }
    sync_point(1); /* plan: [op_b(t), op_a(x0, 0, x1), op_b(x2)]; swap-outs of all three after op 2 */
    op_b(t);
    op_a(x[0], 0, x[1]);
    op_b(x[2]);
    fakeAdvance(-1);
    op_b(t);
    for (int i = 0; i < 3; i++)
        printf("x%d_out=%d\n", i, fakeAccess(x[i]) == -1);
    for (int i = 0; i < 3; i++)
        printf("bad_x%d=%ld\n", i, check(x[i], 2 * MIB, (unsigned)(10 + i), 0));
    counters();
    return 0;
}

/* Plan following: resync at a new iteration, a mismatch that drops the plan, a new generation
 * adopted, prefetch hits. Template [op_b(t), op_a(a), memset(t)]. */
static int scenario_plan(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)t);
    fill(a, 2 * MIB, 6);
    sync_point(1); /* plan gen 1: prefetch a at 0, swap a out at 1 */
    /* iteration 1: full */
    op_b(t);
    op_a(a, 0, 0);
    fakeAdvance(-1);
    p_memset(t, 0, 16, S1);
    /* iteration 2 cut short: b, a, then b again (resync to 0, no drop) */
    op_b(t);
    fakeAdvance(-1);
    op_a(a, 0, 0);
    fakeAdvance(-1);
    op_b(t);
    fakeAdvance(-1);
    op_a(a, 0, 0);
    fakeAdvance(-1);
    p_memset(t, 0, 16, S1);
    printf("drops_before_mismatch=%d\n", 0);
    /* iteration 4: b then memset where a was expected: the plan is dropped */
    op_b(t);
    p_memset(t, 0, 16, S1);
    /* after the drop: a is touched while out: demand */
    op_a(a, 0, 0);
    fakeAdvance(-1);
    sync_point(2); /* the test writes gen 2 */
    op_b(t); /* adopted here (none followed) */
    op_a(a, 0, 0);
    fakeAdvance(-1);
    p_memset(t, 0, 16, S1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 6, 0));
    counters();
    return 0;
}

/* C10: a graph launch whose kernel node touches a block that is out brings it back first. */
static int scenario_graph(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 8);
    plan_point(a, t); /* the plan: swap a out after op 1 */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    int n = 0;
    CUdeviceptr zero = 0;
    void *args[] = {&a, &n, &zero};
    struct fake_node k = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args};
    struct fake_graph g = {.n = 1, .nodes = {&k}};
    CUgraphExec exec = NULL;
    ((inst_fn)get("cuGraphInstantiateWithFlags"))(&exec, (CUgraph)&g, 0);
    printf("graph_rc=%d\n", (int)((glaunch_fn)get("cuGraphLaunch"))(exec, S1));
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 8, 0));
    counters();
    return 0;
}

/* The same, but the graph was instantiated naming t only, and its kernel node was then set, in the
 * executable graph, to name a (XLA's command-buffer updates): a must come back all the same. */
static int scenario_graph_update(void)
{
    typedef CUresult (*kset_fn)(CUgraphExec, CUgraphNode, const CUDA_KERNEL_NODE_PARAMS *);
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 8);
    int n = 0;
    CUdeviceptr zero = 0;
    void *args_t[] = {&t, &n, &zero}, *args_a[] = {&a, &n, &zero};
    struct fake_node k = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args_t};
    struct fake_graph g = {.n = 1, .nodes = {&k}};
    CUgraphExec exec = NULL;
    ((inst_fn)get("cuGraphInstantiateWithFlags"))(&exec, (CUgraph)&g, 0);
    plan_point(a, t); /* the plan: swap a out after op 1 */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    CUDA_KERNEL_NODE_PARAMS kp = {0};
    kp.func = FAKE_FUNC_A;
    kp.kernelParams = args_a;
    printf("set_rc=%d\n", (int)((kset_fn)get("cuGraphExecKernelNodeSetParams"))(exec, (CUgraphNode)&k, &kp));
    printf("graph_rc=%d\n", (int)((glaunch_fn)get("cuGraphLaunch"))(exec, S1));
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 8, 0));
    counters();
    return 0;
}

/* A memset node of an executable graph set to a block that is out: the driver refuses an unmapped
 * pointer, so the block must be back before the real call (XLA sets memcpy nodes this way). */
static int scenario_graph_set_out(void)
{
    typedef CUresult (*mset_fn)(CUgraphExec, CUgraphNode, const CUDA_MEMSET_NODE_PARAMS *, CUcontext);
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 8);
    struct fake_node ms = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = t};
    struct fake_graph g = {.n = 1, .nodes = {&ms}};
    CUgraphExec exec = NULL;
    ((inst_fn)get("cuGraphInstantiateWithFlags"))(&exec, (CUgraph)&g, 0);
    plan_point(a, t); /* the plan: swap a out after op 1 */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    struct fake_node ms_a = {.type = CU_GRAPH_NODE_TYPE_MEMSET, .dst = a + 128};
    struct fake_graph g_a = {.n = 1, .nodes = {&ms_a}};
    CUgraphExec exec_a = NULL;
    printf("inst_rc=%d\n", (int)((inst_fn)get("cuGraphInstantiateWithFlags"))(&exec_a, (CUgraph)&g_a, 0));
    CUDA_MEMSET_NODE_PARAMS mp = {0};
    mp.dst = a + 64;
    printf("set_rc=%d\n", (int)((mset_fn)get("cuGraphExecMemsetNodeSetParams"))(exec, (CUgraphNode)&ms, &mp, NULL));
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 8, 0));
    counters();
    return 0;
}

/* Conditional nodes (C26): a and u are out; a graph whose IF body names a brings back a only
 * (the union of its bodies, not every block as for an opaque graph). */
static int scenario_graph_cond(void)
{
    typedef CUresult (*add_fn)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
                               CUgraphNodeParams *);
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB), u = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nu=%" PRIu64 "\n", (uint64_t)a, (uint64_t)u);
    fill(a, 2 * MIB, 8);
    fill(u, 2 * MIB, 9);
    plan_point(a, t); /* the plan: swap a and u out after op 1 */
    printf("a_out=%d\nu_out=%d\n", fakeAccess(a) == -1, fakeAccess(u) == -1);
    int n = 0;
    CUdeviceptr zero = 0;
    void *args[] = {&a, &n, &zero};
    struct fake_node k = {.type = CU_GRAPH_NODE_TYPE_KERNEL, .func = FAKE_FUNC_A, .kernelParams = args};
    struct fake_graph g = {.n = 0};
    CUgraphNodeParams ip;
    memset(&ip, 0, sizeof ip);
    ip.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    ip.conditional.type = CU_GRAPH_COND_TYPE_IF;
    ip.conditional.size = 1;
    CUgraphNode node = NULL;
    printf("add_rc=%d\n", (int)((add_fn)get("cuGraphAddNode"))(&node, (CUgraph)&g, NULL, NULL, 0, &ip));
    struct fake_graph *body = (struct fake_graph *)ip.conditional.phGraph_out[0];
    body->nodes[body->n++] = &k;
    CUgraphExec exec = NULL;
    ((inst_fn)get("cuGraphInstantiateWithFlags"))(&exec, (CUgraph)&g, 0);
    printf("graph_rc=%d\n", (int)((glaunch_fn)get("cuGraphLaunch"))(exec, S1));
    fakeAdvance(-1);
    printf("bad_a=%ld\nu_still_out=%d\n", check(a, 2 * MIB, 8, 0), fakeAccess(u) == -1);
    counters();
    return 0;
}

/* Batched copies: a and b are out when one batch copy touches both (dst and src); every block
 * it touches comes back before the real call, on the entry point `variant` asks for:
 * [3d]12080 (12.8's shape, failIdx), [3d]13000 (13.0's, _v2), with "pt" the per-thread twin on S1,
 * with "pt0" on the NULL (per-thread) stream. Copies: host -> b+1MiB (4 KiB), a -> b (1 MiB),
 * a+1MiB -> host2 (4 KiB). */
typedef CUresult (*batch12_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                               size_t *, CUstream);
typedef CUresult (*batch13_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                               CUstream);
typedef CUresult (*batch3d12_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, size_t *, unsigned long long, CUstream);
typedef CUresult (*batch3d13_fn)(size_t, CUDA_MEMCPY3D_BATCH_OP *, unsigned long long, CUstream);

#define HOSTP(p) ((CUdeviceptr)(uintptr_t)(p))

static CUDA_MEMCPY3D_BATCH_OP op3d(CUdeviceptr dst, CUdeviceptr src, size_t w, size_t h)
{
    CUDA_MEMCPY3D_BATCH_OP o;
    memset(&o, 0, sizeof o);
    o.dst.type = o.src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    o.dst.op.ptr.ptr = dst;
    o.src.op.ptr.ptr = src;
    o.extent.width = w;
    o.extent.height = h;
    o.extent.depth = 1;
    o.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    return o;
}

static int scenario_batch(const char *variant)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)t);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    static unsigned char host[4096], host2[4096];
    for (size_t i = 0; i < sizeof host; i++)
        host[i] = (unsigned char)(i * 13 + 5);
    int three = !strncmp(variant, "3d", 2);
    int version = atoi(variant + (three ? 2 : 0));
    int pt = strstr(variant, "pt") != NULL, null_stream = strstr(variant, "pt0") != NULL;
    CUstream s = null_stream ? NULL : S1;
    void *fn = get_v(three ? "cuMemcpy3DBatchAsync" : "cuMemcpyBatchAsync", version,
                     pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT);
    printf("have_fn=%d\n", fn != NULL);
    sync_point(1); /* plan: [op_b(t), op_a(a, 0, b)]; swap-outs of a and b after op 1 */
    op_b(t);
    op_a(a, 0, b);
    fakeAdvance(-1);
    op_b(t); /* a and b released */
    printf("a_out=%d\nb_out=%d\n", fakeAccess(a) == -1, fakeAccess(b) == -1);

    CUdeviceptr dsts[] = {b + MIB, b, HOSTP(host2)}, srcs[] = {HOSTP(host), a, a + MIB};
    size_t sizes[] = {4096, MIB, 4096}, fail = 12345, ai = 0;
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    CUDA_MEMCPY3D_BATCH_OP ops[] = {op3d(b + MIB, HOSTP(host), 4096, 1), op3d(b, a, 4096, MIB / 4096),
                                    op3d(HOSTP(host2), a + MIB, 4096, 1)};
    CUresult r;
    if (three && version == 12080)
        r = ((batch3d12_fn)fn)(3, ops, &fail, 0, s);
    else if (three)
        r = ((batch3d13_fn)fn)(3, ops, 0, s);
    else if (version == 12080)
        r = ((batch12_fn)fn)(dsts, srcs, sizes, 3, &attr, &ai, 1, &fail, s);
    else
        r = ((batch13_fn)fn)(dsts, srcs, sizes, 3, &attr, &ai, 1, s);
    printf("batch_rc=%d\nbatch_fail=%zu\n", (int)r, fail);
    printf("a_in=%d\nb_in=%d\n", fakeAccess(a) != -1, fakeAccess(b) != -1);
    printf("host2_before=%d\n", host2[0] != 0 || host2[4095] != 0); /* the batch waits for the swap-ins */
    fakeAdvance(-1);
    long bad = 0;
    for (size_t i = 0; i < sizeof host2; i++)
        bad += host2[i] != (unsigned char)((MIB + i) * 7 + 1);
    printf("bad_host2=%ld\n", bad);
    unsigned char *hb = malloc(2 * MIB);
    memset(hb, 0, 2 * MIB);
    bad = p_dtoh(hb, b, 2 * MIB) == CUDA_SUCCESS ? 0 : 2 * (long)MIB;
    for (size_t i = 0; i < 2 * MIB; i++) {
        unsigned char want = i < MIB ? (unsigned char)(i * 7 + 1)                         /* a's bytes */
                             : i < MIB + 4096 ? host[i - MIB]                             /* the host's */
                                              : (unsigned char)(i * 7 + 2);               /* b's own */
        bad += hb[i] != want;
    }
    free(hb);
    printf("bad_b=%ld\n", bad);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    printf("batch_copies=%lld\nbatch_stream=%lld\n", fakeCounter("batch_copies"), fakeCounter("batch_stream"));
    counters();
    return 0;
}

/* Pointer tables (cases.md C08, C09; pin_pointer_table in native/memory.c). Budget 3 blocks of
 * 2 MiB: a, b, c filled (LRU a, b, c); allocating d evicts a (out at once: the allocation waits
 * for the swap-out). Then a host-to-device copy (mode "sync": cuMemcpyHtoD, "async":
 * cuMemcpyHtoDAsync on S1) of a table into d, the table being (variant):
 *   ptr     8 words, word 3 = a                       (pins a)
 *   middle  8 words, word 3 = a + 1 MiB + 8           (pins a)
 *   edge    65536 bytes, the last word = a            (pins a: 64 KiB is still scanned)
 *   data    8 words of ordinary data, no device address (pins nothing)
 *   large   65544 bytes, word 0 = a                   (not scanned: pins nothing)
 *   unaligned 8 words from a 4-byte-aligned address, word 3 = a (not scanned)
 * Then 4 rounds of ops touching b, c, d in turn (each completing its copies): one of the 4
 * blocks must be out; a pinned block is never the one, although it is the least recently used.
 * Last, every block is read back. */
static uint64_t g_table[65536 / 8 + 2];

/* ordered: a is a stream-ordered block (cuMemAllocAsync on S1) */
static int scenario_ptrtable(const char *variant, const char *mode, int ordered)
{
    CUdeviceptr a = ordered ? must_alloc_ordered(2 * MIB, S1) : must_alloc(2 * MIB);
    CUdeviceptr b = must_alloc(2 * MIB), c = must_alloc(2 * MIB);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    fill(c, 2 * MIB, 3);
    CUdeviceptr d = must_alloc(2 * MIB); /* over the budget: a, the least recently used, goes */
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\nd=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c,
           (uint64_t)d);
    printf("a_out_before=%d\n", fakeAccess(a) == -1);
    const uint64_t data[8] = {0, 1, 2, 3, 7, 4095, 0x7fffffffull, ~0ull};
    size_t n = 64, at = 3;
    const unsigned char *src = (const unsigned char *)g_table;
    uint64_t ptr = a;
    for (size_t i = 0; i < sizeof g_table / 8; i++)
        g_table[i] = i % 4096; /* small integers around the pointer */
    if (!strcmp(variant, "middle"))
        ptr = a + MIB + 8;
    else if (!strcmp(variant, "edge"))
        n = 65536, at = 65536 / 8 - 1;
    else if (!strcmp(variant, "large"))
        n = 65536 + 8, at = 0;
    else if (!strcmp(variant, "unaligned"))
        src += 4;
    if (!strcmp(variant, "data"))
        memcpy(g_table, data, sizeof data);
    else
        memcpy((unsigned char *)src + 8 * at, &ptr, 8);
    CUresult r = !strcmp(mode, "async") ? ((htoda_fn)get("cuMemcpyHtoDAsync"))(d, src, n, S1) : p_htod(d, src, n);
    printf("table_rc=%d\n", (int)r);
    printf("a_in_after_table=%d\n", fakeAccess(a) != -1);
    fakeAdvance(-1);
    for (int round = 0; round < 4; round++) {
        CUdeviceptr x[3] = {b, c, d};
        for (int k = 0; k < 3; k++) {
            op_a(x[k], 0, 0);
            fakeAdvance(-1);
        }
    }
    printf("a_in_after_rounds=%d\n", fakeAccess(a) != -1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    fakeAdvance(-1);
    unsigned char *h = malloc(n);
    memset(h, 0, n);
    long bad = p_dtoh(h, d, n) == CUDA_SUCCESS ? 0 : (long)n;
    for (size_t i = 0; i < n; i++)
        bad += h[i] != src[i];
    free(h);
    printf("bad_table=%ld\n", bad);
    counters();
    return 0;
}

/* The physical budget (hold_budget in native/swap.c): budget 3 blocks of 2 MiB, a plan
 * [op_b(b), op_a(a, 0, c)] that swaps a out after op 1. The shim stream never runs on its own
 * here (no fakeAdvance until the end): a swap-out in flight keeps its memory until the shim
 * drains its stream.
 *   1. iteration 1 leaves a's swap-out in flight; allocating d fits the bytes the executor
 *      counts (b, c, d), but not with a's memory still there: the allocation waits for it.
 *   2. iteration 2: op_a needs a back (demand); d, the least recently used, is evicted, and the
 *      swap-in waits for that swap-out before mapping a; a goes out again as planned.
 * device_peak (the fake's high-water mark) after each step; then the read-backs (which leave the
 * template: the plan is dropped there). */
static int scenario_hold(void)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    sync_point(1); /* plan: swap a out after op 1 */
    op_b(b);
    op_a(a, 0, c);
    printf("a_leaving=%d\n", fakeAccess(a) != -1); /* its copy is queued, not run: still mapped */
    CUdeviceptr d = must_alloc(2 * MIB);
    printf("d=%" PRIu64 "\n", (uint64_t)d);
    printf("a_out_after_alloc=%d\n", fakeAccess(a) == -1);
    fill(d, 2 * MIB, 4);
    printf("peak_after_alloc=%lld\n", fakeCounter("device_peak"));
    op_b(b);
    op_a(a, 0, c); /* a is out: demand; d goes first */
    printf("d_out_after_demand=%d\n", fakeAccess(d) == -1);
    printf("a_in_after_demand=%d\n", fakeAccess(a) != -1);
    printf("peak_after_demand=%lld\n", fakeCounter("device_peak"));
    check_abc(a, b, c, 2 * MIB);
    fakeAdvance(-1);
    printf("bad_d=%ld\n", check(d, 2 * MIB, 4, 0));
    fakeAdvance(-1);
    counters();
    return 0;
}

/* A block whose memory was handed over while its copy out runs (SBF_GIVEN), and the block that
 * took it. Budget 3 blocks of 2 MiB, PYOBMEM_RELEASER=0: a, b, c filled; d's allocation sends a out
 * (waited for: d is a cuMemAlloc block); op_a(a) brings a back, evicting b, and a takes b's memory
 * while b's copy out is still queued (the shim streams do not run). Then (variant):
 *   query  a pointer query on b: b comes back (its copy waited for), under the budget
 *   free   a, the block that took b's memory, is freed, and x allocated: the memory a mapped is
 *          gone only once b's range is unmapped too; x must not come on top of it
 * device_peak after each step, then every block's bytes. */
static int scenario_handoff(const char *variant)
{
    CUdeviceptr a, b, c, x = 0;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    CUdeviceptr d = must_alloc(2 * MIB);
    printf("d=%" PRIu64 "\n", (uint64_t)d);
    fill(d, 2 * MIB, 4);
    printf("a_out=%d\n", fakeAccess(a) == -1);
    op_a(a, 0, 0); /* demand: b evicted, its memory a's */
    printf("b_given=%d\n", fakeAccess(b) != -1); /* its copy queued: its range still mapped */
    printf("peak_after_handoff=%lld\n", fakeCounter("device_peak"));
    if (!strcmp(variant, "query")) {
        int v = 0;
        CUresult r = ((CUresult(*)(void *, CUpointer_attribute, CUdeviceptr))get("cuPointerGetAttribute"))(
            &v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, b + 4096);
        printf("query_rc=%d\nb_in=%d\n", (int)r, fakeAccess(b) != -1);
    } else if (!strcmp(variant, "free")) {
        printf("free_a_rc=%d\n", (int)p_free(a));
        x = must_alloc(2 * MIB);
        fill(x, 2 * MIB, 5);
    }
    printf("peak_after_%s=%lld\n", variant, fakeCounter("device_peak"));
    fakeAdvance(-1);
    if (strcmp(variant, "free") != 0)
        printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    fakeAdvance(-1);
    printf("bad_d=%ld\n", check(d, 2 * MIB, 4, 0));
    fakeAdvance(-1);
    if (x)
        printf("bad_x=%ld\n", check(x, 2 * MIB, 5, 0));
    fakeAdvance(-1);
    counters();
    return 0;
}

/* A stream-ordered block served with the memory of a swap-out still copying: budget 3 blocks of
 * 2 MiB, a, b, c filled; y (cuMemAllocAsync on S1) evicts a and takes its memory while a's copy
 * out is queued (the shim streams do not run); a memset of y on S1 follows at once. S1 must wait
 * for a's copy, or the memset overwrites a's bytes before they reach the host. */
static int scenario_handoff_ordered(void)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    CUdeviceptr y = must_alloc_ordered(2 * MIB, S1);
    printf("y=%" PRIu64 "\n", (uint64_t)y);
    printf("a_given=%d\n", fakeAccess(a) != -1); /* its copy queued: its range still mapped */
    p_memset(y, 0x55555555u, 2 * MIB / 4, S1);
    printf("peak_after_alloc=%lld\n", fakeCounter("device_peak"));
    fakeAdvance(-1);
    unsigned char *h = malloc(2 * MIB);
    p_dtoh(h, y, 2 * MIB);
    long bad = 0;
    for (size_t i = 0; i < 2 * MIB; i++)
        bad += h[i] != 0x55;
    free(h);
    printf("bad_y=%ld\n", bad);
    check_abc(a, b, c, 2 * MIB);
    fakeAdvance(-1);
    counters();
    return 0;
}

/* An op's own block still copying out is not the memory its other blocks take: budget 4 blocks
 * of 2 MiB, a, b, c, d filled; e's allocation sends a out (waited for); at sync 1 the test lowers
 * the budget to 2 blocks, so op_b(e) sends b and c out (copies queued: the shim streams do not
 * run). op_a(a, 0, b) then needs a back (d goes for it) and b, still copying: b's swap-out is
 * cancelled, and a takes the memory of c or d, never b's (which would make b wait on the host
 * for its copy and come back by a swap-in). */
static int scenario_ownleaving(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB), c = must_alloc(2 * MIB), d = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\nd=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c,
           (uint64_t)d);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    fill(c, 2 * MIB, 3);
    fill(d, 2 * MIB, 4);
    fakeAdvance(-1);
    CUdeviceptr e = must_alloc(2 * MIB);
    printf("e=%" PRIu64 "\n", (uint64_t)e);
    fill(e, 2 * MIB, 5);
    printf("a_out=%d\n", fakeAccess(a) == -1);
    sync_point(1); /* the budget: 2 blocks */
    op_b(e);
    printf("b_leaving=%d\nc_leaving=%d\n", fakeAccess(b) != -1, fakeAccess(c) != -1);
    op_a(a, 0, b);
    printf("b_in=%d\n", fakeAccess(b) != -1);
    check_abc(a, b, c, 2 * MIB);
    fakeAdvance(-1);
    printf("bad_d=%ld\n", check(d, 2 * MIB, 4, 0));
    fakeAdvance(-1);
    printf("bad_e=%ld\n", check(e, 2 * MIB, 5, 0));
    fakeAdvance(-1);
    counters();
    return 0;
}

/* A swap-in that maps a spare handle needs no room beyond it: budget 3 blocks of 2 MiB, a, b, c
 * filled; a 512 KiB cuMemAlloc puts the device over it, so the next op sends a out; x freed, a's
 * memory is kept as a spare (the budget has room). The plan (sync 1) swaps b out after op 1:
 * b's copy is queued (the shim streams do not run) when op_b(a) needs a back. a maps the spare:
 * the device holds c, a and b's memory still copying, 3 blocks; nothing to wait for. full: no
 * plan, op_b(a) at once, the device at the budget (b, c and the spare): the spare is the memory
 * a maps, not cached memory to give back first (and create again). */
static int scenario_sparewait(int full)
{
    CUdeviceptr a, b, c, x = 0;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    printf("x_rc=%d\n", (int)p_alloc(&x, MIB / 2));
    op_b(c); /* over the budget: a goes */
    fakeAdvance(-1);
    printf("x_free_rc=%d\n", (int)p_free(x));
    op_b(c); /* a's memory released, kept as a spare */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    sync_point(1); /* plan: swap b out after op 1 */
    if (!full) {
        op_b(c);
        op_a(b, 0, 0);
        printf("b_leaving=%d\n", fakeAccess(b) != -1);
    }
    op_b(a); /* a back on the spare */
    printf("a_in=%d\nb_leaving_after=%d\n", fakeAccess(a) != -1, fakeAccess(b) != -1);
    printf("peak_after_swap_in=%lld\n", fakeCounter("device_peak"));
    check_abc(a, b, c, 2 * MIB);
    fakeAdvance(-1);
    counters();
    return 0;
}

/* A fork child (a data loader's worker) exits: it traced, it did not swap, so it writes no
 * swap.waits NOTE of its own (the parent's counters, inherited, are the parent's to write).
 * Budget 3 blocks: d's allocation sends a out first, so the parent has waits to note. */
static int scenario_forkexit(void)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    CUdeviceptr d = must_alloc(2 * MIB);
    printf("d=%" PRIu64 "\n", (uint64_t)d);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        exit(0); /* atexit handlers run, as at a worker's normal end */
    int st = -1;
    waitpid(pid, &st, 0);
    printf("child_status=%d\n", st);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    counters();
    return 0;
}

/* The budget counts every live device block (g_shim.device_bytes): budget 3 blocks of 2 MiB, a,
 * b, c filled (LRU a, b, c), then a 512 KiB block the shim does not VMM-back (variant):
 *   small    cuMemAlloc below min_swap_bytes (the real allocator)
 *   async    cuMemAllocAsync on S1
 *   pitch    cuMemAllocPitch (4096 x 128)
 *   managed  cuMemAllocManaged: not device memory the budget counts
 * The next op finds the device over the budget (all but managed): a goes. After the block is
 * freed, bringing a back fits again: nothing else is evicted. */
static int scenario_others(const char *variant)
{
    CUdeviceptr a, b, c, x = 0;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    size_t pitch = 0;
    if (!strcmp(variant, "small"))
        r = p_alloc(&x, MIB / 2);
    else if (!strcmp(variant, "async"))
        r = ((alloca_fn)get("cuMemAllocAsync"))(&x, MIB / 2, S1);
    else if (!strcmp(variant, "pitch"))
        r = ((pitch_fn)get("cuMemAllocPitch"))(&x, &pitch, 4096, 128, 4);
    else if (!strcmp(variant, "managed"))
        r = ((CUresult(*)(CUdeviceptr *, size_t, unsigned))get("cuMemAllocManaged"))(&x, MIB / 2, CU_MEM_ATTACH_GLOBAL);
    printf("x_rc=%d\nx=%" PRIu64 "\n", (int)r, (uint64_t)x);
    op_a(c, 0, 0); /* the budget holds between allocations: over it, a goes */
    fakeAdvance(-1);
    op_a(c, 0, 0); /* a released */
    printf("a_out=%d\n", fakeAccess(a) == -1);
    printf("b_in=%d\nc_in=%d\n", fakeAccess(b) != -1, fakeAccess(c) != -1);
    r = !strcmp(variant, "async") ? ((freea_fn)get("cuMemFreeAsync"))(x, S1) : p_free(x);
    printf("x_free_rc=%d\n", (int)r);
    op_a(a, 0, 0); /* a back: fits without x */
    fakeAdvance(-1);
    printf("b_in_end=%d\nc_in_end=%d\n", fakeAccess(b) != -1, fakeAccess(c) != -1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* Cached memory counts against the budget (4 granules here): x (3 granules) freed stays cached;
 * y (2 granules, cuMemAlloc) would pass the budget with it, so the cache gives x's memory back. */
static int scenario_ordered_budget(void)
{
    CUdeviceptr x = must_alloc_ordered(LEN, S1);
    fill(x, LEN, 1);
    ((freea_fn)get("cuMemFreeAsync"))(x, S1);
    printf("cached_handles=%lld\n", fakeCounter("handles"));
    CUdeviceptr y = must_alloc(4 * MIB);
    printf("y=%" PRIu64 "\n", (uint64_t)y);
    printf("handles_after_y=%lld\n", fakeCounter("handles"));
    CUdeviceptr z = must_alloc_ordered(LEN, S1); /* the cached reservation, new memory, y out for it */
    printf("z_reused=%d\n", z == x);
    fill(z, LEN, 5);
    printf("bad_z=%ld\n", check(z, LEN, 5, 0));
    printf("pool_trims=%lld\n", fakeCounter("pool_trims"));
    counters();
    return 0;
}

/* A swap-in takes a cached block's memory whose free was reached instead of fresh memory (budget
 * 3 granules): x (stream-ordered) is freed and its free reached; c (cuMemAlloc) gets new memory,
 * x's going back; y reuses x's reservation and a's memory (a, the least recently used, goes out;
 * the streams run before y is written); y is freed, its free reached, and a's swap-in on demand
 * takes y's memory. */
static int scenario_cachehandle(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    CUdeviceptr x = must_alloc_ordered(2 * MIB, S1);
    fill(x, 2 * MIB, 9);
    ((freea_fn)get("cuMemFreeAsync"))(x, S1);
    fakeAdvance(-1);
    long long creates = fakeCounter("create_calls");
    CUdeviceptr c = must_alloc(2 * MIB);
    printf("c_creates=%lld\n", fakeCounter("create_calls") - creates);
    fill(c, 2 * MIB, 3);
    op_a(b, 0, 0);
    op_a(c, 0, 0);
    CUdeviceptr y = must_alloc_ordered(2 * MIB, S1); /* a goes out, its memory y's */
    printf("y_reused=%d\n", y == x);
    fakeAdvance(-1);
    fill(y, 2 * MIB, 8);
    ((freea_fn)get("cuMemFreeAsync"))(y, S1);
    fakeAdvance(-1);
    creates = fakeCounter("create_calls");
    check_abc(a, b, c, 2 * MIB); /* a back on demand; b and c resident */
    printf("a_creates=%lld\n", fakeCounter("create_calls") - creates);
    counters();
    return 0;
}

/* The shim's copy streams are all made in one context (FAKE_FAIL_STREAM_CREATE=2: the second
 * fails): x, the first stream-ordered block, finds the setup failed and goes to the driver's pool;
 * y, allocated with another context current, is not served either (its streams would be made in
 * that context); z, back in the first, completes the setup and is served. */
static int scenario_ctxsetup(void)
{
    void (*set_ctx)(CUcontext) = (void (*)(CUcontext))dlsym(lib, "fakeSetContext");
    CUcontext first = NULL;
    ((CUresult(*)(CUcontext *))dlsym(lib, "cuCtxGetCurrent"))(&first);
    CUdeviceptr x = must_alloc_ordered(4 * MIB, S1);
    set_ctx((CUcontext)0xB0B0);
    CUdeviceptr y = must_alloc_ordered(4 * MIB, S1);
    set_ctx(first);
    CUdeviceptr z = must_alloc_ordered(4 * MIB, S1);
    printf("x_served=%d\ny_served=%d\nz_served=%d\n", x >= 0x20000000000ull, y >= 0x20000000000ull, z >= 0x20000000000ull);
    printf("stream_ctxs=%lld\n", fakeCounter("stream_ctxs"));
    fill(z, 4 * MIB, 3);
    printf("bad_z=%ld\n", check(z, 4 * MIB, 3, 0));
    counters();
    return 0;
}

/* A budget eviction waits for a pending free before a live block goes out (budget 4 granules):
 * y (1 granule, live) and x (LEN: 3 granules, stream-ordered on S1) fill it; x is freed on S1
 * behind an event of a stream nobody advances (the host ahead of the GPU), so its cached memory
 * cannot be given back now; z (1 granule on another stream) needs room. The shim waits for x's
 * free and gives x's memory back (y stays resident) or, with PYOBMEM_FREE_WAIT=0, swaps y out. */
static int scenario_freewait(int twice)
{
    CUstream s2 = (CUstream)0x99;
    CUdeviceptr y = must_alloc(2 * MIB);
    fill(y, 2 * MIB, 4);
    CUdeviceptr x = must_alloc_ordered(LEN, S1);
    fill(x, LEN, 1);
    hold_back(S1);
    ((freea_fn)get("cuMemFreeAsync"))(x, S1); /* queued behind the wait: not reached yet */
    CUdeviceptr z = must_alloc_ordered(2 * MIB, s2);
    printf("y_in=%d\n", fakeAccess(y) != -1);
    fakeAdvance(-1);
    fill(z, 2 * MIB, 6);
    printf("bad_z=%ld\n", check(z, 2 * MIB, 6, 0));
    printf("bad_y=%ld\n", check(y, 2 * MIB, 4, 0));
    if (twice) {
        /* w (1 granule) freed on S3 behind a second stream nobody advances, then v (LEN) over the
         * budget: a second pending free the budget could wait for */
        CUstream s3 = (CUstream)0xAA;
        hold_back(s3);
        CUdeviceptr w = must_alloc_ordered(2 * MIB, s3);
        ((freea_fn)get("cuMemFreeAsync"))(w, s3);
        CUdeviceptr v = must_alloc_ordered(LEN, s2);
        fill(v, LEN, 7);
        printf("bad_v=%ld\n", check(v, LEN, 7, 0));
    }
    counters();
    return 0;
}

/* Cached memory goes back before the host waits for a swap-out's copy (budget 6 granules): a
 * (LEN, 3 granules) and t (1) live, x (2 granules, stream-ordered on S1) freed and its free
 * reached, so cached; the plan sends a out after op_a (its copy queued, the shim's streams not
 * run). z (1 granule on another stream, no class in the cache, no leaving block of its size) fits the count
 * (t + x's cache + z = 4) but not the memory still mapped with a's (7): x's memory goes back,
 * a's copy is not waited for. */
static int scenario_trimfirst(void)
{
    CUdeviceptr a = must_alloc(LEN), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nt=%" PRIu64 "\n", (uint64_t)a, (uint64_t)t);
    fill(a, LEN, 3);
    CUdeviceptr x = must_alloc_ordered(4 * MIB, S1);
    fill(x, 4 * MIB, 1);
    ((freea_fn)get("cuMemFreeAsync"))(x, S1);
    fakeAdvance(-1);
    sync_point(1); /* the test writes the plan now */
    op_b(t);
    op_a(a, 0, 0); /* a goes out after this op: its copy queued */
    op_b(t);
    printf("a_leaving=%d\n", fakeAccess(a) != -1);
    CUdeviceptr z = must_alloc_ordered(2 * MIB, (CUstream)0x99);
    printf("a_mapped_after_z=%d\n", fakeAccess(a) != -1); /* its copy not waited for */
    printf("x_unmapped=%d\n", fakeAccess(x) == -1); /* its cached memory given back */
    fill(z, 2 * MIB, 6);
    fakeAdvance(-1);
    printf("bad_z=%ld\n", check(z, 2 * MIB, 6, 0));
    printf("bad_a=%ld\n", check(a, LEN, 3, 0));
    counters();
    return 0;
}

/* A swap-out for device memory (FAKE_DEVICE_BYTES: two 2 MiB blocks, no budget): the plan sends a
 * out after op_a; c's allocation finds the device full and waits for a's copy; reading a back
 * then finds it full again, so b, the least recently used, goes out for it (make_room); reading
 * b and c back does the same. */
static int scenario_room(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    sync_point(1); /* the test writes the plan now */
    op_b(b);
    op_a(a, 0, 0); /* a goes out after this op */
    op_b(b);
    CUdeviceptr c = must_alloc(2 * MIB);
    printf("c=%" PRIu64 "\n", (uint64_t)c);
    fill(c, 2 * MIB, 3);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0)); /* back on demand: b goes for it */
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* A handoff swap-in's host slot taken by a later swap-out (FAKE_HOST_BYTES: two 2 MiB slots;
 * budget two blocks). c's allocation evicts a into slot 1; the op on a evicts b (slot 2) and a
 * takes b's memory while b's copy out is queued: a's swap-in, reading slot 1, waits for that copy
 * on the handoff stream. d's allocation evicts c, which, the pool being full, takes a's slot: its
 * swap-out must wait for a's swap-in on that stream too (g_handoff_ev), not only on the first. */
static int scenario_slothandoff(void)
{
    CUdeviceptr a = must_alloc(2 * MIB);
    fill(a, 2 * MIB, 1);
    CUdeviceptr b = must_alloc(2 * MIB);
    fill(b, 2 * MIB, 2);
    CUdeviceptr c = must_alloc(2 * MIB);
    fill(c, 2 * MIB, 3);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    printf("a_out=%d\n", fakeAccess(a) == -1);
    op_a(a, 0, 0);
    printf("b_leaving=%d\n", fakeAccess(b) != -1);
    CUdeviceptr d = must_alloc(2 * MIB);
    fill(d, 2 * MIB, 4);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    printf("bad_d=%ld\n", check(d, 2 * MIB, 4, 0));
    counters();
    return 0;
}

/* A host slot reused across the two copy streams (FAKE_HOST_BYTES: one 2 MiB slot; budget one
 * block). b's allocation evicts a into the slot. The op on a brings it back: its swap-in copy
 * reads the slot on the host-to-device stream (queued, not run: manual streams); then b is
 * evicted for the budget and, the pool being full, takes a's slot: its swap-out must not write
 * the slot before a's swap-in has read it. */
static int scenario_slotreuse(void)
{
    CUdeviceptr a = must_alloc(2 * MIB);
    fill(a, 2 * MIB, 1);
    CUdeviceptr b = must_alloc(2 * MIB);
    fill(b, 2 * MIB, 2);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    printf("a_out=%d\n", fakeAccess(a) == -1);
    op_a(a, 0, 0);
    printf("b_leaving=%d\n", fakeAccess(b) != -1);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    counters();
    return 0;
}

typedef CUresult (*allocp_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*poolattr_fn)(CUmemoryPool, CUmemPool_attribute, void *);

static long long pool_attr(CUmemoryPool p, CUmemPool_attribute a)
{
    cuuint64_t v = 0;
    ((poolattr_fn)dlsym(lib, "cuMemPoolGetAttribute"))(p, a, &v);
    return (long long)v;
}

static CUmemoryPool make_pool(CUmemLocationType where, CUmemAllocationHandleType handles)
{
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = handles;
    props.location.type = where;
    props.location.id = 0;
    CUmemoryPool p = NULL;
    ((CUresult(*)(CUmemoryPool *, const CUmemPoolProps *))dlsym(lib, "cuMemPoolCreate"))(&p, &props);
    return p;
}

static void print_calls(const char *tag, long long create, long long reserve, long long release, long long map)
{
    printf("%s_create=%lld\n%s_reserve=%lld\n%s_release=%lld\n%s_map=%lld\n", tag,
           fakeCounter("create_calls") - create, tag, fakeCounter("reserve_calls") - reserve, tag,
           fakeCounter("release_calls") - release, tag, fakeCounter("map_calls") - map);
}

/* Stream-ordered blocks served by the shim: the cache, the stream point of a free, captures,
 * small blocks and pools, the pool queries, cuMemPoolTrimTo. */
static int scenario_ordered(void)
{
    alloca_fn aa = (alloca_fn)get("cuMemAllocAsync");
    freea_fn fa = (freea_fn)get("cuMemFreeAsync");
    allocp_fn ap = (allocp_fn)dlsym(lib, "cuMemAllocFromPoolAsync");
    CUstream s2 = (CUstream)0x99, s3 = (CUstream)0xAA;
    CUmemoryPool def = NULL;
    ((CUresult(*)(CUmemoryPool *, CUdevice))dlsym(lib, "cuDeviceGetDefaultMemPool"))(&def, 0);
    CUdeviceptr x = 0, y = 0, z = 0, w = 0, v = 0;
    printf("x_rc=%d\n", (int)aa(&x, LEN, S1));
    printf("x=%" PRIu64 "\n", (uint64_t)x);
    fill(x, LEN, 9);
    printf("bad_x=%ld\n", check(x, LEN, 9, 0));
    printf("used_live=%lld\nreserved_live=%lld\n", pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
           pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    /* the steady state: 20 rounds of allocate, use, free on one stream */
    long long c0 = fakeCounter("create_calls"), r0 = fakeCounter("reserve_calls"), l0 = fakeCounter("release_calls"),
              m0 = fakeCounter("map_calls");
    fa(x, S1);
    int same = 0;
    for (int i = 0; i < 20; i++) {
        aa(&y, LEN, S1);
        same += y == x;
        op_b(y);
        fa(y, S1);
    }
    printf("steady_same=%d\n", same);
    print_calls("steady", c0, r0, l0, m0);
    printf("used_cached=%lld\nreserved_cached=%lld\n", pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
           pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    printf("used_high=%lld\n", pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH));
    /* a free at its stream point: S1 blocked behind an event of a stream nobody advances */
    hold_back(S1);
    aa(&y, LEN, S1);
    printf("y_reused=%d\n", y == x);
    fa(y, S1); /* queued behind the wait: not reached yet */
    aa(&z, LEN, s2);
    printf("z_other=%d\nz_served=%d\n", z != y, z >= 0x20000000000ull);
    aa(&w, LEN, S1);
    printf("w_same_stream=%d\n", w == y);
    fa(w, S1);
    fakeAdvance(-1); /* S1 runs on: the free's event completes */
    aa(&v, LEN, s2);
    printf("v_after_event=%d\n", v == y);
    fa(v, s2);
    fa(z, s2);
    /* a graph capture, a small block: the driver's pool */
    CUdeviceptr c = 0, sm = 0;
    ((capture_fn)dlsym(lib, "cuStreamBeginCapture_v2"))(s3, CU_STREAM_CAPTURE_MODE_GLOBAL);
    printf("cap_rc=%d\n", (int)aa(&c, LEN, s3));
    CUgraph g;
    ((endcap_fn)dlsym(lib, "cuStreamEndCapture"))(s3, &g);
    printf("cap=%" PRIu64 "\n", (uint64_t)c);
    printf("cap_free_rc=%d\n", (int)fa(c, s3));
    /* a shim block freed inside a capture stays allocated: never handed out again */
    CUdeviceptr k = 0, k2 = 0;
    aa(&k, 8 * MIB, S1); /* a class of its own: the cache of LEN blocks is checked below */
    ((capture_fn)dlsym(lib, "cuStreamBeginCapture_v2"))(s3, CU_STREAM_CAPTURE_MODE_GLOBAL);
    printf("kept_free_rc=%d\n", (int)fa(k, s3));
    ((endcap_fn)dlsym(lib, "cuStreamEndCapture"))(s3, &g);
    aa(&k2, 8 * MIB, S1);
    printf("kept_mapped=%d\nkept_not_reused=%d\n", fakeAccess(k) != -1, k2 != k && k2 != 0);
    fa(k2, S1);
    printf("small_rc=%d\n", (int)aa(&sm, MIB / 2, S1));
    printf("small=%" PRIu64 "\n", (uint64_t)sm);
    fa(sm, S1);
    /* pools: device-located unexported (served), exportable or host-located or unknown (driver) */
    CUmemoryPool pd = make_pool(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_NONE);
    CUmemoryPool px = make_pool(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemoryPool ph = make_pool(CU_MEM_LOCATION_TYPE_HOST, CU_MEM_HANDLE_TYPE_NONE);
    CUdeviceptr q[4] = {0};
    CUmemoryPool pools[4] = {pd, px, ph, (CUmemoryPool)0x1234};
    for (int i = 0; i < 4; i++) {
        int r = (int)ap(&q[i], LEN, pools[i], S1);
        printf("pool%d_rc=%d\npool%d=%" PRIu64 "\n", i, r, i, (uint64_t)q[i]);
    }
    printf("pool0_used=%lld\ndefault_used_with_pool0=%lld\n", pool_attr(pd, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
           pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT));
    for (int i = 0; i < 4; i++)
        fa(q[i], S1);
    fakeAdvance(-1);
    /* trims: the pool's cached physical memory goes, its reservations stay */
    CUresult (*trim)(CUmemoryPool, size_t) = (CUresult(*)(CUmemoryPool, size_t))dlsym(lib, "cuMemPoolTrimTo");
    long long h0 = fakeCounter("handles");
    trim(pd, 0);
    printf("trim_pool0_handles=%lld\n", h0 - fakeCounter("handles"));
    printf("pool0_reserved_trimmed=%lld\n", pool_attr(pd, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    h0 = fakeCounter("handles");
    trim(def, 0);
    printf("trim_default_handles=%lld\n", h0 - fakeCounter("handles"));
    printf("reserved_trimmed=%lld\n", pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    /* after a trim the cached reservation comes back with new physical memory */
    c0 = fakeCounter("create_calls"), r0 = fakeCounter("reserve_calls"), l0 = fakeCounter("release_calls"),
    m0 = fakeCounter("map_calls");
    aa(&y, LEN, S1);
    printf("after_trim_reused=%d\n", y == x);
    print_calls("after_trim", c0, r0, l0, m0);
    fill(y, LEN, 4);
    printf("bad_after_trim=%ld\n", check(y, LEN, 4, 0));
    fa(y, S1);
    counters();
    return 0;
}

/* A stream-ordered block freed while its memory, handed over, is still copying out: budget 3
 * blocks of 2 MiB, a (cuMemAllocAsync on S1), b, c filled; y (cuMemAllocAsync on S1) evicts a and
 * takes its memory while a's copy out is queued (the shim streams do not run). cuMemFreeAsync(a)
 * takes effect at its stream point: no wait on the host for a's copy (a's range, still mapped to
 * y's memory, is unmapped once the copy ends). z, allocated on S1 after that, reuses a's cached
 * reservation. */
static int scenario_freegiven(void)
{
    freea_fn fa = (freea_fn)get("cuMemFreeAsync");
    CUdeviceptr a = must_alloc_ordered(2 * MIB, S1), b = must_alloc(2 * MIB), c = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    fill(c, 2 * MIB, 3);
    fakeAdvance(-1);
    CUdeviceptr y = must_alloc_ordered(2 * MIB, S1);
    printf("y=%" PRIu64 "\n", (uint64_t)y);
    printf("a_given=%d\n", fakeAccess(a) != -1);
    printf("free_a_rc=%d\n", (int)fa(a, S1));
    printf("a_mapped_after_free=%d\n", fakeAccess(a) != -1); /* its copy still queued: no wait */
    p_memset(y, 0x55555555u, 2 * MIB / 4, S1);
    fakeAdvance(-1);
    op_b(b); /* a's copy has ended: its range is unmapped */
    printf("a_unmapped=%d\n", fakeAccess(a) == -1);
    CUdeviceptr z = must_alloc_ordered(2 * MIB, S1);
    printf("z_reused=%d\n", z == a);
    p_memset(z, 0x66666666u, 2 * MIB / 4, S1); /* on its stream: it may hold a swap-out's memory too */
    fakeAdvance(-1);
    unsigned char *h = malloc(2 * MIB);
    p_dtoh(h, y, 2 * MIB);
    long bad = 0;
    for (size_t i = 0; i < 2 * MIB; i++)
        bad += h[i] != 0x55;
    free(h);
    printf("bad_y=%ld\n", bad);
    fakeAdvance(-1);
    h = malloc(2 * MIB);
    p_dtoh(h, z, 2 * MIB);
    bad = 0;
    for (size_t i = 0; i < 2 * MIB; i++)
        bad += h[i] != 0x66;
    free(h);
    printf("bad_z=%ld\n", bad);
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    fakeAdvance(-1);
    printf("free_z_rc=%d\nfree_y_rc=%d\n", (int)fa(z, S1), (int)fa(y, S1)); /* y's memory c's */
    fakeAdvance(-1);
    op_b(b);
    CUmemoryPool def = NULL;
    ((CUresult(*)(CUmemoryPool *, CUdevice))dlsym(lib, "cuDeviceGetDefaultMemPool"))(&def, 0);
    printf("used_end=%lld\nreserved_end=%lld\n", pool_attr(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
           pool_attr(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT));
    counters();
    return 0;
}

/* A pool destroyed with a cached reservation whose memory is gone: budget 3 blocks of 2 MiB, x
 * (from a created pool, on S1), a, b filled; c's allocation sends x out; x is freed while out
 * (its reservation cached, no memory) and the pool destroyed. d, allocated next, must still find
 * the device full (a, b, c): one of them goes out for it. */
static int scenario_pooldestroy(void)
{
    CUmemoryPool pd = make_pool(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_NONE);
    CUdeviceptr x = 0;
    printf("x_rc=%d\n", (int)((allocp_fn)dlsym(lib, "cuMemAllocFromPoolAsync"))(&x, 2 * MIB, pd, S1));
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB);
    printf("x=%" PRIu64 "\na=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)x, (uint64_t)a, (uint64_t)b);
    fill(x, 2 * MIB, 1);
    fill(a, 2 * MIB, 2);
    fill(b, 2 * MIB, 3);
    fakeAdvance(-1);
    CUdeviceptr c = must_alloc(2 * MIB);
    printf("c=%" PRIu64 "\nx_out=%d\n", (uint64_t)c, fakeAccess(x) == -1);
    fill(c, 2 * MIB, 4);
    printf("free_x_rc=%d\n", (int)((freea_fn)get("cuMemFreeAsync"))(x, S1));
    fakeAdvance(-1);
    printf("destroy_rc=%d\n", (int)((CUresult(*)(CUmemoryPool))dlsym(lib, "cuMemPoolDestroy"))(pd));
    CUdeviceptr d = must_alloc(2 * MIB);
    printf("d=%" PRIu64 "\n", (uint64_t)d);
    fill(d, 2 * MIB, 5);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 2, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 3, 0));
    fakeAdvance(-1);
    printf("bad_c=%ld\n", check(c, 2 * MIB, 4, 0));
    fakeAdvance(-1);
    printf("bad_d=%ld\n", check(d, 2 * MIB, 5, 0));
    fakeAdvance(-1);
    counters();
    return 0;
}

/* The device cannot hold more of the shim's memory (FAKE_DEVICE_BYTES): later stream-ordered
 * blocks go to the driver's pool, noted once. */
static int scenario_ordered_full(void)
{
    alloca_fn aa = (alloca_fn)get("cuMemAllocAsync");
    CUdeviceptr x = 0, y = 0, z = 0;
    printf("x_rc=%d\n", (int)aa(&x, LEN, S1));
    printf("y_rc=%d\n", (int)aa(&y, 2 * MIB + 1, S1));
    printf("y_free_rc=%d\n", (int)((freea_fn)get("cuMemFreeAsync"))(y, S1));
    printf("z_rc=%d\n", (int)aa(&z, 2 * MIB + 1, S1));
    printf("x=%" PRIu64 "\ny=%" PRIu64 "\nz=%" PRIu64 "\n", (uint64_t)x, (uint64_t)y, (uint64_t)z);
    counters();
    return 0;
}

/* Eviction under a plan (IDLE hints): a, b, c fill a budget of 3 blocks; the iteration is
 * [op_b(a), op_a(b, c)]. After it, a is the least recently used block but the next op needs it:
 * allocating d evicts b (idle the longest by the hints) under a plan that has them, a (LRU)
 * under one that does not. */
static int scenario_belady(void)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    sync_point(1); /* the test writes the plan */
    op_b(a);
    op_a(b, 0, c);
    fakeAdvance(-1);
    CUdeviceptr d = must_alloc(2 * MIB);
    fakeAdvance(-1);
    printf("d=%" PRIu64 "\n", (uint64_t)d);
    printf("a_out=%d\nb_out=%d\nc_out=%d\n", fakeAccess(a) == -1, fakeAccess(b) == -1, fakeAccess(c) == -1);
    op_b(a);
    op_a(b, 0, c);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* Pointer queries on a block that is out (Triton checks every pointer argument): a, b, c fill a
 * budget of 3 blocks, d's allocation sends a out; the query brings it back first, so the driver
 * answers as for any live pointer. */
static int scenario_ptrquery(const char *which)
{
    CUdeviceptr a, b, c;
    blocks_abc(&a, &b, &c);
    op_a(b, 0, c);
    fakeAdvance(-1);
    CUdeviceptr d = must_alloc(2 * MIB);
    fakeAdvance(-1);
    printf("d=%" PRIu64 "\na_out=%d\n", (uint64_t)d, fakeAccess(a) == -1);
    CUresult r;
    if (!strcmp(which, "attr")) {
        int v = 7;
        r = ((CUresult(*)(void *, CUpointer_attribute, CUdeviceptr))get("cuPointerGetAttribute"))(
            &v, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a + 4096);
    } else {
        CUdeviceptr base = 0;
        size_t size = 0;
        r = ((CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr))get("cuMemGetAddressRange"))(&base, &size, a + 4096);
    }
    printf("query_rc=%d\na_in=%d\n", (int)r, fakeAccess(a) != -1);
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    counters();
    return 0;
}

/* The release thread: a, b, c fill a budget of 3 blocks; a 512 KiB cuMemAlloc puts the device
 * over it, so the next op issues a's swap-out (no drain: not an allocation). The GPU has run
 * everything; then the program makes no CUDA call for 200 ms: with the thread, a's memory is
 * released meanwhile; without it (PYOBMEM_RELEASER=0), only at the next op. */
static int scenario_release(void)
{
    CUdeviceptr a, b, c, x = 0;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    printf("x_rc=%d\n", (int)p_alloc(&x, MIB / 2));
    op_a(c, 0, 0); /* over the budget: a's copy out is queued */
    fakeAdvance(-1);
    printf("a_mapped_before=%d\n", fakeAccess(a) != -1);
    struct timespec idle = {0, 200000000};
    nanosleep(&idle, NULL); /* no CUDA call */
    printf("a_out_while_idle=%d\n", fakeAccess(a) == -1);
    op_a(c, 0, 0);
    printf("a_out_after_op=%d\n", fakeAccess(a) == -1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    counters();
    return 0;
}

/* Swap-outs complete in issue order (one copy stream): budget 3 blocks, a, b, c; each of five new
 * 2 MiB blocks x0..x4 evicts the oldest block and takes its memory while its copy out is queued
 * (the shim stream never runs without fakeAdvance), so five copies out are in flight. Ten ops on
 * x4 then poll them with one cuEventQuery each (the oldest, still copying); after the stream
 * runs, one op's poll finds every one of them done. */
static int scenario_pollfifo(void)
{
    CUdeviceptr a, b, c, x[5];
    blocks_abc(&a, &b, &c);
    for (int i = 0; i < 5; i++) {
        x[i] = must_alloc_ordered(2 * MIB, S1);
        op_a(x[i], 0, 0);
    }
    long long q = fakeCounter("event_queries");
    for (int i = 0; i < 10; i++)
        op_a(x[4], 0, 0);
    printf("queries_held=%lld\n", fakeCounter("event_queries") - q);
    fakeAdvance(-1);
    q = fakeCounter("event_queries");
    op_a(x[4], 0, 0);
    printf("queries_done=%lld\n", fakeCounter("event_queries") - q);
    q = fakeCounter("event_queries");
    op_a(x[4], 0, 0);
    printf("queries_after=%lld\n", fakeCounter("event_queries") - q);
    check_abc(a, b, c, 2 * MIB);
    counters();
    return 0;
}

/* The queue of swap-outs: a, b, c of 96 MiB, all three planned out after op 1 (the test's plan at
 * sync point 1). The copy engine gets 64 MiB pieces while under PYOBMEM_OUT_AHEAD_MIB are in
 * flight; with 128 MiB (the tests' setting, the default is 512): a's two
 * and b's first, then (the shim stream has run) the rest at the next op's poll. sync 1 / 2
 * (ctxsync / streamsync): the application calls cuCtxSynchronize / cuStreamSynchronize of the
 * legacy stream right after op 1 (pieces the release thread issued while it waited:
 * pieces_fed_in_sync). Every byte of the three comes back. */
static int scenario_outqueue(int sync)
{
    size_t n = 96 * MIB;
    CUdeviceptr a = must_alloc(n), b = must_alloc(n), c = must_alloc(n), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    fill(a, n, 1);
    fill(b, n, 2);
    fill(c, n, 3);
    sync_point(1);
    long long d0 = fakeCounter("dtoh_async");
    op_b(t);
    op_a(t, 0, 0); /* a, b and c go out after it */
    printf("pieces_at_op=%lld\n", fakeCounter("dtoh_async") - d0);
    if (sync == 1)
        ((CUresult(*)(void))get("cuCtxSynchronize"))();
    else if (sync == 2)
        ((CUresult(*)(CUstream))get("cuStreamSynchronize"))(NULL);
    if (sync)
        printf("pieces_fed_in_sync=%lld\n", fakeCounter("ctx_sync_fed"));
    fakeAdvance(-1);
    op_b(t);
    printf("pieces_after_poll=%lld\n", fakeCounter("dtoh_async") - d0);
    fakeAdvance(-1);
    op_b(t);
    printf("a_out=%d\nc_out=%d\n", fakeAccess(a) == -1, fakeAccess(c) == -1);
    check_abc(a, b, c, n);
    counters();
    return 0;
}

/* The window near a host sync: a 100-op iteration (the test's plan at sync point 1) sends a, b
 * and c (96 MiB each) out after op `out` (70: near, 30: far), names them again at ops 91-93,
 * and the application syncs its stream after op 90. The first iteration, before any sync was
 * seen, issues all six 64 MiB pieces at once (the default 512 MiB in flight); the second, 20
 * ops before the sync's position, issues three (128 MiB), 60 ops before it six. Every byte of
 * the three comes back. */
static int scenario_syncwindow(int out)
{
    size_t n = 96 * MIB;
    CUdeviceptr a = must_alloc(n), b = must_alloc(n), c = must_alloc(n), t = must_alloc(2 * MIB);
    CUdeviceptr named[3] = {a, b, c};
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\nc=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b, (uint64_t)c);
    fill(a, n, 1);
    fill(b, n, 2);
    fill(c, n, 3);
    sync_point(1);
    for (int it = 1; it <= 2; it++) {
        op_a(t, 0, 0); /* position 0 */
        for (int pos = 1; pos < 100; pos++) {
            long long d0 = fakeCounter("dtoh_async");
            op_b(pos >= 91 && pos <= 93 ? named[pos - 91] : t);
            if (pos == out)
                printf("pieces_%d=%lld\n", it, fakeCounter("dtoh_async") - d0);
            if (pos == 90) {
                ((CUresult(*)(CUstream))get("cuStreamSynchronize"))(S1);
                fakeAdvance(-1);
            }
        }
        fakeAdvance(-1);
    }
    check_abc(a, b, c, n);
    counters();
    return 0;
}

/* Swap-outs complete in the order of their last piece: a of 192 MiB and b of 2 MiB planned out
 * after op 1 (the test's plan at sync point 1): a's first two pieces go to the copy engine, b
 * waits in the queue. y (cuMemAllocAsync, 2 MiB) takes b's memory, so b's whole copy is issued
 * at once, behind a's two pieces. Once those have run, the next op's poll issues a's last piece,
 * behind b's copy. The stream then runs b's copy only: the next op's poll finds b's copy done
 * (its range unmapped) while a's last piece still copies. Every byte of a and b comes back. */
static int scenario_handfifo(void)
{
    size_t n = 192 * MIB;
    CUdeviceptr a = must_alloc(n), b = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    fill(a, n, 1);
    fill(b, 2 * MIB, 2);
    sync_point(1);
    long long d0 = fakeCounter("dtoh_async");
    op_b(t);
    op_a(t, 0, 0); /* a and b go out after it */
    printf("pieces_at_op=%lld\n", fakeCounter("dtoh_async") - d0);
    CUdeviceptr y = must_alloc_ordered(2 * MIB, S1);
    printf("y=%" PRIu64 "\nb_given=%d\n", (uint64_t)y, fakeAccess(b) != -1);
    printf("pieces_at_handoff=%lld\n", fakeCounter("dtoh_async") - d0);
    printf("ran_a=%ld\n", fakeAdvance(6)); /* a's two pieces: copy and two records each */
    op_b(t);
    printf("pieces_after_poll=%lld\n", fakeCounter("dtoh_async") - d0);
    printf("ran_b=%ld\n", fakeAdvance(3)); /* b's copy and its two records */
    op_b(t);
    printf("b_out=%d\na_leaving=%d\n", fakeAccess(b) == -1, fakeAccess(a) != -1);
    fakeAdvance(-1);
    op_b(t);
    printf("a_out=%d\n", fakeAccess(a) == -1);
    printf("bad_a=%ld\n", check(a, n, 1, 0));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    counters();
    return 0;
}

/* A handoff never takes the memory of a swap-out the plan's IDLE hints say is needed soon
 * (needed_soon: within min(64, P / 4) ops): a then b, 2 MiB each, planned out after op 0 of a 100-op iteration
 * (the test's plan at sync point 1), a needed again at op 2, b at op 90. After op 1, y
 * (cuMemAllocAsync, 2 MiB) takes b's memory although a's swap-out is older; op 2 names a, whose
 * swap-out is then cancelled (its copy still queued: the shim stream never ran). Taking a's
 * memory would make op 2 wait on the host for a's copy and bring a back on demand. The same run
 * with b planned out after op 0 and a after op 1, neither needed soon: y takes b's memory, the
 * oldest swap-out, though a is first in the block table. */
static int scenario_handidle(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), b = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\nb=%" PRIu64 "\n", (uint64_t)a, (uint64_t)b);
    fill(a, 2 * MIB, 1);
    fill(b, 2 * MIB, 2);
    sync_point(1);
    op_a(t, 0, 0); /* position 0: a and b go out after it */
    op_b(t);       /* position 1 */
    CUdeviceptr y = must_alloc_ordered(2 * MIB, S1);
    printf("y=%" PRIu64 "\n", (uint64_t)y);
    op_b(a);       /* position 2 */
    fakeAdvance(-1);
    printf("bad_a=%ld\n", check(a, 2 * MIB, 1, 0));
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    counters();
    return 0;
}

/* A swap-out cancelled, then the block freed while its copy is still queued: budget 3 blocks, a,
 * b, c filled (LRU a, b, c); a 512 KiB cuMemAlloc puts the device over the budget, so the next
 * op issues a's swap-out. The shim stream does not run (no fakeAdvance): the copy out of a is
 * still queued when op_a(a) cancels the swap-out (a is resident again, b goes instead) and when
 * a is freed. The free must wait for that copy before unmapping a. */
static int scenario_cancelfree(void)
{
    CUdeviceptr a, b, c, x = 0;
    blocks_abc(&a, &b, &c);
    fakeAdvance(-1);
    printf("x_rc=%d\n", (int)p_alloc(&x, MIB / 2));
    op_a(c, 0, 0); /* over the budget: a's copy out is queued, not run */
    printf("a_mapped_before=%d\n", fakeAccess(a) != -1);
    op_a(a, 0, 0); /* a's swap-out is cancelled; b goes */
    printf("a_mapped_after_cancel=%d\n", fakeAccess(a) != -1);
    printf("free_a_rc=%d\n", (int)p_free(a));
    fakeAdvance(-1);
    printf("bad_b=%ld\n", check(b, 2 * MIB, 2, 0));
    printf("bad_c=%ld\n", check(c, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* Tensors of the iteration named by their allocation site (tests/test_swap_shim.py
 * test_tensors_named_by_site). Each of `iters` iterations:
 *   op 0 cuMemcpyHtoD(t); then x = LEN, s = 4 KiB (under min_swap_bytes: not counted), y = LEN,
 *        q = 2 MiB, all cuMemAllocAsync on S1: sites (0, 0), (0, 1), (0, 2)
 *   op 1 memset32(x, v), v = iteration + 1 in every byte;   op 2 op_b(y)
 *   op 3 op_a(x, LEN, w): w = x + 1;   op 4 cuMemcpyDtoH(w): every byte must be v + 1
 *   then y, x, s, q freed (async), y first: the cache gives the next x y's old block.
 * The plan (sync 1) swaps site (0, 0) out after op 1 and prefetches it before op 2, and names
 * site (0, 2) with LEN bytes (q has 2 MiB: never bound). */
static int scenario_sites(int iters)
{
    alloca_fn aa = (alloca_fn)get("cuMemAllocAsync");
    freea_fn fa = (freea_fn)get("cuMemFreeAsync");
    CUdeviceptr t = must_alloc(2 * MIB), w = must_alloc(LEN);
    printf("t=%" PRIu64 "\nw=%" PRIu64 "\n", (uint64_t)t, (uint64_t)w);
    sync_point(1);
    long bad = 0;
    unsigned char *h = calloc(1, LEN);
    for (int i = 0; i < iters; i++) {
        CUdeviceptr x = 0, sm = 0, y = 0, q = 0;
        p_htod(t, h, 16);
        aa(&x, LEN, S1);
        aa(&sm, 4096, S1);
        aa(&y, LEN, S1);
        aa(&q, 2 * MIB, S1);
        printf("x%d=%" PRIu64 "\ny%d=%" PRIu64 "\nq%d=%" PRIu64 "\n", i, (uint64_t)x, i, (uint64_t)y, i, (uint64_t)q);
        unsigned v = (unsigned)(i + 1) * 0x01010101u;
        p_memset(x, v, LEN / 4, S1);
        fakeAdvance(-1);
        op_b(y);
        fakeAdvance(-1);
        op_a(x, LEN, w);
        fakeAdvance(-1);
        memset(h, 0, LEN);
        p_dtoh(h, w, LEN);
        for (size_t k = 0; k < LEN; k++)
            bad += h[k] != (unsigned char)(i + 2);
        fa(y, S1);
        fa(x, S1);
        fa(sm, S1);
        fa(q, S1);
        fakeAdvance(-1);
    }
    free(h);
    printf("bad=%ld\n", bad);
    counters();
    return 0;
}

/* A template whose first key recurs with two ops in common: [op_b(t), op_a(a), op_b(t), op_a(t),
 * memset(t)] (kernel_b, kernel_a at 0 and at 2). The plan (sync 1) swaps a out after op 1. The host
 * joins mid-iteration at the second op_b (op_b, op_a, then a memset where op_b was expected): a
 * tentative sync there, given up without a drop; then three whole iterations. */
static int scenario_anchor(void)
{
    CUdeviceptr a = must_alloc(2 * MIB), t = must_alloc(2 * MIB);
    printf("a=%" PRIu64 "\n", (uint64_t)a);
    fill(a, 2 * MIB, 3);
    sync_point(1);
    op_b(t);
    op_a(t, 0, 0);
    p_memset(t, 0, 16, S1);
    for (int i = 0; i < 3; i++) {
        op_b(t);
        op_a(a, 0, 0);
        fakeAdvance(-1);
        op_b(t);
        op_a(t, 0, 0);
        p_memset(t, 0, 16, S1);
        fakeAdvance(-1);
    }
    printf("bad_a=%ld\n", check(a, 2 * MIB, 3, 0));
    counters();
    return 0;
}

/* A plan whose template never matches what runs: [op_b, op_a, op_b, memset] followed, while the
 * host issues op_b and memset only, 12 times. Every sync at op_b is tentative (the first key
 * recurs) and given up at the memset: after two iterations' worth of ops out of step, a drop. */
static int scenario_nosync(void)
{
    CUdeviceptr t = must_alloc(2 * MIB);
    sync_point(1);
    for (int i = 0; i < 12; i++) {
        op_b(t);
        p_memset(t, 0, 16, S1);
    }
    fakeAdvance(-1);
    counters();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    setup();
    const char *s = argv[1];
    int rc = 2;
    if (!strcmp(s, "roundtrip"))
        rc = scenario_roundtrip(argc > 2 ? atoi(argv[2]) : 20, argc > 3 && !strcmp(argv[3], "ordered"));
    else if (!strcmp(s, "cancelfree"))
        rc = scenario_cancelfree();
    else if (!strcmp(s, "syncwindow"))
        rc = scenario_syncwindow(argc > 2 ? atoi(argv[2]) : 70);
    else if (!strcmp(s, "outqueue"))
        rc = scenario_outqueue(argc < 3 ? 0 : !strcmp(argv[2], "ctxsync") ? 1 : !strcmp(argv[2], "streamsync") ? 2 : 0);
    else if (!strcmp(s, "handfifo"))
        rc = scenario_handfifo();
    else if (!strcmp(s, "handidle"))
        rc = scenario_handidle();
    else if (!strcmp(s, "pollfifo"))
        rc = scenario_pollfifo();
    else if (!strcmp(s, "release"))
        rc = scenario_release();
    else if (!strcmp(s, "belady"))
        rc = scenario_belady();
    else if (!strcmp(s, "ptrquery"))
        rc = scenario_ptrquery(argc > 2 ? argv[2] : "attr");
    else if (!strcmp(s, "remap"))
        rc = scenario_remap();
    else if (!strcmp(s, "mapfail"))
        rc = scenario_mapfail();
    else if (!strcmp(s, "foreach"))
        rc = scenario_foreach();
    else if (!strcmp(s, "opaque"))
        rc = scenario_opaque();
    else if (!strcmp(s, "capture"))
        rc = scenario_capture();
    else if (!strcmp(s, "never"))
        rc = scenario_never();
    else if (!strcmp(s, "budget"))
        rc = scenario_budget();
    else if (!strcmp(s, "oom"))
        rc = scenario_oom();
    else if (!strcmp(s, "pool"))
        rc = scenario_pool();
    else if (!strcmp(s, "plan"))
        rc = scenario_plan();
    else if (!strcmp(s, "graph"))
        rc = scenario_graph();
    else if (!strcmp(s, "graph_update"))
        rc = scenario_graph_update();
    else if (!strcmp(s, "graph_cond"))
        rc = scenario_graph_cond();
    else if (!strcmp(s, "graph_set_out"))
        rc = scenario_graph_set_out();
    else if (!strcmp(s, "batch"))
        rc = scenario_batch(argc > 2 ? argv[2] : "12080");
    else if (!strcmp(s, "ptrtable"))
        rc = scenario_ptrtable(argc > 2 ? argv[2] : "ptr", argc > 3 ? argv[3] : "sync",
                               argc > 4 && !strcmp(argv[4], "ordered"));
    else if (!strcmp(s, "hold"))
        rc = scenario_hold();
    else if (!strcmp(s, "handoff_ordered"))
        rc = scenario_handoff_ordered();
    else if (!strcmp(s, "ownleaving"))
        rc = scenario_ownleaving();
    else if (!strcmp(s, "freegiven"))
        rc = scenario_freegiven();
    else if (!strcmp(s, "pooldestroy"))
        rc = scenario_pooldestroy();
    else if (!strcmp(s, "sparewait"))
        rc = scenario_sparewait(argc > 2 && !strcmp(argv[2], "full"));
    else if (!strcmp(s, "forkexit"))
        rc = scenario_forkexit();
    else if (!strcmp(s, "handoff"))
        rc = scenario_handoff(argc > 2 ? argv[2] : "query");
    else if (!strcmp(s, "others"))
        rc = scenario_others(argc > 2 ? argv[2] : "small");
    else if (!strcmp(s, "ordered"))
        rc = scenario_ordered();
    else if (!strcmp(s, "freewait"))
        rc = scenario_freewait(argc > 2 && !strcmp(argv[2], "twice"));
    else if (!strcmp(s, "room"))
        rc = scenario_room();
    else if (!strcmp(s, "trimfirst"))
        rc = scenario_trimfirst();
    else if (!strcmp(s, "ordered_budget"))
        rc = scenario_ordered_budget();
    else if (!strcmp(s, "cachehandle"))
        rc = scenario_cachehandle();
    else if (!strcmp(s, "ctxsetup"))
        rc = scenario_ctxsetup();
    else if (!strcmp(s, "slothandoff"))
        rc = scenario_slothandoff();
    else if (!strcmp(s, "slotreuse"))
        rc = scenario_slotreuse();
    else if (!strcmp(s, "nosync"))
        rc = scenario_nosync();
    else if (!strcmp(s, "anchor"))
        rc = scenario_anchor();
    else if (!strcmp(s, "sites"))
        rc = scenario_sites(argc > 2 ? atoi(argv[2]) : 4);
    else if (!strcmp(s, "ordered_full"))
        rc = scenario_ordered_full();
    printf("done=1\n");
    return rc;
}
