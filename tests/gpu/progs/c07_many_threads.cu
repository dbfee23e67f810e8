// C06/C07: many host threads launching tiny kernels at once, each on its own stream with its own
// three buffers. usage: c07_many_threads THREADS LAUNCHES_PER_THREAD
// Each thread makes WARMUP untimed launches, then all start together and make LAUNCHES timed ones.
// Prints the total launch count, every thread's buffers, and the wall time per timed launch.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void tiny3(float *a, float *b, float *c)
{
    if (threadIdx.x == 0x7fffffff) // never: keeps the three pointer parameters
        a[0] = b[0] + c[0];
}

static const int WARMUP = 100;
static std::atomic<int> g_ready{0};
static std::atomic<bool> g_go{false};

struct Slot {
    float *buf[3];
    size_t size[3];
};

static void worker(int t, int launches, Slot *slot)
{
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int k = 0; k < 3; k++) {
        slot->size[k] = (size_t)65536 * (k + 1) + 256 * (size_t)t;
        CK(cudaMalloc(&slot->buf[k], slot->size[k]));
    }
    for (int i = 0; i < WARMUP; i++)
        tiny3<<<1, 32, 0, s>>>(slot->buf[0], slot->buf[1], slot->buf[2]);
    CK(cudaStreamSynchronize(s));
    g_ready++;
    while (!g_go.load(std::memory_order_acquire))
        ;
    for (int i = 0; i < launches; i++)
        tiny3<<<1, 32, 0, s>>>(slot->buf[0], slot->buf[1], slot->buf[2]);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(s));
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    int launches = argc > 2 ? atoi(argv[2]) : 20000;
    printf("@ pid=%d\n@ threads=%d\n@ launches=%ld\n@ timed_launches=%ld\n", (int)getpid(), threads,
           (long)threads * (launches + WARMUP), (long)threads * launches);
    CK(cudaSetDevice(0));
    CK(cudaFree(0)); // context up before the threads start
    std::vector<Slot> slots(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
        pool.emplace_back(worker, t, launches, &slots[t]);
    while (g_ready.load() < threads)
        std::this_thread::yield();
    auto t0 = std::chrono::steady_clock::now();
    g_go.store(true, std::memory_order_release);
    for (auto &th : pool)
        th.join();
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
    for (int t = 0; t < threads; t++)
        for (int k = 0; k < 3; k++)
            printf("@ buf_%d_%d=%p\n@ size_%d_%d=%zu\n", t, k, (void *)slots[t].buf[k], t, k, slots[t].size[k]);
    printf("@ wall_ns=%.0f\n@ ns_per_launch=%.1f\n@ done=1\n", ns, ns / ((double)threads * launches));
    return 0;
}
