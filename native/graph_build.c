/*
 * Graphs being built (C26, and swap mode's pointer checks): conditional nodes' bodies, kept from
 * cuGraphAddNode because the driver API cannot read them back, for graph.c's walk; and, in swap
 * mode, the blocks of memcpy and memset nodes brought back before the driver checks their
 * pointers (cuGraphAddMemcpyNode, cuGraphAddMemsetNode, their SetParams, cuGraphNodeSetParams,
 * cuGraphAddNode).
 *
 * A conditional node's entry is forgotten with its graph (cuGraphDestroy) or alone
 * (cuGraphDestroyNode), and with it those inside its bodies. Its own mutex, never held across a driver call.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

#define MAX_GRAPH_DEPTH 8

/* A conditional node and its body graphs, from cuGraphAddNode. */
struct cond_info {
    CUgraphNode node;
    CUgraph parent;
    unsigned n;
    CUgraph bodies[GRAPH_MAX_COND_BODIES];
    struct cond_info *next;
};

static pthread_mutex_t g_cond_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cond_info *g_conds;

unsigned graph_cond_bodies(CUgraphNode node, CUgraph *bodies)
{
    unsigned n = 0;
    pthread_mutex_lock(&g_cond_mu);
    for (struct cond_info *c = g_conds; c; c = c->next)
        if (c->node == node) {
            n = c->n;
            memcpy(bodies, c->bodies, n * sizeof *bodies);
            break;
        }
    pthread_mutex_unlock(&g_cond_mu);
    return n;
}

/* ---- memcpy and memset nodes of a graph being built: the driver checks their pointers (swap
 * mode brings their blocks back first, as for a pointer query; graph.c says why) ---- */

static void touch_copy(const CUDA_MEMCPY3D *p)
{
    if (!p || !SHIM_UNLIKELY(g_shim.swap))
        return;
    if (p->srcMemoryType == CU_MEMORYTYPE_DEVICE || p->srcMemoryType == CU_MEMORYTYPE_UNIFIED)
        swap_touch(p->srcDevice);
    if (p->dstMemoryType == CU_MEMORYTYPE_DEVICE || p->dstMemoryType == CU_MEMORYTYPE_UNIFIED)
        swap_touch(p->dstDevice);
}

static void touch_node_params(const CUgraphNodeParams *p)
{
    if (!p || !SHIM_UNLIKELY(g_shim.swap))
        return;
    if (p->type == CU_GRAPH_NODE_TYPE_MEMCPY)
        touch_copy(&p->memcpy.copyParams);
    else if (p->type == CU_GRAPH_NODE_TYPE_MEMSET)
        swap_touch(p->memset.dst);
}


static void cond_remember(CUgraphNode node, CUgraph parent, const CUgraphNodeParams *p)
{
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL || !p->conditional.phGraph_out)
        return;
    struct cond_info *c = calloc(1, sizeof *c);
    if (!c)
        return; /* not remembered: the walk finds it unknown, and the graph OPAQUE */
    c->node = node;
    c->parent = parent;
    if (p->conditional.size <= GRAPH_MAX_COND_BODIES) {
        c->n = p->conditional.size;
        memcpy(c->bodies, p->conditional.phGraph_out, c->n * sizeof *c->bodies);
    }
    pthread_mutex_lock(&g_cond_mu);
    for (struct cond_info **pp = &g_conds; *pp; pp = &(*pp)->next)
        if ((*pp)->node == node) { /* a handle reused after its node was destroyed */
            struct cond_info *old = *pp;
            *pp = old->next;
            free(old);
            break;
        }
    if (c->n) {
        c->next = g_conds;
        g_conds = c;
    } else {
        free(c); /* more bodies than we keep: unknown, OPAQUE */
    }
    pthread_mutex_unlock(&g_cond_mu);
}

/* Forget the conditional nodes of `graph` and, with them, those inside their bodies. */
static void cond_forget_locked(CUgraph graph, int depth)
{
    for (struct cond_info **pp = &g_conds; *pp;) {
        struct cond_info *c = *pp;
        if (c->parent != graph) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        if (depth < MAX_GRAPH_DEPTH)
            for (unsigned i = 0; i < c->n; i++)
                cond_forget_locked(c->bodies[i], depth + 1);
        free(c);
        pp = &g_conds; /* the recursion may have unlinked any entry: start over */
    }
}

/* Forget conditional node `node` (destroyed alone) and the nodes inside its bodies. */
static void cond_forget_node_locked(CUgraphNode node)
{
    for (struct cond_info **pp = &g_conds; *pp; pp = &(*pp)->next) {
        struct cond_info *c = *pp;
        if (c->node != node)
            continue;
        *pp = c->next;
        for (unsigned i = 0; i < c->n; i++)
            cond_forget_locked(c->bodies[i], 1);
        free(c);
        return;
    }
}

CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    int rec = shim_begin();
    if (rec)
        touch_node_params(nodeParams);
    CUresult r = REAL(cuGraphAddNode, (phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
    if (rec && r == CUDA_SUCCESS && phGraphNode && nodeParams)
        cond_remember(*phGraphNode, hGraph, nodeParams);
    return r;
}

CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                   const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                   CUgraphNodeParams *nodeParams)
{
    int rec = shim_begin();
    if (rec)
        touch_node_params(nodeParams);
    CUresult r = REAL(cuGraphAddNode_v2, (phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams));
    if (rec && r == CUDA_SUCCESS && phGraphNode && nodeParams)
        cond_remember(*phGraphNode, hGraph, nodeParams);
    return r;
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    int rec = shim_begin();
    CUresult r = REAL(cuGraphDestroy, (hGraph));
    if (rec && r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_cond_mu);
        cond_forget_locked(hGraph, 0);
        pthread_mutex_unlock(&g_cond_mu);
    }
    return r;
}

CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hNode)
{
    int rec = shim_begin();
    CUresult r = REAL(cuGraphDestroyNode, (hNode));
    if (rec && r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_cond_mu);
        cond_forget_node_locked(hNode);
        pthread_mutex_unlock(&g_cond_mu);
    }
    return r;
}

CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx)
{
    if (shim_begin())
        touch_copy(copyParams);
    return REAL(cuGraphAddMemcpyNode, (phGraphNode, hGraph, dependencies, numDependencies, copyParams, ctx));
}

CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                      size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)
{
    if (shim_begin() && memsetParams && SHIM_UNLIKELY(g_shim.swap))
        swap_touch(memsetParams->dst);
    return REAL(cuGraphAddMemsetNode, (phGraphNode, hGraph, dependencies, numDependencies, memsetParams, ctx));
}

CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode hNode, const CUDA_MEMCPY3D *nodeParams)
{
    if (shim_begin())
        touch_copy(nodeParams);
    return REAL(cuGraphMemcpyNodeSetParams, (hNode, nodeParams));
}

CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode hNode, const CUDA_MEMSET_NODE_PARAMS *nodeParams)
{
    if (shim_begin() && nodeParams && SHIM_UNLIKELY(g_shim.swap))
        swap_touch(nodeParams->dst);
    return REAL(cuGraphMemsetNodeSetParams, (hNode, nodeParams));
}

CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
    if (shim_begin())
        touch_node_params(nodeParams);
    return REAL(cuGraphNodeSetParams, (hNode, nodeParams));
}

void graph_conds_atfork_prepare(void) { pthread_mutex_lock(&g_cond_mu); }
void graph_conds_atfork_parent(void) { pthread_mutex_unlock(&g_cond_mu); }
void graph_conds_atfork_child(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    g_cond_mu = fresh;
    g_conds = NULL; /* the parent's nodes: their memory is left as is */
}
