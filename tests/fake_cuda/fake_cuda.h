/* Shared by the fake libcuda (fake_cuda.c) and the test driver (driver.c). */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stddef.h>

/* Fake function handles with known layouts. */
#define FAKE_FUNC_A ((CUfunction)0x1000) /* CUfunction: (ptr @0, int @8, ptr @16), name "kernel_a" */
#define FAKE_FUNC_R ((CUfunction)0x4000) /* what cuModuleGetFunction hands out for "r3" (ptr @0, int @8, ptr @16)
                                            * and, after a reload, for "r1" (ptr @0): a reused handle */
#define FAKE_KERN_B ((CUfunction)0x2000) /* CUkernel: (struct{ptr,ptr} @0, ptr @16), name "kernel_b" */
#define FAKE_FUNC_C ((CUfunction)0x3000) /* no layout, no name */
#define FAKE_FUNC_T ((CUfunction)0x5000) /* (int @0, struct{ptr[FAKE_T_PTRS]} @8): a foreach kernel */
#define FAKE_T_PTRS 150                  /* PyTorch's multi_tensor_apply at depth 5: 5 x 30 tensors */

/* Memory sizes above this fail with CUDA_ERROR_OUT_OF_MEMORY. */
#define FAKE_OOM_ABOVE ((size_t)1 << 36)

/* A graph is a list of nodes the driver builds by hand. */
struct fake_node {
    CUgraphNodeType type;
    CUfunction func;     /* kernel: func (or kern if func is NULL) */
    CUkernel kern;
    void **kernelParams;
    CUdeviceptr dst;     /* memset */
    const struct fake_graph *child; /* child-graph node */
    struct fake_graph *bodies;      /* conditional node (cuGraphAddNode): its body graphs */
};
struct fake_graph {
    size_t n;
    struct fake_node *nodes[8];
};

/* Exported by the fake only (not driver API). */
typedef void (*fake_api_callback)(unsigned cbid, const void *params, const CUresult *result);
void fakeSetApiCallback(fake_api_callback cb);                /* for the fake libcupti */
CUresult fakeAllocHidden(CUdeviceptr *dptr, size_t bytesize); /* memory the shim never sees allocated */
int fakeParamQueries(void);                                   /* cu*GetParamInfo calls so far */

#endif
