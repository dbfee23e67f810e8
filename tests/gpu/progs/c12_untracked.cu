// C12: frees of pointers the shim never saw allocated, optional NULL outputs, invalid frees.
// - a CUDA graph memory node (cudaGraphAddMemAllocNode) allocates; the pointer is freed outside
//   the graph with cudaFree: the shim never saw that allocation;
// - cudaMallocAsync inside stream capture (becomes a graph memory node), freed outside;
// - cuGetProcAddress_v2 with a NULL symbolStatus, cuMemGetAddressRange with NULL outputs;
// - invalid frees (a bogus pointer, a double free) through the driver and the runtime.
// Prints "@ key=value"; every *_rc / *_ok key must be the same traced and untraced.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>
#include <cuda_runtime.h>
#include "drv_common.h"

#define RK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

typedef CUresult (*range_t)(CUdeviceptr *, size_t *, CUdeviceptr);

__global__ void fill(float *p, int n, float v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = v;
}

int main()
{
    printf("@ pid=%d\n", (int)getpid());
    RK(cudaSetDevice(0));
    RK(cudaFree(0));
    drv_open();
    cudaStream_t s;
    RK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    // 1. Explicit graph memory node.
    const size_t SIZE_G = 6 * 1048576;
    cudaGraph_t g;
    RK(cudaGraphCreate(&g, 0));
    cudaMemAllocNodeParams ap = {};
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = SIZE_G;
    cudaGraphNode_t alloc_node, set_node;
    RK(cudaGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &ap));
    cudaMemsetParams mp = {};
    mp.dst = ap.dptr;
    mp.value = 0;
    mp.elementSize = 4;
    mp.width = SIZE_G / 4;
    mp.height = 1;
    RK(cudaGraphAddMemsetNode(&set_node, g, &alloc_node, 1, &mp));
    cudaGraphExec_t ge;
    RK(cudaGraphInstantiate(&ge, g, 0));
    RK(cudaGraphLaunch(ge, s));
    RK(cudaStreamSynchronize(s));
    printf("@ graph_node_addr=%p\n", ap.dptr);
    printf("@ graph_node_free_rc=%d\n", (int)cudaFree(ap.dptr));
    RK(cudaGraphExecDestroy(ge));
    RK(cudaGraphDestroy(g));

    // 2. cudaMallocAsync during stream capture.
    const size_t SIZE_C = 3 * 1048576 + 512;
    cudaStream_t cs;
    RK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    float *cp = nullptr;
    RK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    RK(cudaMallocAsync((void **)&cp, SIZE_C, cs));
    fill<<<(SIZE_C / 4 + 255) / 256, 256, 0, cs>>>(cp, (int)(SIZE_C / 4), 2.0f);
    cudaGraph_t cg;
    RK(cudaStreamEndCapture(cs, &cg));
    cudaGraphExec_t cge;
    RK(cudaGraphInstantiate(&cge, cg, 0));
    RK(cudaGraphLaunch(cge, cs));
    RK(cudaStreamSynchronize(cs));
    float probe = 0;
    RK(cudaMemcpy(&probe, cp + 100, sizeof probe, cudaMemcpyDeviceToHost));
    printf("@ capture_addr=%p\n@ capture_value_ok=%d\n", (void *)cp, probe == 2.0f);
    printf("@ capture_free_rc=%d\n", (int)cudaFree(cp));
    RK(cudaGraphExecDestroy(cge));
    RK(cudaGraphDestroy(cg));

    // 3. Optional NULL outputs.
    void *p = nullptr;
    CUresult r = g_gpa("cuMemAlloc", &p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    printf("@ gpa_null_status_rc=%d\n@ gpa_null_status_ok=%d\n", (int)r, p != nullptr);
    void *q = (void *)0x1;
    r = g_gpa("cuNoSuchFunctionPyobmem", &q, 12000, CU_GET_PROC_ADDRESS_DEFAULT, nullptr);
    printf("@ gpa_null_status_unknown_rc=%d\n@ gpa_null_status_unknown_null=%d\n", (int)r, q == nullptr);
    mem_alloc_v2_t dalloc = (mem_alloc_v2_t)p;
    mem_free_v2_t dfree = (mem_free_v2_t)SYM("cuMemFree");
    CUdeviceptr d = 0;
    const size_t SIZE_D = 2 * 1048576 + 300;
    CK(dalloc(&d, SIZE_D));
    printf("@ tracked_addr=0x%llx\n@ tracked_size=%zu\n", (unsigned long long)d, SIZE_D);
    range_t range = (range_t)SYM("cuMemGetAddressRange");
    size_t sz = 0;
    CUdeviceptr base = 0;
    r = range(nullptr, &sz, d + 4096);
    printf("@ range_null_base_rc=%d\n@ range_null_base_ok=%d\n", (int)r, sz == SIZE_D);
    r = range(&base, nullptr, d + 4096);
    printf("@ range_null_size_rc=%d\n@ range_null_size_ok=%d\n", (int)r, base == d);

    // 4. Invalid frees: same error codes traced and untraced, nothing left pending.
    const CUdeviceptr bogus = 0xdead00000000ull;
    printf("@ bogus_addr=0x%llx\n", (unsigned long long)bogus);
    printf("@ drv_bogus_free_rc=%d\n", (int)dfree(bogus));
    printf("@ drv_free_rc=%d\n", (int)dfree(d));
    printf("@ drv_double_free_rc=%d\n", (int)dfree(d));
    printf("@ rt_last_error_after_drv=%d\n", (int)cudaGetLastError());
    printf("@ rt_bogus_free_rc=%d\n", (int)cudaFree((void *)(bogus + 0x100000)));
    printf("@ rt_last_error_after_rt=%d\n", (int)cudaGetLastError());
    printf("@ rt_last_error_again=%d\n", (int)cudaGetLastError());
    void *ok = nullptr;
    printf("@ rt_malloc_after_rc=%d\n", (int)cudaMalloc(&ok, 4096));
    printf("@ rt_free_after_rc=%d\n", (int)cudaFree(ok));
    printf("@ sync_rc=%d\n@ done=1\n", (int)cudaDeviceSynchronize());
    return 0;
}
