/*
 * CUDA graphs (C10): a graph launch runs many kernels with no per-kernel hook. At instantiate
 * and exec-update, walk the graph (kernel nodes, memset and memcpy nodes, child graphs) and keep
 * per CUgraphExec, per top-level node, the candidate pointer words of its parameters; at
 * cuGraphLaunch resolve them against the block table and emit GRAPH_LAUNCH + ACCESS.
 *
 * An executable graph's node parameters can change after instantiation without a new graph:
 * cuGraphExec{Kernel,Memcpy,Memset,ChildGraph,BatchMemOp}NodeSetParams and cuGraphExecNodeSetParams
 * (XLA's command buffers update their nodes this way whenever buffer addresses change). Each
 * replaces that node's words; a node handle we do not hold (one inside a child graph or a
 * conditional body) gets its own entry, a superset that stays safe. Nodes whose parameters
 * cannot be read (no kernel layout, a batch memory op) make the graph OPAQUE: in swap mode it
 * brings every block back before it runs.
 *
 * Conditional nodes (C26: torch.cond, torch.while_loop, XLA's while and if): the device decides
 * which body runs; graph_build.c keeps their bodies, and the walk descends into every one: the
 * launch touches the union and is flagged CONDITIONAL. A conditional node it did not see created
 * makes the graph OPAQUE.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_GRAPH_DEPTH 8

/* The words of one node of the graph an exec was instantiated from (all of a child graph's). */
struct node_words {
    CUgraphNode node;
    uint64_t *w;
    size_t n, cap;
    uint32_t kernel_nodes;
    uint16_t flags;
    struct node_words *checked; /* while walking in swap mode: where memcpy and memset words go too */
};

struct exec_info {
    CUgraphExec exec;
    struct node_words *nodes;
    size_t nn;
    struct exec_info *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct exec_info *g_execs;

static void push(struct node_words *e, uint64_t w)
{
    if (w < 4096) /* small integers are no device pointers */
        return;
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 16;
        uint64_t *nw = realloc(e->w, cap * sizeof *nw);
        if (!nw) {
            e->flags |= PYOBMEM_LAUNCH_OPAQUE;
            return;
        }
        e->w = nw;
        e->cap = cap;
    }
    e->w[e->n++] = w;
}

static void push_word(void *e, uint32_t offset, uint64_t w)
{
    (void)offset;
    push(e, w);
}

static void kernel_words(struct node_words *e, CUfunction func, CUkernel kern, void **kernelParams)
{
    e->kernel_nodes++;
    uintptr_t handle = func ? (uintptr_t)func : (uintptr_t)kern;
    const struct param_layout *l = params_get(handle);
    if (!l->known || (!kernelParams && l->count > 0)) {
        e->flags |= PYOBMEM_LAUNCH_OPAQUE | (l->known ? 0 : PYOBMEM_LAUNCH_NO_LAYOUT);
        return;
    }
    for (uint32_t i = 0; i < l->count; i++)
        if (l->size[i] >= 8 && kernelParams[i])
            param_words(kernelParams[i], l->offset[i], l->size[i], push_word, e);
}

static void memcpy_words(struct node_words *e, const CUDA_MEMCPY3D *cp)
{
    if (cp->srcMemoryType == CU_MEMORYTYPE_DEVICE || cp->srcMemoryType == CU_MEMORYTYPE_UNIFIED)
        push(e, cp->srcDevice);
    if (cp->dstMemoryType == CU_MEMORYTYPE_DEVICE || cp->dstMemoryType == CU_MEMORYTYPE_UNIFIED)
        push(e, cp->dstDevice);
}

/* Node types that never touch device memory the application allocated (graph-owned memory of
 * MEM_ALLOC/MEM_FREE nodes is no block of ours). */
static int touches_nothing(CUgraphNodeType t)
{
    return t == CU_GRAPH_NODE_TYPE_EMPTY || t == CU_GRAPH_NODE_TYPE_HOST || t == CU_GRAPH_NODE_TYPE_WAIT_EVENT ||
           t == CU_GRAPH_NODE_TYPE_EVENT_RECORD || t == CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL ||
           t == CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT || t == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
           t == CU_GRAPH_NODE_TYPE_MEM_FREE;
}

static void walk(struct node_words *e, CUgraph graph, int depth);

/* The words of one node of a (non-executable) graph, read back through the driver. */
static void node_fill(struct node_words *e, CUgraphNode node, int depth)
{
    CUgraphNodeType t;
    if (!real_cuGraphNodeGetType || real_cuGraphNodeGetType(node, &t) != CUDA_SUCCESS) {
        e->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    if (t == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS kp;
        memset(&kp, 0, sizeof kp);
        if (!real_cuGraphKernelNodeGetParams_v2 || real_cuGraphKernelNodeGetParams_v2(node, &kp) != CUDA_SUCCESS) {
            e->kernel_nodes++;
            e->flags |= PYOBMEM_LAUNCH_OPAQUE;
            return;
        }
        kernel_words(e, kp.func, kp.kern, kp.kernelParams);
    } else if (t == CU_GRAPH_NODE_TYPE_MEMSET) {
        CUDA_MEMSET_NODE_PARAMS mp;
        if (real_cuGraphMemsetNodeGetParams && real_cuGraphMemsetNodeGetParams(node, &mp) == CUDA_SUCCESS)
            push(e, mp.dst), e->checked ? push(e->checked, mp.dst) : (void)0;
        else
            e->flags |= PYOBMEM_LAUNCH_OPAQUE;
    } else if (t == CU_GRAPH_NODE_TYPE_MEMCPY) {
        CUDA_MEMCPY3D cp;
        if (real_cuGraphMemcpyNodeGetParams && real_cuGraphMemcpyNodeGetParams(node, &cp) == CUDA_SUCCESS)
            memcpy_words(e, &cp), e->checked ? memcpy_words(e->checked, &cp) : (void)0;
        else
            e->flags |= PYOBMEM_LAUNCH_OPAQUE;
    } else if (t == CU_GRAPH_NODE_TYPE_GRAPH) {
        CUgraph child;
        if (real_cuGraphChildGraphNodeGetGraph && real_cuGraphChildGraphNodeGetGraph(node, &child) == CUDA_SUCCESS)
            walk(e, child, depth + 1);
        else
            e->flags |= PYOBMEM_LAUNCH_OPAQUE;
    } else if (t == CU_GRAPH_NODE_TYPE_CONDITIONAL) {
        CUgraph bodies[GRAPH_MAX_COND_BODIES];
        unsigned nb = graph_cond_bodies(node, bodies);
        e->flags |= nb ? PYOBMEM_LAUNCH_CONDITIONAL : PYOBMEM_LAUNCH_OPAQUE;
        for (unsigned i = 0; i < nb; i++)
            walk(e, bodies[i], depth + 1);
    } else if (!touches_nothing(t)) { /* a batch memory op, a type newer than us */
        e->flags |= PYOBMEM_LAUNCH_OPAQUE;
    }
}

/* Every node of `graph`, into one entry (a child graph's words belong to its node). */
static void walk(struct node_words *e, CUgraph graph, int depth)
{
    size_t n = 0;
    if (depth > MAX_GRAPH_DEPTH || !real_cuGraphGetNodes || real_cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS) {
        e->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    if (n == 0)
        return;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes || real_cuGraphGetNodes(graph, nodes, &n) != CUDA_SUCCESS) {
        free(nodes);
        e->flags |= PYOBMEM_LAUNCH_OPAQUE;
        return;
    }
    for (size_t i = 0; i < n; i++)
        node_fill(e, nodes[i], depth);
    free(nodes);
}

static void exec_free(struct exec_info *x)
{
    for (size_t i = 0; i < x->nn; i++)
        free(x->nodes[i].w);
    free(x->nodes);
    free(x);
}

static void forget_locked(CUgraphExec exec)
{
    for (struct exec_info **pp = &g_execs; *pp; pp = &(*pp)->next) {
        if ((*pp)->exec == exec) {
            struct exec_info *x = *pp;
            *pp = x->next;
            exec_free(x);
            return;
        }
    }
}

static struct exec_info *find_locked(CUgraphExec exec)
{
    for (struct exec_info *x = g_execs; x; x = x->next)
        if (x->exec == exec)
            return x;
    return NULL;
}

/* The words of every top-level node of `graph` (for an exec about to be instantiated or updated
 * from it); a failure to list the nodes leaves one OPAQUE entry. NULL when out of memory.
 * `checked` (swap mode, else NULL) gets the words of its memcpy and memset nodes too. */
static struct exec_info *exec_build(CUgraph graph, struct node_words *checked)
{
    struct exec_info *x = calloc(1, sizeof *x);
    if (!x)
        return NULL;
    shim_tls_guard++;
    size_t n = 0;
    CUgraphNode *nodes = NULL;
    int ok = real_cuGraphGetNodes && real_cuGraphGetNodes(graph, NULL, &n) == CUDA_SUCCESS;
    if (ok && n > 0)
        ok = (nodes = calloc(n, sizeof *nodes)) != NULL && real_cuGraphGetNodes(graph, nodes, &n) == CUDA_SUCCESS;
    x->nodes = calloc(ok && n ? n : 1, sizeof *x->nodes);
    if (!x->nodes) {
        shim_tls_guard--;
        free(nodes);
        free(x);
        return NULL;
    }
    if (!ok) {
        x->nn = 1;
        x->nodes[0].flags = PYOBMEM_LAUNCH_OPAQUE;
    } else {
        x->nn = n;
        for (size_t i = 0; i < n; i++) {
            x->nodes[i].node = nodes[i];
            x->nodes[i].checked = checked;
            node_fill(&x->nodes[i], nodes[i], 0);
            x->nodes[i].checked = NULL;
        }
    }
    shim_tls_guard--;
    free(nodes);
    return x;
}

static void exec_store(struct exec_info *x, CUgraphExec exec)
{
    x->exec = exec;
    pthread_mutex_lock(&g_mu);
    forget_locked(exec);
    x->next = g_execs;
    g_execs = x;
    pthread_mutex_unlock(&g_mu);
}

/* Swap mode: the driver checks the device pointers of memcpy and memset nodes when a graph is
 * built, instantiated or its nodes set, and refuses one without a mapping (XLA: "Failed to set
 * memcpy D2D node params: CUDA_ERROR_INVALID_VALUE" for a block that was out). Bring back the
 * blocks `words` name first, as for a pointer query. Another thread's op may evict them again
 * before the real call: not held (a known gap, docs/swap.md). */
static void touch_words(const uint64_t *w, size_t n)
{
    if (SHIM_UNLIKELY(g_shim.swap) && n)
        swap_touch_many(w, n);
}

/* exec_build for an instantiate or update: in swap mode its memcpy and memset blocks brought back. */
static struct exec_info *exec_build_touched(CUgraph graph)
{
    struct node_words checked;
    memset(&checked, 0, sizeof checked);
    struct exec_info *x = exec_build(graph, SHIM_UNLIKELY(g_shim.swap) ? &checked : NULL);
    touch_words(checked.w, checked.n);
    free(checked.w);
    return x;
}

/* After a successful cuGraphExec*SetParams: `fresh` (built by the caller) becomes node's words
 * in exec. An exec we never saw instantiated stays unknown (its launches are OPAQUE). */
static void node_update(CUgraphExec exec, CUgraphNode node, struct node_words *fresh)
{
    fresh->node = node;
    pthread_mutex_lock(&g_mu);
    struct exec_info *x = find_locked(exec);
    struct node_words *slot = NULL;
    if (x) {
        for (size_t i = 0; i < x->nn && !slot; i++)
            if (x->nodes[i].node == node)
                slot = &x->nodes[i];
        if (!slot) {
            struct node_words *nn = realloc(x->nodes, (x->nn + 1) * sizeof *nn);
            if (nn) {
                x->nodes = nn;
                slot = &nn[x->nn++];
                memset(slot, 0, sizeof *slot);
            } else if (x->nn) { /* keep the old words, and say the launch may touch more */
                x->nodes[0].flags |= PYOBMEM_LAUNCH_OPAQUE;
            }
        }
    }
    if (slot) {
        uint64_t *old = slot->w;
        *slot = *fresh;
        fresh->w = old;
    }
    pthread_mutex_unlock(&g_mu);
    free(fresh->w);
}

#define DEF_INSTANTIATE(NAME, PARAMS, ARGS)                   \
    CUresult CUDAAPI NAME PARAMS                              \
    {                                                         \
        int rec = shim_begin();                               \
        struct exec_info *x = rec ? exec_build_touched(hGraph) : NULL; \
        CUresult r = REAL(NAME, ARGS);                        \
        if (x && r == CUDA_SUCCESS && phGraphExec)            \
            exec_store(x, *phGraphExec);                      \
        else if (x)                                           \
            exec_free(x);                                     \
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
    struct exec_info *x = rec ? exec_build_touched(hGraph) : NULL;
    CUresult r = REAL(cuGraphExecUpdate, (hGraphExec, hGraph, hErrorNode_out, updateResult_out));
    if (x && r == CUDA_SUCCESS)
        exec_store(x, hGraphExec);
    else if (x)
        exec_free(x);
    return r;
}

CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo)
{
    int rec = shim_begin();
    struct exec_info *x = rec ? exec_build_touched(hGraph) : NULL;
    CUresult r = REAL(cuGraphExecUpdate_v2, (hGraphExec, hGraph, resultInfo));
    if (x && r == CUDA_SUCCESS)
        exec_store(x, hGraphExec);
    else if (x)
        exec_free(x);
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


/* ---- node parameters changed in an executable graph ---- */

/* FILL builds the node's words from the new parameters (before the call: in swap mode the blocks
 * of a memcpy, memset or child graph node are brought back first, TOUCH); kernel parameters are
 * not checked by the driver. FILL runs before the driver has seen the arguments: it must accept
 * a NULL parameter pointer (the driver refuses it, with its own code). */
#define DEF_NODE_SET(NAME, PARAMS, ARGS, FILL, TOUCH)               \
    CUresult CUDAAPI NAME PARAMS                                    \
    {                                                               \
        int rec = shim_begin();                                     \
        struct node_words e;                                        \
        memset(&e, 0, sizeof e);                                    \
        if (rec) {                                                  \
            shim_tls_guard++;                                       \
            FILL;                                                   \
            shim_tls_guard--;                                       \
            if (TOUCH)                                              \
                touch_words(e.w, e.n);                              \
        }                                                           \
        CUresult r = REAL(NAME, ARGS);                              \
        if (rec && r == CUDA_SUCCESS)                               \
            node_update(hGraphExec, hNode, &e);                     \
        else                                                        \
            free(e.w);                                              \
        return r;                                                   \
    }
DEF_NODE_SET(cuGraphExecKernelNodeSetParams,
             (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS_v1 *p), (hGraphExec, hNode, p),
             if (p) kernel_words(&e, p->func, NULL, p->kernelParams), 0)
DEF_NODE_SET(cuGraphExecKernelNodeSetParams_v2,
             (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *p), (hGraphExec, hNode, p),
             if (p) kernel_words(&e, p->func, p->kern, p->kernelParams), 0)
DEF_NODE_SET(cuGraphExecMemcpyNodeSetParams,
             (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_MEMCPY3D *p, CUcontext ctx), (hGraphExec, hNode, p, ctx),
             if (p) memcpy_words(&e, p), 1)
DEF_NODE_SET(cuGraphExecMemsetNodeSetParams,
             (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext ctx),
             (hGraphExec, hNode, p, ctx), if (p) push(&e, p->dst), 1)
DEF_NODE_SET(cuGraphExecChildGraphNodeSetParams, (CUgraphExec hGraphExec, CUgraphNode hNode, CUgraph child),
             (hGraphExec, hNode, child), walk(&e, child, 1), 1)
DEF_NODE_SET(cuGraphExecBatchMemOpNodeSetParams,
             (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p), (hGraphExec, hNode, p),
             e.flags |= PYOBMEM_LAUNCH_OPAQUE, 0)

/* CUDA 12.2's generic setter: the node's type is in the parameters. */
static void generic_words(struct node_words *e, const CUgraphNodeParams *p)
{
    if (p->type == CU_GRAPH_NODE_TYPE_KERNEL)
        kernel_words(e, p->kernel.func, p->kernel.kern, p->kernel.kernelParams);
    else if (p->type == CU_GRAPH_NODE_TYPE_MEMCPY)
        memcpy_words(e, &p->memcpy.copyParams);
    else if (p->type == CU_GRAPH_NODE_TYPE_MEMSET)
        push(e, p->memset.dst);
    else if (p->type == CU_GRAPH_NODE_TYPE_GRAPH)
        walk(e, p->graph.graph, 1);
    else if (!touches_nothing(p->type))
        e->flags |= PYOBMEM_LAUNCH_OPAQUE;
}
DEF_NODE_SET(cuGraphExecNodeSetParams, (CUgraphExec hGraphExec, CUgraphNode hNode, CUgraphNodeParams *p),
             (hGraphExec, hNode, p), if (p) generic_words(&e, p), p && p->type != CU_GRAPH_NODE_TYPE_KERNEL)

/* ---- launches ---- */

/* The exec's words, flags and kernel-node count (under g_mu). */
static uint16_t exec_summary(const struct exec_info *x, size_t *words, uint32_t *kernel_nodes)
{
    uint16_t flags = 0;
    size_t n = 0;
    uint32_t k = 0;
    for (size_t i = 0; i < x->nn; i++) {
        flags |= x->nodes[i].flags;
        n += x->nodes[i].n;
        k += x->nodes[i].kernel_nodes;
    }
    *words = n;
    *kernel_nodes = k;
    return flags;
}

static void record_graph_launch(CUgraphExec exec, CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint16_t flags = 0;
    uint32_t kernel_nodes = 0;
    pthread_mutex_lock(&g_mu);
    struct exec_info *x = find_locked(exec);
    if (x) {
        size_t n;
        flags = exec_summary(x, &n, &kernel_nodes);
        blocks_read_lock();
        for (size_t i = 0; i < x->nn; i++)
            for (size_t j = 0; j < x->nodes[i].n; j++)
                touched_add(&t, x->nodes[i].w[j]);
        blocks_read_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    if (!x) /* instantiated before we saw it, or through an unhooked entry point */
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
    struct exec_info *x = find_locked(exec);
    if (x) {
        uint32_t k;
        how = (exec_summary(x, &n, &k) & PYOBMEM_LAUNCH_OPAQUE) ? SWAP_OP_OPAQUE : 0;
        if (n && (words = malloc(n * sizeof *words)) != NULL) {
            size_t at = 0;
            for (size_t i = 0; i < x->nn; i++) {
                memcpy(words + at, x->nodes[i].w, x->nodes[i].n * sizeof *words);
                at += x->nodes[i].n;
            }
        } else if (n) {
            how |= SWAP_OP_INCOMPLETE;
            n = 0;
        }
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
