/*
 * Loop microbenchmark of the stream-ordered allocation path (scripts/bench_alloc_path.py): the
 * host time per cuMemAllocAsync + cuMemFreeAsync pair of one size on one stream in the steady
 * state, with or without the shim preloaded (swap mode serves such blocks from its cache).
 *
 *   alloc_loop BYTES PAIRS   ->  "bytes=N", "pairs=N", "us_per_pair=F", "rc=0"
 *
 * libcuda is opened with dlopen (no link-time CUDA dependency; the shim's dlsym hook hands out
 * its wrappers as for any application). 200 pairs warm the pool up before timing; the stream is
 * synchronised at the end, inside the timed span, so queued frees are counted too.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WARM 200

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*devget_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setctx_fn)(CUcontext);
typedef CUresult (*mkstream_fn)(CUstream *, unsigned);
typedef CUresult (*sync_fn)(CUstream);
typedef CUresult (*alloca_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*freea_fn)(CUdeviceptr, CUstream);

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: alloc_loop BYTES PAIRS\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 0);
    long pairs = atol(argv[2]);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "alloc_loop: libcuda.so.1: %s\n", dlerror());
        return 3;
    }
    init_fn init = (init_fn)dlsym(lib, "cuInit");
    devget_fn devget = (devget_fn)dlsym(lib, "cuDeviceGet");
    retain_fn retain = (retain_fn)dlsym(lib, "cuDevicePrimaryCtxRetain"); /* with cuCtxSetCurrent */
    setctx_fn setctx = (setctx_fn)dlsym(lib, "cuCtxSetCurrent");
    mkstream_fn mkstream = (mkstream_fn)dlsym(lib, "cuStreamCreate");
    sync_fn sync = (sync_fn)dlsym(lib, "cuStreamSynchronize");
    alloca_fn alloca_ = (alloca_fn)dlsym(lib, "cuMemAllocAsync");
    freea_fn freea = (freea_fn)dlsym(lib, "cuMemFreeAsync");
    if (!init || !devget || !mkstream || !sync || !alloca_ || !freea) {
        fprintf(stderr, "alloc_loop: libcuda lacks a function\n");
        return 3;
    }
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    if (init(0) || devget(&dev, 0) || (retain && (retain(&ctx, dev) || setctx(ctx))) ||
        mkstream(&s, CU_STREAM_NON_BLOCKING)) {
        fprintf(stderr, "alloc_loop: no CUDA device\n");
        return 3;
    }
    CUresult r = CUDA_SUCCESS;
    double t0 = 0;
    for (long i = 0; i < WARM + pairs && r == CUDA_SUCCESS; i++) {
        if (i == WARM) {
            sync(s);
            t0 = now_us();
        }
        CUdeviceptr p = 0;
        r = alloca_(&p, bytes, s);
        if (r == CUDA_SUCCESS)
            r = freea(p, s);
    }
    sync(s);
    double us = now_us() - t0;
    printf("bytes=%zu\npairs=%ld\nus_per_pair=%.4f\nrc=%d\n", bytes, pairs, us / (double)pairs, (int)r);
    return r == CUDA_SUCCESS ? 0 : 1;
}
