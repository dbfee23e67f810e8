// C03/C04/C05: the CUDA runtime API launching one kernel three ways, each on its own pair of
// buffers: <<<>>>, cudaLaunchKernelEx with a launch attribute, cudaLaunchCooperativeKernel.
// Built twice by the tests: with the shared runtime (C03, C05) and with nvcc's default static
// runtime (C04: no cudaMalloc symbol to interpose). Prints "@ key=value" lines.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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

__global__ void touch2(const float *a, float *b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        b[i] = a[i] + 1.0f;
}

static const int NV = 3;
static const int N = 32768;
static const char *names[NV] = {"chevron", "launch_ex", "cooperative"};

int main()
{
    printf("@ pid=%d\n", (int)getpid());
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("@ stream=0x%llx\n", (unsigned long long)(uintptr_t)s);
    float *a[NV], *b[NV];
    for (int v = 0; v < NV; v++) {
        size_t sa = (size_t)(v + 1) * 1048576 + 4000, sb = (size_t)(v + 1) * 524288 + 2000;
        CK(cudaMalloc(&a[v], sa));
        CK(cudaMalloc(&b[v], sb));
        CK(cudaMemsetAsync(a[v], 0, sa, s));
        printf("@ %s_a=%p\n@ %s_b=%p\n@ %s_size_a=%zu\n@ %s_size_b=%zu\n", names[v], (void *)a[v], names[v],
               (void *)b[v], names[v], sa, names[v], sb);
    }
    int n = N;

    touch2<<<N / 256, 256, 0, s>>>(a[0], b[0], n);
    CK(cudaGetLastError());

    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributePriority;
    attr[0].val.priority = 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(N / 256);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, touch2, (const float *)a[1], b[1], n));

    int coop = 0;
    CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, 0));
    printf("@ cooperative_supported=%d\n", coop);
    void *args[] = {&a[2], &b[2], &n};
    CK(cudaLaunchCooperativeKernel((void *)touch2, dim3(32), dim3(256), args, 0, s));
    CK(cudaStreamSynchronize(s));

    static float host[N];
    int bad = 0;
    for (int v = 0; v < NV; v++) {
        int count = v == 2 ? 32 * 256 : N;
        CK(cudaMemcpy(host, b[v], count * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < count; i++)
            bad += host[i] != 1.0f;
    }
    printf("@ wrong_values=%d\n", bad);
    for (int v = 0; v < NV; v++) {
        CK(cudaFree(a[v]));
        CK(cudaFree(b[v]));
    }
    printf("@ done=1\n");
    return bad ? 1 : 0;
}
