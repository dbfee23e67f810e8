/*
 * NCCL: the calls that name device buffers. The shim exports them under NCCL's own names, so a
 * library linked against libnccl (PyTorch's ProcessGroupNCCL, CuPy, ...) reaches ours first; each
 * wrapper forwards to the real function unchanged (same arguments, same result) and records an
 * NCCL event: which blocks the call names, its bytes, stream, peer or root and communicator.
 * In swap mode the named blocks are never swapped from then on (swap_never): NCCL's kernels
 * reach them through work structures the launch scan cannot see, and a peer may map them.
 *
 * The real function is the first definition after the shim in load order (shim_next: found even
 * when libnccl was dlopen'ed RTLD_LOCAL), resolved at the first call. Without NCCL in the
 * process nothing calls these wrappers; a dlsym probe for them finds none (intercept.c).
 *
 * NCCL's types are declared here (no nccl.h at build time): enums are ints, handles pointers.
 * Every hooked function is one line of NCCL_CALLS below; the wrappers, the name table used by
 * dlsym and the resolution are generated from it.
 */
#define _GNU_SOURCE
#include <pthread.h>

#include "shim.h"

typedef int ncclResult_t; /* enum: ncclSuccess = 0, ..., ncclInProgress = 7 */
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef struct ncclCollConfig_v23100 ncclCollConfig_t; /* only passed through */
typedef CUstream cudaStream_t;                          /* the same handle */

#define NCCL_SUCCESS 0
#define NCCL_SYSTEM_ERROR 2 /* returned when the real function cannot be found */
#define NCCL_IN_PROGRESS 7  /* nonblocking communicators: enqueued */
#define NO_RANK (-1)

/* Collectives and point-to-point calls, one line each:
 *   X(name, kind, (parameters), (arguments), send buffer, receive buffer, count, datatype, peer or root)
 * `comm` and `stream` are the parameters of every line. */
#define COLL_P(...) (__VA_ARGS__, ncclComm_t comm, cudaStream_t stream)
#define COLL_PC(...) (__VA_ARGS__, ncclComm_t comm, cudaStream_t stream, const ncclCollConfig_t *config)
#define NCCL_CALLS(X)                                                                                                \
    X(ncclAllReduce, ALL_REDUCE, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,  \
                                        ncclRedOp_t op),                                                             \
      (sendbuff, recvbuff, count, datatype, op, comm, stream), sendbuff, recvbuff, count, datatype, NO_RANK)          \
    X(ncclBroadcast, BROADCAST, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,   \
                                       int root),                                                                    \
      (sendbuff, recvbuff, count, datatype, root, comm, stream), sendbuff, recvbuff, count, datatype, root)           \
    X(ncclBcast, BROADCAST, COLL_P(void *buff, size_t count, ncclDataType_t datatype, int root),                      \
      (buff, count, datatype, root, comm, stream), buff, buff, count, datatype, root)                                 \
    X(ncclReduce, REDUCE, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,         \
                                 ncclRedOp_t op, int root),                                                          \
      (sendbuff, recvbuff, count, datatype, op, root, comm, stream), sendbuff, recvbuff, count, datatype, root)       \
    X(ncclAllGather, ALL_GATHER, COLL_P(const void *sendbuff, void *recvbuff, size_t sendcount,                       \
                                        ncclDataType_t datatype),                                                    \
      (sendbuff, recvbuff, sendcount, datatype, comm, stream), sendbuff, recvbuff, sendcount, datatype, NO_RANK)      \
    X(ncclReduceScatter, REDUCE_SCATTER, COLL_P(const void *sendbuff, void *recvbuff, size_t recvcount,               \
                                                ncclDataType_t datatype, ncclRedOp_t op),                            \
      (sendbuff, recvbuff, recvcount, datatype, op, comm, stream), sendbuff, recvbuff, recvcount, datatype, NO_RANK)  \
    X(ncclAlltoAll, ALL_TO_ALL, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype),  \
      (sendbuff, recvbuff, count, datatype, comm, stream), sendbuff, recvbuff, count, datatype, NO_RANK)              \
    X(ncclGather, GATHER, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,         \
                                 int root),                                                                          \
      (sendbuff, recvbuff, count, datatype, root, comm, stream), sendbuff, recvbuff, count, datatype, root)           \
    X(ncclScatter, SCATTER, COLL_P(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,       \
                                   int root),                                                                        \
      (sendbuff, recvbuff, count, datatype, root, comm, stream), sendbuff, recvbuff, count, datatype, root)           \
    X(ncclSend, SEND, COLL_P(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer),                  \
      (sendbuff, count, datatype, peer, comm, stream), sendbuff, NULL, count, datatype, peer)                         \
    X(ncclRecv, RECV, COLL_P(void *recvbuff, size_t count, ncclDataType_t datatype, int peer),                        \
      (recvbuff, count, datatype, peer, comm, stream), NULL, recvbuff, count, datatype, peer)                         \
    X(ncclAllReduceConfig, ALL_REDUCE, COLL_PC(const void *sendbuff, void *recvbuff, size_t count,                    \
                                               ncclDataType_t datatype, ncclRedOp_t op),                             \
      (sendbuff, recvbuff, count, datatype, op, comm, stream, config), sendbuff, recvbuff, count, datatype, NO_RANK)  \
    X(ncclBroadcastConfig, BROADCAST, COLL_PC(const void *sendbuff, void *recvbuff, size_t count,                     \
                                              ncclDataType_t datatype, int root),                                    \
      (sendbuff, recvbuff, count, datatype, root, comm, stream, config), sendbuff, recvbuff, count, datatype, root)   \
    X(ncclReduceConfig, REDUCE, COLL_PC(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,  \
                                        ncclRedOp_t op, int root),                                                   \
      (sendbuff, recvbuff, count, datatype, op, root, comm, stream, config), sendbuff, recvbuff, count, datatype,     \
      root)                                                                                                          \
    X(ncclAllGatherConfig, ALL_GATHER, COLL_PC(const void *sendbuff, void *recvbuff, size_t sendcount,                \
                                               ncclDataType_t datatype),                                             \
      (sendbuff, recvbuff, sendcount, datatype, comm, stream, config), sendbuff, recvbuff, sendcount, datatype,       \
      NO_RANK)                                                                                                       \
    X(ncclReduceScatterConfig, REDUCE_SCATTER, COLL_PC(const void *sendbuff, void *recvbuff, size_t recvcount,        \
                                                       ncclDataType_t datatype, ncclRedOp_t op),                     \
      (sendbuff, recvbuff, recvcount, datatype, op, comm, stream, config), sendbuff, recvbuff, recvcount, datatype,   \
      NO_RANK)                                                                                                       \
    X(ncclAlltoAllConfig, ALL_TO_ALL, COLL_PC(const void *sendbuff, void *recvbuff, size_t count,                     \
                                              ncclDataType_t datatype),                                              \
      (sendbuff, recvbuff, count, datatype, comm, stream, config), sendbuff, recvbuff, count, datatype, NO_RANK)      \
    X(ncclGatherConfig, GATHER, COLL_PC(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,  \
                                        int root),                                                                   \
      (sendbuff, recvbuff, count, datatype, root, comm, stream, config), sendbuff, recvbuff, count, datatype, root)   \
    X(ncclScatterConfig, SCATTER, COLL_PC(const void *sendbuff, void *recvbuff, size_t count,                         \
                                          ncclDataType_t datatype, int root),                                        \
      (sendbuff, recvbuff, count, datatype, root, comm, stream, config), sendbuff, recvbuff, count, datatype, root)

/* Registrations and allocations (written by hand below): one line each for the tables. */
#define NCCL_MEMORY(Y)                                                                                               \
    Y(ncclCommRegister, (const ncclComm_t comm, void *buff, size_t size, void **handle))                              \
    Y(ncclCommWindowRegister, (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags))           \
    Y(ncclMemAlloc, (void **ptr, size_t size))

/* Functions the shim calls itself (the communicator notes); never hooked. */
typedef ncclResult_t (*comm_int_fn)(const ncclComm_t comm, int *out);

/* ---- the real functions: resolved at first use ---- */

#define X(name, call_, params, args, ...) typedef ncclResult_t(*pfn_##name) params;
NCCL_CALLS(X)
#undef X
#define Y(name, params) typedef ncclResult_t(*pfn_##name) params;
NCCL_MEMORY(Y)
#undef Y

enum {
#define X(name, ...) IDX_##name,
    NCCL_CALLS(X)
#undef X
#define Y(name, params) IDX_##name,
    NCCL_MEMORY(Y)
#undef Y
    IDX_ncclCommUserRank,
    IDX_ncclCommCount,
    IDX_ncclCommCuDevice,
    N_NAMES
};

static const char *const g_names[N_NAMES] = {
#define X(name, ...) [IDX_##name] = #name,
    NCCL_CALLS(X)
#undef X
#define Y(name, params) [IDX_##name] = #name,
    NCCL_MEMORY(Y)
#undef Y
    [IDX_ncclCommUserRank] = "ncclCommUserRank",
    [IDX_ncclCommCount] = "ncclCommCount",
    [IDX_ncclCommCuDevice] = "ncclCommCuDevice",
};

#define N_HOOKED IDX_ncclCommUserRank /* the names before it are hooked */

static void *g_real[N_NAMES];
static int g_resolved[N_NAMES]; /* 1: looked up and found (a failed lookup is tried again) */

static void *real_of(int i)
{
    if (__atomic_load_n(&g_resolved[i], __ATOMIC_ACQUIRE))
        return g_real[i];
    void *p = shim_next(g_names[i]);
    if (p) {
        g_real[i] = p;
        __atomic_store_n(&g_resolved[i], 1, __ATOMIC_RELEASE);
    }
    return p;
}

static int index_of(const char *name)
{
    if (!name || strncmp(name, "nccl", 4) != 0)
        return -1;
    for (int i = 0; i < N_HOOKED; i++)
        if (strcmp(g_names[i], name) == 0)
            return i;
    return -1;
}

/* ---- communicators: an index per process, with a note of its rank the first time ---- */

#define MAX_COMMS 64
#define NO_COMM 0xFFFFFFFFu
static pthread_mutex_t g_comm_mu = PTHREAD_MUTEX_INITIALIZER;
static ncclComm_t g_comms[MAX_COMMS];
static unsigned g_ncomms;

static int comm_int(int idx, ncclComm_t comm)
{
    comm_int_fn f = (comm_int_fn)real_of(idx);
    int v = -1;
    if (!f || f(comm, &v) != NCCL_SUCCESS)
        v = -1;
    return v;
}

static uint32_t comm_index(ncclComm_t comm)
{
    if (!comm)
        return NO_COMM;
    unsigned n = __atomic_load_n(&g_ncomms, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n; i++)
        if (g_comms[i] == comm)
            return i;
    uint32_t idx = NO_COMM;
    pthread_mutex_lock(&g_comm_mu);
    n = g_ncomms;
    for (unsigned i = 0; i < n && idx == NO_COMM; i++)
        if (g_comms[i] == comm)
            idx = i;
    if (idx == NO_COMM && n < MAX_COMMS) {
        g_comms[n] = comm;
        __atomic_store_n(&g_ncomms, n + 1, __ATOMIC_RELEASE);
        idx = n;
        ring_note(PYOBMEM_NOTE_NCCL_COMM "%u=rank=%d nranks=%d device=%d", n, comm_int(IDX_ncclCommUserRank, comm),
                  comm_int(IDX_ncclCommCount, comm), comm_int(IDX_ncclCommCuDevice, comm));
    }
    pthread_mutex_unlock(&g_comm_mu);
    return idx;
}

/* ---- the record ---- */

/* Bytes of one element of an ncclDataType_t (int8, uint8, int32, uint32, int64, uint64,
 * float16, float32, float64, bfloat16, fp8 e4m3, fp8 e5m2); 0 if unknown. */
static uint64_t type_size(ncclDataType_t t)
{
    static const unsigned char size[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return t >= 0 && (size_t)t < sizeof size ? size[t] : 0;
}

/* An NCCL wrapper calling another (NCCL's own calls between its entry points) records nothing. */
static __thread int g_depth;

struct nccl_call {
    uint16_t kind; /* pyobmem_nccl_call */
    uint64_t send, recv, bytes;
    int peer;
    ncclComm_t comm;
    CUstream stream;
};

/* Before the real call. Returns nonzero when the call is to be recorded. */
static int nccl_before(const struct nccl_call *c)
{
    if (g_depth++ || !shim_begin())
        return 0;
    if (SHIM_UNLIKELY(g_shim.swap)) { /* may be reached by NCCL's kernels or a peer: never swapped */
        if (c->send)
            swap_never(c->send);
        if (c->recv && c->recv != c->send)
            swap_never(c->recv);
    }
    return 1;
}

static void nccl_after(const struct nccl_call *c, int rec, ncclResult_t r)
{
    g_depth--;
    if (!rec || (r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS))
        return;
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_NCCL, .flags = c->kind,
                                        .nccl = {.send = blocks_access_word(c->send),
                                                 .recv = blocks_access_word(c->recv), .bytes = c->bytes,
                                                 .stream = (uint64_t)(uintptr_t)c->stream,
                                                 .peer = (uint32_t)c->peer, .comm = comm_index(c->comm)}}, 1);
}

/* ---- the wrappers ---- */

#define X(name, call_, params, args, send_, recv_, count_, type_, peer_)                                            \
    SHIM_EXPORT ncclResult_t name params;                                                                            \
    ncclResult_t name params                                                                                         \
    {                                                                                                                \
        struct nccl_call c = {.kind = PYOBMEM_NCCL_##call_, .send = (uint64_t)(uintptr_t)(send_),                    \
                              .recv = (uint64_t)(uintptr_t)(recv_), .bytes = (uint64_t)(count_) * type_size(type_), \
                              .peer = (peer_), .comm = comm, .stream = stream};                                      \
        int rec = nccl_before(&c);                                                                                   \
        pfn_##name real = (pfn_##name)real_of(IDX_##name);                                                           \
        ncclResult_t r = real ? real args : NCCL_SYSTEM_ERROR;                                                       \
        nccl_after(&c, rec, r);                                                                                      \
        return r;                                                                                                    \
    }
NCCL_CALLS(X)
#undef X

SHIM_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    struct nccl_call c = {.kind = PYOBMEM_NCCL_COMM_REGISTER, .send = (uint64_t)(uintptr_t)buff, .bytes = size,
                          .peer = NO_RANK, .comm = comm};
    int rec = nccl_before(&c);
    pfn_ncclCommRegister real = (pfn_ncclCommRegister)real_of(IDX_ncclCommRegister);
    ncclResult_t r = real ? real(comm, buff, size, handle) : NCCL_SYSTEM_ERROR;
    nccl_after(&c, rec, r);
    return r;
}

SHIM_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                                int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
    struct nccl_call c = {.kind = PYOBMEM_NCCL_WINDOW_REGISTER, .send = (uint64_t)(uintptr_t)buff, .bytes = size,
                          .peer = NO_RANK, .comm = comm};
    int rec = nccl_before(&c);
    pfn_ncclCommWindowRegister real = (pfn_ncclCommWindowRegister)real_of(IDX_ncclCommWindowRegister);
    ncclResult_t r = real ? real(comm, buff, size, win, winFlags) : NCCL_SYSTEM_ERROR;
    nccl_after(&c, rec, r);
    return r;
}

/* The buffer is known only after the call: it is pinned then. */
SHIM_EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    struct nccl_call c = {.kind = PYOBMEM_NCCL_MEM_ALLOC, .bytes = size, .peer = NO_RANK};
    int rec = nccl_before(&c);
    pfn_ncclMemAlloc real = (pfn_ncclMemAlloc)real_of(IDX_ncclMemAlloc);
    ncclResult_t r = real ? real(ptr, size) : NCCL_SYSTEM_ERROR;
    rec = rec && r == NCCL_SUCCESS && ptr; /* synchronous: anything else allocated nothing */
    if (rec) {
        c.send = (uint64_t)(uintptr_t)*ptr;
        if (SHIM_UNLIKELY(g_shim.swap) && c.send)
            swap_never(c.send);
    }
    nccl_after(&c, rec, r);
    return r;
}

/* ---- for dlsym (intercept.c) ---- */

static void *const g_hooks[N_HOOKED] = {
#define X(name, ...) [IDX_##name] = (void *)&name,
    NCCL_CALLS(X)
#undef X
#define Y(name, params) [IDX_##name] = (void *)&name,
    NCCL_MEMORY(Y)
#undef Y
};

void *nccl_hook(const char *name)
{
    int i = index_of(name);
    return i < 0 ? NULL : g_hooks[i];
}

void *nccl_real(const char *name)
{
    int i = index_of(name);
    return i < 0 ? NULL : real_of(i);
}
