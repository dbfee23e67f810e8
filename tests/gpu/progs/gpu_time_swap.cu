/* The mechanism a swap executor acting in GPU time needs (docs/swap.md, "Acting in GPU time"): the
 * host issues a whole iteration ahead of the GPU, and a swap-in must still happen when the GPU gets
 * there. Host thread, all at once without waiting: producer kernel on the app stream A, an event,
 * the swap-out copy on a device-to-host stream after that event, a long kernel on A (the rest of
 * the forward pass), then cuStreamWaitValue32 on A (a flag) and the consumer kernel. A helper
 * thread in GPU time: when the swap-out copy ends it unmaps and releases the block's memory (the
 * free memory the driver reports grows); when the GPU reaches the mark (an event after the long
 * kernel started), it creates and maps new memory at the same address, copies the data back on a
 * host-to-device stream and writes the flag from that stream. The consumer must read the
 * producer's values. Prints "@ key=value" lines.
 *
 *     nvcc -o gpu_time_swap gpu_time_swap.cu -lcuda && ./gpu_time_swap [MiB] [sleep_ms] [gpu|host]
 *
 * "gpu": the flag is device memory written by cuStreamWriteValue32 on the host-to-device stream;
 * "host": mapped pinned host memory the helper thread sets once the copy is done. The first hung on
 * the H200 (driver 580): the app stream never saw the flag (an alarm reports where each thread was).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static pthread_t g_main_thread;
static const char *volatile g_main = "start", *volatile g_helper = "not started";
static void on_alarm(int sig)
{
    (void)sig;
    fprintf(stderr, "@ hung_main=%s\n@ hung_helper=%s\n", g_main, g_helper);
    _exit(3);
}

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        if (pthread_self() == g_main_thread) g_main = #x; else g_helper = #x;                                                                                                               \
        CUresult r_ = (x);                                                                                             \
        if (r_ != CUDA_SUCCESS) {                                                                                      \
            const char *s_ = "?";                                                                                      \
            cuGetErrorName(r_, &s_);                                                                                   \
            fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_);                                           \
            exit(2);                                                                                                   \
        }                                                                                                              \
    } while (0)

__global__ void produce(uint32_t *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint32_t)(i * 2654435761u);
}

__global__ void spin(long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

__global__ void check(const uint32_t *p, size_t n, unsigned long long *bad)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != (uint32_t)(i * 2654435761u))
            atomicAdd(bad, 1ull);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

struct swap {
    CUdeviceptr va;
    size_t size;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;
    CUmemGenericAllocationHandle phys;
    void *host;
    CUstream h2d;
    CUevent out_done, mark;
    CUdeviceptr flag;
    volatile uint32_t *host_flag; /* mode "host": the flag in mapped pinned host memory */
    CUcontext ctx;
    double t_released, t_mapped, free_before, free_released;
};

static void *gpu_time_thread(void *arg)
{
    struct swap *s = (struct swap *)arg;
    size_t fr, tot;
    CK(cuCtxSetCurrent(s->ctx));
    CK(cuEventSynchronize(s->out_done)); /* the swap-out copy ended: release the memory */
    CK(cuMemGetInfo(&fr, &tot));
    s->free_before = fr / 1048576.0;
    CK(cuMemUnmap(s->va, s->size));
    CK(cuMemRelease(s->phys));
    CK(cuMemGetInfo(&fr, &tot));
    s->free_released = fr / 1048576.0;
    s->t_released = now_ms();
    CK(cuEventSynchronize(s->mark)); /* the GPU reached the mark: bring the block back */
    CK(cuMemCreate(&s->phys, s->size, &s->prop, 0));
    CK(cuMemMap(s->va, s->size, 0, s->phys, 0));
    CK(cuMemSetAccess(s->va, s->size, &s->access, 1));
    s->t_mapped = now_ms();
    CK(cuMemcpyHtoDAsync(s->va, s->host, s->size, s->h2d));
    if (s->host_flag) { /* the CPU sets the flag once the copy is done */
        CK(cuStreamSynchronize(s->h2d));
        __atomic_store_n(s->host_flag, 1u, __ATOMIC_RELEASE);
    } else {
        CK(cuStreamWriteValue32(s->h2d, s->flag, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
    }
    g_helper = "done";
    return NULL;
}

int main(int argc, char **argv)
{
    g_main_thread = pthread_self();
    signal(SIGALRM, on_alarm);
    alarm(20);
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1024;
    int sleep_ms = argc > 2 ? atoi(argv[2]) : 100;
    int host_mode = argc > 3 && !strcmp(argv[3], "host"); /* who writes the flag: "gpu" (default) or "host" */
    struct swap s = {};
    s.size = mib << 20;
    cudaFree(0); /* the primary context */
    CK(cuCtxGetCurrent(&s.ctx));
    CUdevice dev;
    CK(cuCtxGetDevice(&dev));
    int clock_khz = 0;
    CK(cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
    s.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    s.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    s.prop.location.id = dev;
    s.access.location = s.prop.location;
    s.access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t gran = 0;
    CK(cuMemGetAllocationGranularity(&gran, &s.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    s.size = (s.size + gran - 1) / gran * gran;
    CK(cuMemAddressReserve(&s.va, s.size, 0, 0, 0));
    CK(cuMemCreate(&s.phys, s.size, &s.prop, 0));
    CK(cuMemMap(s.va, s.size, 0, s.phys, 0));
    CK(cuMemSetAccess(s.va, s.size, &s.access, 1));
    CK(cuMemHostAlloc(&s.host, s.size, 0));
    if (host_mode) {
        void *hf;
        CK(cuMemHostAlloc(&hf, 4, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
        s.host_flag = (volatile uint32_t *)hf;
        *s.host_flag = 0;
        CK(cuMemHostGetDevicePointer(&s.flag, hf, 0));
    } else {
        CK(cuMemAlloc(&s.flag, 4));
        CK(cuMemsetD32(s.flag, 0, 1));
    }
    unsigned long long *bad;
    CK(cuMemAlloc((CUdeviceptr *)&bad, 8));
    CK(cuMemsetD32((CUdeviceptr)bad, 0, 2));
    CUstream A, d2h;
    CK(cuStreamCreate(&A, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&d2h, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s.h2d, CU_STREAM_NON_BLOCKING));
    CUevent last_use, t0, t1;
    CK(cuEventCreate(&last_use, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&s.out_done, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&s.mark, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&t0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&t1, CU_EVENT_DEFAULT));
    size_t n = s.size / 4;
    long long half = (long long)clock_khz * sleep_ms / 2; /* cycles of sleep_ms / 2 */

    /* The host issues the whole "iteration" at once. */
    double h0 = now_ms();
    CK(cuEventRecord(t0, A));
    produce<<<1024, 256, 0, (cudaStream_t)A>>>((uint32_t *)s.va, n);
    CK(cuEventRecord(last_use, A));
    CK(cuStreamWaitEvent(d2h, last_use, 0));
    CK(cuMemcpyDtoHAsync(s.host, s.va, s.size, d2h));
    CK(cuEventRecord(s.out_done, d2h));
    spin<<<1, 1, 0, (cudaStream_t)A>>>(half);
    CK(cuEventRecord(s.mark, A)); /* the mark: half-way through the idle stretch */
    spin<<<1, 1, 0, (cudaStream_t)A>>>(half);
    CK(cuStreamWaitValue32(A, s.flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    check<<<1024, 256, 0, (cudaStream_t)A>>>((const uint32_t *)s.va, n, bad);
    CK(cuEventRecord(t1, A));
    double issued = now_ms() - h0;
    pthread_t th;
    pthread_create(&th, NULL, gpu_time_thread, &s);
    CK(cuStreamSynchronize(A));
    double done = now_ms() - h0;
    pthread_join(th, NULL);
    unsigned long long nbad = 0;
    CK(cuMemcpyDtoH(&nbad, (CUdeviceptr)bad, 8));
    float gpu_ms = 0;
    CK(cuEventElapsedTime(&gpu_ms, t0, t1));
    printf("@ bytes=%zu\n@ host_issue_ms=%.3f\n@ wall_ms=%.3f\n@ gpu_ms=%.3f\n", s.size, issued, done, gpu_ms);
    printf("@ released_at_ms=%.3f\n@ mapped_at_ms=%.3f\n", s.t_released - h0, s.t_mapped - h0);
    printf("@ free_mib_before=%.0f\n@ free_mib_released=%.0f\n@ mismatches=%llu\n", s.free_before, s.free_released, nbad);
    CK(cuStreamQuery(A));
    return nbad ? 1 : 0;
}
