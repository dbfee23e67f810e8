// Spike: one reserved range backed by several physical handles (chunks). Does one cuMemSetAccess
// and one cuMemUnmap cover them all? Costs per call (us). Also: map a partial handle (offset>0).
#include <cuda.h>
#include <stdio.h>
#include <time.h>
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s; cuGetErrorString(r_, &s); printf("%s -> %d %s\n", #x, (int)r_, s); } } while (0)
__global__ void touch(float *p, size_t n) { size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; if (i < n) p[i] = p[i] * 2.0f + 1.0f; }
int main(void)
{
    CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp prop = {}; prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    size_t g; CK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM)); printf("granularity %zu\n", g);
    const int N = 16; size_t C = 2u << 20, S = N * C;
    for (int rep = 0; rep < 3; rep++) {
        CUdeviceptr va; CK(cuMemAddressReserve(&va, S, 0, 0, 0));
        CUmemGenericAllocationHandle h[N];
        double t0 = now_us(); for (int i = 0; i < N; i++) CK(cuMemCreate(&h[i], C, &prop, 0)); double t1 = now_us();
        for (int i = 0; i < N; i++) CK(cuMemMap(va + i * C, C, 0, h[i], 0)); double t2 = now_us();
        CUmemAccessDesc d = {}; d.location = prop.location; d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CK(cuMemSetAccess(va, S, &d, 1)); double t3 = now_us();
        CK(cuMemsetD32(va, 0x3f800000u, S / 4)); touch<<<(unsigned)(S / 4 / 256), 256>>>((float *)va, S / 4); CK(cuCtxSynchronize());
        float v[2]; CK(cuMemcpyDtoH(v, va + S - 8, 8)); printf("rep %d value %.1f (3.0 expected)\n", rep, v[0]);
        double t4 = now_us(); CUresult ru = cuMemUnmap(va, S); double t5 = now_us();
        printf("rep %d: create %.1f us/chunk, map %.2f us/chunk, setaccess(whole %zu MiB) %.1f us, unmap(whole) rc=%d %.1f us\n",
               rep, (t1 - t0) / N, (t2 - t1) / N, S >> 20, t3 - t2, (int)ru, t5 - t4);
        if (ru != CUDA_SUCCESS) { double t6 = now_us(); for (int i = 0; i < N; i++) CK(cuMemUnmap(va + i * C, C)); printf("  per-chunk unmap %.1f us/chunk\n", (now_us() - t6) / N); }
        // re-map the same handles in reverse order (any chunk at any place), per-chunk unmap cost
        for (int i = 0; i < N; i++) CK(cuMemMap(va + i * C, C, 0, h[N - 1 - i], 0));
        CK(cuMemSetAccess(va, S, &d, 1)); touch<<<(unsigned)(S / 4 / 256), 256>>>((float *)va, S / 4); CK(cuCtxSynchronize());
        double t7 = now_us(); for (int i = 0; i < N; i++) CK(cuMemUnmap(va + i * C, C)); printf("  per-chunk unmap %.1f us/chunk\n", (now_us() - t7) / N);
        // partial map of a 32 MiB handle: offset 4 MiB, 8 MiB long
        CUmemGenericAllocationHandle big; CK(cuMemCreate(&big, S, &prop, 0));
        CUresult rp = cuMemMap(va, 4 * C, 2 * C, big, 0); printf("  partial map (offset 4 MiB) rc=%d\n", (int)rp);
        if (rp == CUDA_SUCCESS) CK(cuMemUnmap(va, 4 * C));
        rp = cuMemMap(va, 4 * C, 0, big, 0); printf("  prefix map (offset 0, 8 of 32 MiB) rc=%d\n", (int)rp);
        if (rp == CUDA_SUCCESS) { CK(cuMemSetAccess(va, 4 * C, &d, 1)); CK(cuMemsetD32(va, 1, 4 * C / 4)); CK(cuCtxSynchronize()); CK(cuMemUnmap(va, 4 * C)); }
        CK(cuMemRelease(big));
        for (int i = 0; i < N; i++) CK(cuMemRelease(h[i]));
        CK(cuMemAddressFree(va, S));
    }
    printf("done\n");
    return 0;
}
