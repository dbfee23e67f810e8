// Host time per op kind: what an application thread spends issuing one kernel launch (three
// pointer arguments, or one 512-byte struct), async copy, async set or stream-ordered alloc+free
// pair (the CUDA runtime, shared cudart, as frameworks use it). Run once untraced and once under pyobmem-run: the difference is the shim's
// cost per op (scripts/bench_trace_overhead.py does both and the statistics).
//
// Each op kind is issued in chunks of CHUNK ops on one non-blocking stream; only the issuing is
// timed and the stream is synchronised between chunks, so the device queue never fills and the
// figure is host time, not GPU throughput. Also timed: clock_gettime(CLOCK_MONOTONIC), which the
// shim calls once per record (a VM without a vDSO clock makes it a system call).
//
//     op_cost [--ops N] [--json PATH]      prints "@ op=<kind> us_per_op=<x>" lines
#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK 256
#define CHECK(x)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "op_cost: %s: %s\n", #x, cudaGetErrorString(e_));             \
            exit(2);                                                                      \
        }                                                                                 \
    } while (0)

__global__ void empty3(float *a, float *b, float *c)
{
    if (threadIdx.x == 1024) // never: the arguments are read, nothing is written
        a[0] = b[0] + c[0];
}

// A framework's elementwise or reduction kernel takes a struct of sizes and strides by value:
// 512 bytes, two pointers and 62 words that are no address.
struct args512 {
    float *a, *b;
    unsigned long long w[62];
};
__global__ void empty_struct(args512 p)
{
    if (threadIdx.x == 1024)
        p.a[0] = p.b[p.w[0]];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum kind { LAUNCH, LAUNCH_STRUCT, MEMCPY_ASYNC, MEMSET_ASYNC, ALLOC_FREE_ASYNC, N_KINDS };
static const char *const NAMES[N_KINDS] = {"launch", "launch_struct", "memcpy_async", "memset_async",
                                           "alloc_free_async"};

static float *g_a, *g_b, *g_c;
static args512 g_args;
static cudaStream_t g_s;

static void issue(int k)
{
    switch (k) {
    case LAUNCH:
        empty3<<<1, 32, 0, g_s>>>(g_a, g_b, g_c);
        break;
    case LAUNCH_STRUCT:
        empty_struct<<<1, 32, 0, g_s>>>(g_args);
        break;
    case MEMCPY_ASYNC:
        CHECK(cudaMemcpyAsync(g_b, g_a, 4096, cudaMemcpyDeviceToDevice, g_s));
        break;
    case MEMSET_ASYNC:
        CHECK(cudaMemsetAsync(g_c, 0, 4096, g_s));
        break;
    case ALLOC_FREE_ASYNC: {
        void *p = NULL;
        CHECK(cudaMallocAsync(&p, 8192, g_s));
        CHECK(cudaFreeAsync(p, g_s));
        break;
    }
    }
}

// Microseconds of host time per op over n ops (issue only, in chunks).
static double time_kind(int k, long n)
{
    double issue_s = 0;
    for (long done = 0; done < n; done += CHUNK) {
        CHECK(cudaStreamSynchronize(g_s));
        double t0 = now_s();
        for (int i = 0; i < CHUNK; i++)
            issue(k);
        issue_s += now_s() - t0;
    }
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(g_s));
    return issue_s * 1e6 / (double)(n / CHUNK * CHUNK);
}

static double clock_ns(void)
{
    const int n = 1000000;
    struct timespec ts;
    double t0 = now_s();
    for (int i = 0; i < n; i++)
        clock_gettime(CLOCK_MONOTONIC, &ts);
    return (now_s() - t0) * 1e9 / n;
}

int main(int argc, char **argv)
{
    long n = 20000;
    const char *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ops") && i + 1 < argc)
            n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else {
            fprintf(stderr, "usage: op_cost [--ops N] [--json PATH]\n");
            return 2;
        }
    }
    if (n < CHUNK)
        n = CHUNK;
    CHECK(cudaSetDevice(0));
    CHECK(cudaStreamCreateWithFlags(&g_s, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&g_a, 1 << 20));
    CHECK(cudaMalloc(&g_b, 1 << 20));
    CHECK(cudaMalloc(&g_c, 1 << 20));
    g_args.a = g_a;
    g_args.b = g_b;
    for (int i = 0; i < 62; i++)
        g_args.w[i] = (i & 1) ? (unsigned long long)i * 4096 : 0x3f8000003f800000ull; // strides; floats
    double us[N_KINDS];
    for (int k = 0; k < N_KINDS; k++) {
        time_kind(k, CHUNK * 8); // warm-up: module load, pools, first-sight layouts
        us[k] = time_kind(k, n);
        printf("@ op=%s us_per_op=%.4f\n", NAMES[k], us[k]);
    }
    double cns = clock_ns();
    printf("@ op=clock_gettime ns_per_call=%.2f\n", cns);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "op_cost: cannot write %s\n", json);
            return 2;
        }
        fprintf(f, "{\"ops_per_kind\": %ld, \"us_per_op\": {", n);
        for (int k = 0; k < N_KINDS; k++)
            fprintf(f, "%s\"%s\": %.4f", k ? ", " : "", NAMES[k], us[k]);
        fprintf(f, "}, \"clock_gettime_ns\": %.2f}\n", cns);
        fclose(f);
    }
    CHECK(cudaFree(g_a));
    CHECK(cudaFree(g_b));
    CHECK(cudaFree(g_c));
    CHECK(cudaStreamDestroy(g_s));
    return 0;
}
