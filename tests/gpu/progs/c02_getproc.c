/* C02: cuGetProcAddress asked for itself, for one name at two CUDA versions (two ABI variants), and
 * for cuLaunchKernel in per-thread-default-stream mode; then an allocation and two launches made
 * only through the obtained pointers.  usage: c02_getproc MODULE(fatbin with touch2)
 * Prints "@ key=value" lines; the pointer-free ones must be the same traced and untraced. */
#include "drv_common.h"

#define SIZE_A 3000000u /* bytes; not a multiple of any allocation granularity on purpose */
#define SIZE_B 1234568u
#define N 65536 /* floats touched per launch */

int main(int argc, char **argv)
{
    if (argc < 2)
        DIE("usage: %s MODULE", argv[0]);
    void *h = drv_open();
    printf("@ pid=%d\n", (int)getpid());

    /* Before cuInit, as pip PyTorch does: cuGetProcAddress for itself, then use what came back. */
    void *self = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = g_gpa("cuGetProcAddress", &self, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("@ self_rc=%d\n@ self_status=%d\n@ self_nonnull=%d\n", (int)r, (int)st, self != NULL);
    if (r != CUDA_SUCCESS || !self)
        DIE("cuGetProcAddress(cuGetProcAddress) failed: %d", (int)r);
    void *init_p = NULL;
    st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    r = ((gpa_v2_t)self)("cuInit", &init_p, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("@ self_call_rc=%d\n@ self_call_status=%d\n@ self_call_nonnull=%d\n", (int)r, (int)st, init_p != NULL);
    if (r != CUDA_SUCCESS || !init_p)
        DIE("the returned cuGetProcAddress does not work: %d", (int)r);
    /* Looking the same name up through the returned pointer gives the same pointer. */
    void *self2 = NULL;
    r = ((gpa_v2_t)self)("cuGetProcAddress", &self2, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("@ self_stable=%d\n", r == CUDA_SUCCESS && self2 == self);
    CK(((init_t)init_p)(0));

    /* One name, two versions: v1 (unsigned int *dptr, CUDA 3.0) and v2 (CUdeviceptr *, 3.2+). */
    void *alloc_v1 = NULL, *alloc_v2 = NULL;
    CUdriverProcAddressQueryResult st1 = 9, st2 = 9;
    CUresult r1 = g_gpa("cuMemAlloc", &alloc_v1, 3000, CU_GET_PROC_ADDRESS_DEFAULT, &st1);
    CUresult r2 = g_gpa("cuMemAlloc", &alloc_v2, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st2);
    printf("@ memalloc_v1_rc=%d\n@ memalloc_v1_status=%d\n@ memalloc_v2_rc=%d\n@ memalloc_v2_status=%d\n", (int)r1,
           (int)st1, (int)r2, (int)st2);
    printf("@ memalloc_v1_v2_differ=%d\n", alloc_v1 != NULL && alloc_v2 != NULL && alloc_v1 != alloc_v2);
    /* cuMemAlloc_v2 asked for by its versioned name is the same function as cuMemAlloc@12000. */
    void *alloc_v2_named = NULL;
    r = g_gpa("cuMemAlloc_v2", &alloc_v2_named, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("@ memalloc_v2_named_rc=%d\n", (int)r);

    /* cuLaunchKernel: legacy-stream and per-thread-stream variants are different functions. */
    void *launch_legacy = drv_sym("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    void *launch_ptds = drv_sym("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    printf("@ launch_ptds_differs=%d\n", launch_legacy != launch_ptds);

    /* A name the shim has no reason to hook is forwarded: call it. */
    typedef CUresult (*get_name_t)(char *, int, CUdevice);
    char devname[256] = {0};
    CK(((get_name_t)SYM("cuDeviceGetName"))(devname, sizeof devname, 0));
    printf("@ device_name=%s\n", devname);
    void *unhooked_gpa = NULL, *unhooked_dlsym = dlsym(h, "cuDeviceGetName");
    CK(g_gpa("cuDeviceGetName", &unhooked_gpa, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
    printf("@ unhooked_same_as_dlsym=%d\n", unhooked_gpa == unhooked_dlsym);
    /* An unknown name: same error and status as the driver gives. */
    void *nothing = (void *)0x1;
    st = 9;
    r = g_gpa("cuNoSuchFunctionPyobmem", &nothing, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("@ unknown_rc=%d\n@ unknown_status=%d\n@ unknown_null=%d\n", (int)r, (int)st, nothing == NULL);

    CUmodule mod = drv_setup(argv[1]);
    CUfunction fn;
    CK(((module_get_function_t)SYM("cuModuleGetFunction"))(&fn, mod, "touch2"));

    CUdeviceptr a = 0, b = 0;
    CK(((mem_alloc_v2_t)alloc_v2)(&a, SIZE_A));
    CK(((mem_alloc_v2_t)alloc_v2)(&b, SIZE_B));
    printf("@ a=0x%llx\n@ b=0x%llx\n@ size_a=%u\n@ size_b=%u\n@ fn=0x%llx\n@ n=%d\n", (unsigned long long)a,
           (unsigned long long)b, SIZE_A, SIZE_B, (unsigned long long)(uintptr_t)fn, N);
    union {
        float f;
        unsigned int u;
    } one = {.f = 1.0f};
    CK(((memset_d32_t)SYM("cuMemsetD32"))(a, one.u, SIZE_A / 4));

    /* Launch 1: per-thread default stream variant, a + 256 and b. */
    CUdeviceptr a_off = a + 256;
    int n = N;
    void *args1[] = {&a_off, &b, &n};
    CK(((launch_t)launch_ptds)(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, args1, NULL));
    CK(((ctx_sync_t)SYM("cuCtxSynchronize"))());
    /* Launch 2: legacy variant, a and b + 1024. */
    CUdeviceptr b_off = b + 1024;
    void *args2[] = {&a, &b_off, &n};
    CK(((launch_t)launch_legacy)(fn, N / 256, 1, 1, 256, 1, 1, 0, NULL, args2, NULL));
    CK(((ctx_sync_t)SYM("cuCtxSynchronize"))());

    float *host = malloc(N * sizeof(float));
    CK(((memcpy_dtoh_t)SYM("cuMemcpyDtoH"))(host, b, N * sizeof(float)));
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += host[i] != 2.0f;
    printf("@ wrong_values=%d\n", bad);
    free(host);

    CK(((mem_free_v2_t)SYM("cuMemFree"))(a));
    CK(((mem_free_v2_t)SYM("cuMemFree"))(b));
    printf("@ done=1\n");
    return bad ? 1 : 0;
}
