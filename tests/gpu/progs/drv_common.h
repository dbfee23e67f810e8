/* Shared by the driver-API test programs: reach libcuda only through dlopen + cuGetProcAddress_v2,
 * exactly like a pip-installed framework does (no link-time libcuda, no cudart). Results are
 * printed as "@ key=value" lines that the tests parse. */
#ifndef DRV_COMMON_H
#define DRV_COMMON_H
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*primary_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*ctx_set_t)(CUcontext);
typedef CUresult (*ctx_sync_t)(void);
typedef CUresult (*module_load_data_t)(CUmodule *, const void *);
typedef CUresult (*module_get_function_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*mem_alloc_v2_t)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_v2_t)(CUdeviceptr);
typedef CUresult (*memset_d32_t)(CUdeviceptr, unsigned int, size_t);
typedef CUresult (*memcpy_dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*launch_coop_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void **);
typedef CUresult (*stream_create_t)(CUstream *, unsigned int);

static gpa_v2_t g_gpa;

#define DIE(...)                                                                                                       \
    do {                                                                                                               \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        exit(2);                                                                                                       \
    } while (0)

#define CK(call)                                                                                                       \
    do {                                                                                                               \
        CUresult ck_r_ = (call);                                                                                       \
        if (ck_r_ != CUDA_SUCCESS)                                                                                     \
            DIE("%s:%d: %s -> %d", __FILE__, __LINE__, #call, (int)ck_r_);                                             \
    } while (0)

static void *drv_open(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        DIE("dlopen libcuda.so.1: %s", dlerror());
    g_gpa = (gpa_v2_t)dlsym(h, "cuGetProcAddress_v2");
    if (!g_gpa)
        DIE("dlsym cuGetProcAddress_v2: %s", dlerror());
    return h;
}

/* A driver entry point at CUDA 12.0 semantics (default = legacy stream) or per-thread stream. */
static void *drv_sym(const char *name, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = g_gpa(name, &p, version, flags, &st);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !p)
        DIE("cuGetProcAddress_v2(%s, %d, %llu) -> %d status %d", name, version, (unsigned long long)flags, (int)r,
            (int)st);
    return p;
}
#define SYM(name) drv_sym(name, 12000, CU_GET_PROC_ADDRESS_DEFAULT)

/* cuInit, primary context of device 0 made current, module from a fatbin/cubin/PTX file. */
static CUmodule drv_setup(const char *module_path)
{
    CK(((init_t)SYM("cuInit"))(0));
    CUdevice dev;
    CUcontext ctx;
    CK(((device_get_t)SYM("cuDeviceGet"))(&dev, 0));
    CK(((primary_retain_t)SYM("cuDevicePrimaryCtxRetain"))(&ctx, dev));
    CK(((ctx_set_t)SYM("cuCtxSetCurrent"))(ctx));
    FILE *f = fopen(module_path, "rb");
    if (!f)
        DIE("cannot open module %s", module_path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *image = (char *)malloc((size_t)n + 1);
    if (fread(image, 1, (size_t)n, f) != (size_t)n)
        DIE("cannot read module %s", module_path);
    image[n] = 0; /* PTX must be NUL-terminated */
    fclose(f);
    CUmodule mod;
    CK(((module_load_data_t)SYM("cuModuleLoadData"))(&mod, image));
    free(image);
    return mod;
}
#endif
