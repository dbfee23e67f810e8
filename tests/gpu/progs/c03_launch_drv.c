/* C03 (driver API): the same kernel through cuLaunchKernel, cuLaunchKernelEx (with a launch
 * attribute), cuLaunchCooperativeKernel, and cuLaunchKernelEx in per-thread-stream mode
 * (cuLaunchKernelEx_ptsz), each on its own pair of buffers.  usage: c03_launch_drv MODULE */
#include "drv_common.h"

#define NV 4
#define N 32768

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: %s MODULE", argv[0]);
    drv_open();
    printf("@ pid=%d\n", (int)getpid());
    CUmodule mod = drv_setup(argv[1]);
    CUfunction fn;
    CK(((module_get_function_t)SYM("cuModuleGetFunction"))(&fn, mod, "touch2"));
    CUstream s;
    CK(((stream_create_t)SYM("cuStreamCreate"))(&s, CU_STREAM_NON_BLOCKING));
    printf("@ stream=0x%llx\n@ fn=0x%llx\n", (unsigned long long)(uintptr_t)s, (unsigned long long)(uintptr_t)fn);

    static const char *names[NV] = {"launch", "launch_ex", "cooperative", "launch_ex_ptsz"};
    CUdeviceptr a[NV], b[NV];
    mem_alloc_v2_t alloc = (mem_alloc_v2_t)SYM("cuMemAlloc");
    for (int v = 0; v < NV; v++) {
        size_t sa = (size_t)(v + 1) * 1048576 + 4000, sb = (size_t)(v + 1) * 524288 + 2000;
        CK(alloc(&a[v], sa));
        CK(alloc(&b[v], sb));
        CK(((memset_d32_t)SYM("cuMemsetD32"))(a[v], 0, sa / 4));
        printf("@ %s_a=0x%llx\n@ %s_b=0x%llx\n@ %s_size_a=%zu\n@ %s_size_b=%zu\n", names[v],
               (unsigned long long)a[v], names[v], (unsigned long long)b[v], names[v], sa, names[v], sb);
    }
    int n = N;
    void *args[NV][3];
    for (int v = 0; v < NV; v++) {
        args[v][0] = &a[v];
        args[v][1] = &b[v];
        args[v][2] = &n;
    }
    CK(((launch_t)SYM("cuLaunchKernel"))(fn, N / 256, 1, 1, 256, 1, 1, 0, s, args[0], NULL));

    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = 0;
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = N / 256, cfg.gridDimY = 1, cfg.gridDimZ = 1;
    cfg.blockDimX = 256, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.hStream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CK(((launch_ex_t)SYM("cuLaunchKernelEx"))(&cfg, fn, args[1], NULL));

    /* Cooperative: a grid that is surely co-resident (32 blocks of 256 threads). */
    CK(((launch_coop_t)SYM("cuLaunchCooperativeKernel"))(fn, 32, 1, 1, 256, 1, 1, 0, s, args[2]));
    /* grid 32*256 = 8192 < N: only the first 8192 floats are written; that is enough. */

    cfg.hStream = NULL; /* per-thread default stream */
    CK(((launch_ex_t)drv_sym("cuLaunchKernelEx", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))(
        &cfg, fn, args[3], NULL));
    CK(((ctx_sync_t)SYM("cuCtxSynchronize"))());

    float host[N];
    int bad = 0;
    for (int v = 0; v < NV; v++) {
        int count = v == 2 ? 32 * 256 : N;
        CK(((memcpy_dtoh_t)SYM("cuMemcpyDtoH"))(host, b[v], count * sizeof(float)));
        for (int i = 0; i < count; i++)
            bad += host[i] != 1.0f;
    }
    printf("@ wrong_values=%d\n", bad);
    for (int v = 0; v < NV; v++) {
        CK(((mem_free_v2_t)SYM("cuMemFree"))(a[v]));
        CK(((mem_free_v2_t)SYM("cuMemFree"))(b[v]));
    }
    printf("@ done=1\n");
    return bad ? 1 : 0;
}
