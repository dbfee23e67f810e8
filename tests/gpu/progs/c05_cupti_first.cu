// C05: another tool holds CUPTI. Before any CUDA call this program dlopens libcupti, subscribes
// (as Nsight Systems or a framework profiler would) and enables the runtime-API callback domain,
// counting the callbacks it gets; then it allocates and launches. usage: c05_cupti_first LIBCUPTI
// Exit 3 if its own subscription fails; "@ runtime_callbacks=N" must match the untraced run.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <cupti_callbacks.h>
#include <cupti_result.h>

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

typedef CUptiResult (*subscribe_t)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult (*enable_domain_t)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
typedef CUptiResult (*unsubscribe_t)(CUpti_SubscriberHandle);

static std::atomic<long> g_callbacks{0};

static void CUPTIAPI on_callback(void *, CUpti_CallbackDomain domain, CUpti_CallbackId, const void *data)
{
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cb->callbackSite == CUPTI_API_ENTER)
        g_callbacks++;
}

__global__ void touch2(const float *a, float *b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        b[i] = a[i] + 1.0f;
}

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libcupti.so.13";
    printf("@ pid=%d\n", (int)getpid());
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        return 4;
    }
    subscribe_t subscribe = (subscribe_t)dlsym(h, "cuptiSubscribe");
    enable_domain_t enable_domain = (enable_domain_t)dlsym(h, "cuptiEnableDomain");
    unsubscribe_t unsubscribe = (unsubscribe_t)dlsym(h, "cuptiUnsubscribe");
    CUpti_SubscriberHandle sub;
    CUptiResult r = subscribe(&sub, (CUpti_CallbackFunc)on_callback, nullptr);
    printf("@ subscribe_rc=%d\n", (int)r);
    if (r != CUPTI_SUCCESS)
        return 3;
    r = enable_domain(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API);
    printf("@ enable_rc=%d\n", (int)r);
    if (r != CUPTI_SUCCESS)
        return 3;
    fflush(stdout);

    const int N = 65536;
    const size_t SA = 5 * 1048576 + 12, SB = 3 * 1048576 + 20;
    float *a, *b;
    CK(cudaMalloc(&a, SA));
    CK(cudaMalloc(&b, SB));
    CK(cudaMemset(a, 0, SA));
    printf("@ a=%p\n@ b=%p\n@ size_a=%zu\n@ size_b=%zu\n@ launches=5\n", (void *)a, (void *)b, SA, SB);
    for (int i = 0; i < 5; i++)
        touch2<<<N / 256, 256>>>(a, b, N);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    static float host[N];
    CK(cudaMemcpy(host, b, sizeof host, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += host[i] != 1.0f;
    CK(cudaFree(a));
    CK(cudaFree(b));
    printf("@ wrong_values=%d\n@ runtime_callbacks=%ld\n", bad, g_callbacks.load());
    printf("@ unsubscribe_rc=%d\n@ done=1\n", (int)unsubscribe(sub));
    return bad ? 1 : 0;
}
