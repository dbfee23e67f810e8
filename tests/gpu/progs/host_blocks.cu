// Pinned and mapped host memory as host blocks (issue 10): a kernel on memory from cudaHostAlloc
// (mapped), one on a cudaHostRegister'ed range through the device pointer the runtime gives, one on
// a device buffer and a pinned one. Prints "@ key=value" lines.
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

__global__ void bump(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] += 1;
}

__global__ void copy(const int *src, int *dst, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = src[i];
}

int main()
{
    printf("@ pid=%d\n", (int)getpid());
    CK(cudaSetDevice(0));
    const int n = 1024;
    const size_t bytes = n * sizeof(int), reg_bytes = 1 << 16;
    int *pinned = nullptr, *dev = nullptr, *reg_dptr = nullptr;
    CK(cudaHostAlloc((void **)&pinned, bytes, cudaHostAllocMapped));
    int *reg = (int *)aligned_alloc(4096, reg_bytes);
    CK(cudaHostRegister(reg, reg_bytes, cudaHostRegisterMapped));
    CK(cudaHostGetDevicePointer((void **)&reg_dptr, reg, 0));
    CK(cudaMalloc((void **)&dev, bytes));
    for (int i = 0; i < n; i++)
        pinned[i] = reg[i] = i;
    printf("@ pinned=%p\n@ pinned_size=%zu\n@ reg=%p\n@ reg_dptr=%p\n@ reg_size=%zu\n@ dev=%p\n", (void *)pinned,
           bytes, (void *)reg, (void *)reg_dptr, reg_bytes, (void *)dev);
    bump<<<n / 256, 256>>>(pinned, n);         // host only
    bump<<<n / 256, 256>>>(reg_dptr, n);       // host only (registered)
    copy<<<n / 256, 256>>>(pinned, dev, n);    // device + host
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    int wrong = 0;
    for (int i = 0; i < n; i++)
        wrong += pinned[i] != i + 1 || reg[i] != i + 1;
    printf("@ wrong_values=%d\n", wrong);
    CK(cudaHostUnregister(reg));
    free(reg);
    CK(cudaFreeHost(pinned));
    CK(cudaFree(dev));
    printf("@ done=1\n");
    return 0;
}
