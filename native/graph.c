/*
 * CUDA graphs (C10): a graph launch runs many kernels with no per-kernel hook. At instantiate
 * and exec-update, walk the graph (kernel nodes, memset and memcpy nodes, child graphs) and keep
 * per CUgraphExec the candidate pointer words of their parameters; at cuGraphLaunch resolve them
 * against the block table and emit GRAPH_LAUNCH + ACCESS. Kernel nodes whose parameters cannot
 * be read make the graph OPAQUE.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_GRAPH_DEPTH 8

struct exec_info {
    CUgraphExec exec;
    uint64_t *words;
    size_t n, cap;
    uint32_t kernel_nodes;
    uint16_t flags;
    struct exec_info *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct exec_info *g_execs;

static void push(struct exec_info *x, uint64_t w)
{
    if (w < 4096) /* small integers are no device pointers */
        return;
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        uint64_t *nw = realloc(x->words, cap * sizeof *nw);
        if (!nw) {
            x->flags |= PYOBMEM_LAUNCH_OPAQUE;
            return;
        }
        x->words = nw;
        x->cap = cap;
    }
    x->words[x->n++] = w;
}

static void push_word(void *x, uint32_t offset, uint64_t w)
{
    (void)offset;
    push(x, w);
}

static void walk_kernel(struct exec_info *x, CUgraphNode node)
{
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    x->kernel_nodes++;
    if (!real_cuGraphKernelNodeGetParams_v2 || real_cuGraphKernelNodeGetParams_v2(node, &kp) != CUDA_SUCCESS) {
        x->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    uintptr_t handle = kp.func ? (uintptr_t)kp.func : (uintptr_t)kp.kern;
    const struct param_layout *l = params_get(handle);
    if (!l->known || (!kp.kernelParams && l->count > 0)) {
        x->flags |= PYOBMEM_LAUNCH_OPAQUE | (l->known ? 0 : PYOBMEM_LAUNCH_NO_LAYOUT);
        return;
    }
    for (uint32_t i = 0; i < l->count; i++)
        if (l->size[i] >= 8 && kp.kernelParams[i])
            param_words(kp.kernelParams[i], l->offset[i], l->size[i], push_word, x);
}

static void walk(struct exec_info *x, CUgraph graph, int depth)
{
    size_t n = 0;
    if (depth > MAX_GRAPH_DEPTH || !real_cuGraphGetNodes || !real_cuGraphNodeGetType ||
        real_cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS) {
        x->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    if (n == 0)
        return;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes || real_cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        x->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        CUgraphNodeType t;
        if (real_cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
            continue;
        if (t == CU_GRAPH_NODE_TYPE_KERNEL) {
            walk_kernel(x, nodes[i]);
        } else if (t == CU_GRAPH_NODE_TYPE_MEMSET) {
            CUDA_MEMSET_NODE_PARAMS mp;
            if (real_cuGraphMemsetNodeGetParams && real_cuGraphMemsetNodeGetParams(nodes[i], &mp) == CUDA_SUCCESS)
                push(x, mp.dst);
        } else if (t == CU_GRAPH_NODE_TYPE_MEMCPY) {
            CUDA_MEMCPY3D cp;
            if (real_cuGraphMemcpyNodeGetParams && real_cuGraphMemcpyNodeGetParams(nodes[i], &cp) == CUDA_SUCCESS) {
                if (cp.srcMemoryType == CU_MEMORYTYPE_DEVICE || cp.srcMemoryType == CU_MEMORYTYPE_UNIFIED)
                    push(x, cp.srcDevice);
                if (cp.dstMemoryType == CU_MEMORYTYPE_DEVICE || cp.dstMemoryType == CU_MEMORYTYPE_UNIFIED)
                    push(x, cp.dstDevice);
            }
        } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
            CUgraph child;
            if (real_cuGraphChildGraphNodeGetGraph && real_cuGraphChildGraphNodeGetGraph(nodes[i], &child) == CUDA_SUCCESS)
                walk(x, child, depth + 1);
        }
    }
    free(nodes);
}

static void forget_locked(CUgraphExec exec)
{
    for (struct exec_info **pp = &g_execs; *pp; pp = &(*pp)->next) {
        if ((*pp)->exec == exec) {
            struct exec_info *x = *pp;
            *pp = x->next;
            free(x->words);
            free(x);
            return;
        }
    }
}

static void remember(CUgraphExec exec, CUgraph graph)
{
    struct exec_info *x = calloc(1, sizeof *x);
    if (!x)
        return;
    x->exec = exec;
    shim_tls_guard++;
    walk(x, graph, 0);
    shim_tls_guard--;
    pthread_mutex_lock(&g_mu);
    forget_locked(exec);
    x->next = g_execs;
    g_execs = x;
    pthread_mutex_unlock(&g_mu);
}

#define DEF_INSTANTIATE(NAME, PARAMS, ARGS)                   \
    CUresult CUDAAPI NAME PARAMS                              \
    {                                                         \
        int rec = shim_begin();                               \
        CUresult r = REAL(NAME, ARGS);                        \
        if (rec && r == CUDA_SUCCESS && phGraphExec)          \
            remember(*phGraphExec, hGraph);                   \
        return r;                                             \
    }
DEF_INSTANTIATE(cuGraphInstantiate,
                (CUgraphExec * phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize),
                (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))
DEF_INSTANTIATE(cuGraphInstantiate_v2,
                (CUgraphExec * phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize),
                (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))
DEF_INSTANTIATE(cuGraphInstantiateWithFlags, (CUgraphExec * phGraphExec, CUgraph hGraph, unsigned long long flags),
                (phGraphExec, hGraph, flags))
DEF_INSTANTIATE(cuGraphInstantiateWithParams,
                (CUgraphExec * phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
                (phGraphExec, hGraph, instantiateParams))
DEF_INSTANTIATE(cuGraphInstantiateWithParams_ptsz,
                (CUgraphExec * phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
                (phGraphExec, hGraph, instantiateParams))

CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                   CUgraphExecUpdateResult *updateResult_out)
{
    int rec = shim_begin();
    CUresult r = REAL(cuGraphExecUpdate, (hGraphExec, hGraph, hErrorNode_out, updateResult_out));
    if (rec && r == CUDA_SUCCESS)
        remember(hGraphExec, hGraph);
    return r;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
    int rec = shim_begin();
    CUresult r = REAL(cuGraphExecUpdate_v2, (hGraphExec, hGraph, resultInfo));
    if (rec && r == CUDA_SUCCESS)
        remember(hGraphExec, hGraph);
    return r;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    int rec = shim_begin();
    CUresult r = REAL(cuGraphExecDestroy, (hGraphExec));
    if (rec && r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        forget_locked(hGraphExec);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

static void record_graph_launch(CUgraphExec exec, CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint16_t flags = 0;
    uint32_t kernel_nodes = 0;
    int known = 0;
    pthread_mutex_lock(&g_mu);
    for (struct exec_info *x = g_execs; x; x = x->next) {
        if (x->exec != exec)
            continue;
        known = 1;
        flags = x->flags;
        kernel_nodes = x->kernel_nodes;
        blocks_read_lock();
        for (size_t i = 0; i < x->n; i++)
            touched_add(&t, x->words[i]);
        blocks_read_unlock();
        break;
    }
    pthread_mutex_unlock(&g_mu);
    if (!known) /* instantiated before we saw it, or through an unhooked entry point */
        flags |= PYOBMEM_LAUNCH_OPAQUE | PYOBMEM_LAUNCH_NO_LAYOUT;
    if (t.truncated)
        flags |= PYOBMEM_LAUNCH_TRUNCATED;
    uint64_t seq = shim_next_op();
    struct pyobmem_record op = {.type = PYOBMEM_EV_GRAPH_LAUNCH, .flags = flags,
                                .graph_launch = {.op = seq, .graph_exec = (uint64_t)(uintptr_t)exec,
                                                 .stream = (uint64_t)(uintptr_t)s, .kernel_nodes = kernel_nodes,
                                                 .n_touched = t.n}};
    emit_op_with_accesses(&op, seq, &t);
}

/* Swap mode: the whole touched set of the graph is made resident before it launches (C10);
 * a graph we could not walk may touch anything. */
static CUresult graph_swap_begin(struct swap_op *op, CUgraphExec exec, CUstream s)
{
    uint64_t *words = NULL;
    size_t n = 0;
    int how = SWAP_OP_OPAQUE;
    pthread_mutex_lock(&g_mu);
    for (struct exec_info *x = g_execs; x; x = x->next) {
        if (x->exec != exec)
            continue;
        how = (x->flags & PYOBMEM_LAUNCH_OPAQUE) ? SWAP_OP_OPAQUE : 0;
        if (x->n && (words = malloc(x->n * sizeof *words)) != NULL) {
            memcpy(words, x->words, x->n * sizeof *words);
            n = x->n;
        } else if (x->n) {
            how |= SWAP_OP_INCOMPLETE;
        }
        break;
    }
    pthread_mutex_unlock(&g_mu);
    CUresult r = swap_op_begin(op, (uint64_t)(uintptr_t)exec, s, how, words, n);
    free(words);
    return r;
}

#define GPUCLOCK_PT(PT, S, R)                               \
    do {                                                    \
        if ((R) == CUDA_SUCCESS)                            \
            gpuclock_after(swap_norm_stream((S), (PT)));    \
    } while (0)
#define DEF_GRAPH_LAUNCH(NAME, PT)                          \
    CUresult CUDAAPI NAME(CUgraphExec hGraphExec, CUstream s) \
    {                                                       \
        if (SHIM_UNLIKELY(g_shim.swap)) {                   \
            struct swap_op op;                              \
            int rec = shim_begin();                         \
            if (rec) {                                      \
                CUresult f = graph_swap_begin(&op, hGraphExec, swap_norm_stream(s, PT)); \
                if (f != CUDA_SUCCESS)                      \
                    return f;                               \
            }                                               \
            CUresult r = REAL(NAME, (hGraphExec, s));       \
            if (rec && r == CUDA_SUCCESS)                   \
                record_graph_launch(hGraphExec, s);         \
            if (rec)                                        \
                swap_op_end(&op, r);                        \
            GPUCLOCK_PT(PT, s, r);                          \
            return r;                                       \
        }                                                   \
        int rec = shim_begin();                             \
        CUresult r = REAL(NAME, (hGraphExec, s));           \
        if (rec && r == CUDA_SUCCESS)                       \
            record_graph_launch(hGraphExec, s);             \
        GPUCLOCK_PT(PT, s, r);                              \
        return r;                                           \
    }
DEF_GRAPH_LAUNCH(cuGraphLaunch, 0)
DEF_GRAPH_LAUNCH(cuGraphLaunch_ptsz, 1)

void graphs_atfork_prepare(void) { pthread_mutex_lock(&g_mu); }
void graphs_atfork_parent(void) { pthread_mutex_unlock(&g_mu); }
void graphs_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_mu = fresh;
    g_execs = NULL; /* the parent's execs mean nothing here; their memory is left as is */
}
