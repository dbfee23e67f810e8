/*
 * A fake libnccl.so.2 for tests/test_nccl.py. Each function prints one line with the arguments
 * it received, exactly ("call=NAME send=.. recv=.. count=.. type=.. op=.. root=.. comm=..
 * stream=.. extra=.."; unused fields -1), and whether the device buffers it was given are mapped
 * at that moment (the fake libcuda's fakeAccess: -1 unmapped, -2 no buffer), then returns
 * $FAKE_NCCL_RESULT (default 0, ncclSuccess). As the real NCCL, ncclBcast calls ncclBroadcast
 * through the PLT, and ncclMemAlloc allocates device memory from the driver (cuMemAlloc_v2).
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include "fake_nccl.h"

#define API __attribute__((visibility("default")))

struct ncclComm {
    int rank, nranks, device;
};

static long long mapped(const void *p)
{
    long long (*access)(CUdeviceptr) = (long long (*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "fakeAccess");
    return p && access ? access((CUdeviceptr)(uintptr_t)p) : -2;
}

static ncclResult_t report(const char *name, const void *send, const void *recv, long long count, int type, int op,
                           int root, const void *comm, const void *stream, long long extra)
{
    printf("call=%s send=%llu recv=%llu count=%lld type=%d op=%d root=%d comm=%llu stream=%llu extra=%lld "
           "send_mapped=%lld recv_mapped=%lld\n",
           name, (unsigned long long)(uintptr_t)send, (unsigned long long)(uintptr_t)recv, count, type, op, root,
           (unsigned long long)(uintptr_t)comm, (unsigned long long)(uintptr_t)stream, extra, mapped(send),
           mapped(recv));
    fflush(stdout);
    const char *r = getenv("FAKE_NCCL_RESULT");
    return r ? atoi(r) : 0;
}

API ncclComm_t fakeNcclComm(int rank, int nranks, int device)
{
    struct ncclComm *c = malloc(sizeof *c);
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    return c;
}

API ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t st)
{
    return report("ncclAllReduce", s, r, (long long)n, t, op, -1, c, st, -1);
}

API ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                               cudaStream_t st)
{
    return report("ncclBroadcast", s, r, (long long)n, t, -1, root, c, st, -1);
}

API ncclResult_t ncclBcast(void *b, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st)
{
    return ncclBroadcast(b, b, n, t, root, c, st); /* as NCCL does: through the PLT */
}

API ncclResult_t ncclReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, int root,
                            ncclComm_t c, cudaStream_t st)
{
    return report("ncclReduce", s, r, (long long)n, t, op, root, c, st, -1);
}

API ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st)
{
    return report("ncclAllGather", s, r, (long long)n, t, -1, -1, c, st, -1);
}

API ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                   cudaStream_t st)
{
    return report("ncclReduceScatter", s, r, (long long)n, t, op, -1, c, st, -1);
}

API ncclResult_t ncclAlltoAll(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st)
{
    return report("ncclAlltoAll", s, r, (long long)n, t, -1, -1, c, st, -1);
}

API ncclResult_t ncclGather(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                            cudaStream_t st)
{
    return report("ncclGather", s, r, (long long)n, t, -1, root, c, st, -1);
}

API ncclResult_t ncclScatter(const void *s, void *r, size_t n, ncclDataType_t t, int root, ncclComm_t c,
                             cudaStream_t st)
{
    return report("ncclScatter", s, r, (long long)n, t, -1, root, c, st, -1);
}

API ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
{
    return report("ncclSend", s, NULL, (long long)n, t, -1, peer, c, st, -1);
}

API ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st)
{
    return report("ncclRecv", NULL, r, (long long)n, t, -1, peer, c, st, -1);
}

API ncclResult_t ncclAllReduceConfig(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                                     cudaStream_t st, const ncclCollConfig_t *config)
{
    return report("ncclAllReduceConfig", s, r, (long long)n, t, op, -1, c, st, (long long)(uintptr_t)config);
}

API ncclResult_t ncclCommRegister(const ncclComm_t c, void *b, size_t size, void **handle)
{
    *handle = (void *)0x4242;
    return report("ncclCommRegister", b, NULL, (long long)size, -1, -1, -1, c, NULL, (long long)(uintptr_t)handle);
}

API ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *b, size_t size, ncclWindow_t *win, int flags)
{
    *win = (ncclWindow_t)0x4343;
    return report("ncclCommWindowRegister", b, NULL, (long long)size, -1, -1, -1, c, NULL, flags);
}

API ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, size) != CUDA_SUCCESS)
        return 1; /* ncclUnhandledCudaError */
    *ptr = (void *)(uintptr_t)p;
    return report("ncclMemAlloc", *ptr, NULL, (long long)size, -1, -1, -1, NULL, NULL, -1);
}

API ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank)
{
    *rank = c->rank;
    return 0;
}

API ncclResult_t ncclCommCount(const ncclComm_t c, int *count)
{
    *count = c->nranks;
    return 0;
}

API ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device)
{
    *device = c->device;
    return 0;
}
