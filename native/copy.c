/*
 * Copies and sets (plain, async, peer, 2D/3D, batched): an op seq each, shared with launches, and
 * in swap mode one op of the executor's (swap_op_begin/end: the blocks it touches are resident
 * first). Every wrapper calls the real function and returns its result unchanged; the record is
 * written only when the call succeeded.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

/* ---- swap mode (swap*.c): what the op hooks hand the executor ---- */

/* Candidate words of a copy: both ends of each device side. */
static void copy_words(uint64_t w[4], int kind, uint64_t dst, uint64_t src, uint64_t n)
{
    uint64_t last = n ? n - 1 : 0;
    w[0] = kind != PYOBMEM_COPY_DTOH ? dst : 0;
    w[1] = w[0] ? dst + last : 0;
    w[2] = kind != PYOBMEM_COPY_HTOD ? src : 0;
    w[3] = w[2] ? src + last : 0;
}

/* A small host-to-device copy whose words point into live blocks is a pointer table (batched
 * GEMM, pointer arrays, device-side structs: cases.md C08, C09): a kernel may later reach those
 * blocks through it without naming them, so they are never swapped (and come back now). */
#define POINTER_TABLE_MAX 65536
static void pin_pointer_table(const void *src, uint64_t n)
{
    if (!src || n < 8 || n > POINTER_TABLE_MAX || ((uintptr_t)src & 7))
        return;
    const uint64_t *w = src;
    uint64_t hits[16];
    size_t nh = 0, i = 0;
    while (i < n / 8) { /* one lock per batch of hits; swap_never takes the swap lock */
        blocks_read_lock();
        for (; i < n / 8 && nh < 16; i++) {
            const struct block *b = w[i] >= 4096 ? blocks_lookup(w[i]) : NULL;
            if (b && (b->kind == PYOBMEM_ALLOC_DRIVER || b->kind == PYOBMEM_ALLOC_ASYNC)) /* the swappable kinds */
                hits[nh++] = w[i];
        }
        blocks_read_unlock();
        for (size_t k = 0; k < nh; k++)
            swap_never(hits[k]);
        nh = 0;
    }
}

/* The copy and set hooks' one shape: OP_OPEN (shim_begin, op_prefetch; in swap mode the op's words -- WORDS
 * fills w_[4] and may set key_ -- and swap_op_begin, returning from the hook with the error when
 * a touched block cannot be brought back), the real call, the record, OP_CLOSE. */
#define OP_OPEN(NAME, KEY, S, WORDS)                                                                   \
    struct swap_op op_;                                                                                \
    op_.active = 0;                                                                                    \
    int rec = shim_begin();                                                                            \
    if (rec)                                                                                           \
        op_prefetch();                                                                                 \
    if (rec && SHIM_UNLIKELY(g_shim.swap)) {                                                           \
        uint64_t w_[4], key_ = (KEY);                                                                  \
        WORDS;                                                                                         \
        CUresult f_ = swap_op_begin(&op_, key_, swap_norm_stream((S), per_thread_name(#NAME)), 0, w_, 4); \
        if (f_ != CUDA_SUCCESS)                                                                        \
            return f_;                                                                                 \
    }
#define OP_CLOSE(R)            \
    if (op_.active)            \
        swap_op_end(&op_, (R));

/* A copy's words (both ends of each device side); a host-to-device one may be a pointer table. */
static void copy_prep(uint64_t w[4], int kind, uint64_t dst, uint64_t src, uint64_t n)
{
    copy_words(w, kind, dst, src, n);
    if (kind == PYOBMEM_COPY_HTOD)
        pin_pointer_table((const void *)(uintptr_t)src, n);
}

/* ---- the application's synchronisation: no op, nothing recorded ----
 * A cuCtxSynchronize, and a cuStreamSynchronize of the legacy stream, also wait for copies other
 * threads issue while they wait (the H200, session 12: at the end of each GPT medium step at 75%,
 * loss.item()'s stream sync waited 40.7 ms while the release thread fed the optimizer state's
 * queued swap-outs to the copy engine; 2.5 ms with the queue held). In swap mode the queue is held
 * while an application thread is in one, of any stream (swap_copy.c; PYOBMEM_SYNC_HOLD=0: not):
 * it waits for OUT_AHEAD bytes of the shim's copies at most. */
#define DEF_APP_SYNC(NAME, PARAMS, ARGS)              \
    CUresult CUDAAPI NAME PARAMS                      \
    {                                                 \
        shim_init_once();                             \
        if (!SHIM_UNLIKELY(g_shim.swap))              \
            return REAL(NAME, ARGS);                  \
        uint64_t t_ = swap_app_sync_begin();          \
        CUresult r = REAL(NAME, ARGS);                \
        swap_app_sync_end(t_);                        \
        return r;                                     \
    }
DEF_APP_SYNC(cuCtxSynchronize, (void), ())
DEF_APP_SYNC(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))
DEF_APP_SYNC(cuStreamSynchronize, (CUstream hStream), (hStream))
DEF_APP_SYNC(cuStreamSynchronize_ptsz, (CUstream hStream), (hStream))

/* ---- copies and sets: an op seq each, shared with launches ---- */

static void emit_copy(int kind, int async, uint64_t dst, uint64_t src, uint64_t bytes, CUstream s)
{
    ST_BEGIN(t0);
    uint64_t dw = kind == PYOBMEM_COPY_DTOH ? 0 : blocks_access_word(dst);
    uint64_t sw = kind == PYOBMEM_COPY_HTOD ? 0 : blocks_access_word(src);
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMCPY, .flags = (uint16_t)(kind | (async ? PYOBMEM_COPY_ASYNC : 0)),
                                        .memcpy = {.op = shim_next_op(), .dst = dw, .src = sw, .bytes = bytes,
                                                   .stream = (uint64_t)(uintptr_t)s}}, 1);
    ST_END(t0, ST_COPY_RECORD);
}

static void emit_set(int async, uint64_t dst, uint64_t value, uint64_t bytes, CUstream s)
{
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMSET, .flags = async ? PYOBMEM_COPY_ASYNC : 0,
                                        .memset = {.op = shim_next_op(), .dst = blocks_access_word(dst), .value = value,
                                                   .bytes = bytes, .stream = (uint64_t)(uintptr_t)s}}, 1);
}

#define DEF_COPY(NAME, KIND, DT, ST, DARG, SARG)                                        \
    CUresult CUDAAPI NAME(DT dst, ST src, size_t n)                                     \
    {                                                                                   \
        OP_OPEN(NAME, SWAP_KEY_COPY(KIND), 0, copy_prep(w_, KIND, DARG, SARG, n))       \
        CUresult r = REAL(NAME, (dst, src, n));                                         \
        if (rec && r == CUDA_SUCCESS)                                                   \
            emit_copy(KIND, 0, DARG, SARG, n, 0);                                       \
        OP_CLOSE(r)                                                                     \
        GPUCLOCK(NAME, 0, r);                                                           \
        return r;                                                                       \
    }
#define DEF_COPY_ASYNC(NAME, KIND, DT, ST, DARG, SARG)                                  \
    CUresult CUDAAPI NAME(DT dst, ST src, size_t n, CUstream s)                         \
    {                                                                                   \
        OP_OPEN(NAME, SWAP_KEY_COPY(KIND), s, copy_prep(w_, KIND, DARG, SARG, n))       \
        CUresult r = REAL(NAME, (dst, src, n, s));                                      \
        if (rec && r == CUDA_SUCCESS)                                                   \
            emit_copy(KIND, 1, DARG, SARG, n, s);                                       \
        OP_CLOSE(r)                                                                     \
        GPUCLOCK(NAME, s, r);                                                           \
        return r;                                                                       \
    }
#define DPTR(x) ((uint64_t)(x))
#define HPTR(x) ((uint64_t)(uintptr_t)(x))
DEF_COPY(cuMemcpy, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpy_ptds, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyHtoD_v2, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY(cuMemcpyHtoD_v2_ptds, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY(cuMemcpyDtoH_v2, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoH_v2_ptds, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoD_v2, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY(cuMemcpyDtoD_v2_ptds, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyAsync, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyAsync_ptsz, PYOBMEM_COPY_OTHER, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyHtoDAsync_v2, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, PYOBMEM_COPY_HTOD, CUdeviceptr, const void *, DPTR(dst), HPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoHAsync_v2, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, PYOBMEM_COPY_DTOH, void *, CUdeviceptr, HPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoDAsync_v2, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))
DEF_COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, PYOBMEM_COPY_DTOD, CUdeviceptr, CUdeviceptr, DPTR(dst), DPTR(src))

#define DEF_PEER(NAME)                                                                                   \
    CUresult CUDAAPI NAME(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n)    \
    {                                                                                                    \
        OP_OPEN(NAME, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER), 0, copy_words(w_, PYOBMEM_COPY_OTHER, dst, src, n)) \
        CUresult r = REAL(NAME, (dst, dctx, src, sctx, n));                                              \
        if (rec && r == CUDA_SUCCESS)                                                                    \
            emit_copy(PYOBMEM_COPY_OTHER, 0, dst, src, n, 0);                                            \
        OP_CLOSE(r)                                                                                      \
        GPUCLOCK(NAME, 0, r);                                                                            \
        return r;                                                                                        \
    }
#define DEF_PEER_ASYNC(NAME)                                                                                      \
    CUresult CUDAAPI NAME(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s) \
    {                                                                                                             \
        OP_OPEN(NAME, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER), s, copy_words(w_, PYOBMEM_COPY_OTHER, dst, src, n))      \
        CUresult r = REAL(NAME, (dst, dctx, src, sctx, n, s));                                                    \
        if (rec && r == CUDA_SUCCESS)                                                                             \
            emit_copy(PYOBMEM_COPY_OTHER, 1, dst, src, n, s);                                                     \
        OP_CLOSE(r)                                                                                               \
        GPUCLOCK(NAME, s, r);                                                                                     \
        return r;                                                                                                 \
    }
DEF_PEER(cuMemcpyPeer)
DEF_PEER(cuMemcpyPeer_ptds)
DEF_PEER_ASYNC(cuMemcpyPeerAsync)
DEF_PEER_ASYNC(cuMemcpyPeerAsync_ptsz)

/* 2D/3D copies: kind from the memory types, device sides at their first byte. */
static int side_is_device(CUmemorytype t) { return t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED; }

static int nd_kind(CUmemorytype st, CUmemorytype dt)
{
    if (st == CU_MEMORYTYPE_HOST && dt == CU_MEMORYTYPE_DEVICE)
        return PYOBMEM_COPY_HTOD;
    if (st == CU_MEMORYTYPE_DEVICE && dt == CU_MEMORYTYPE_HOST)
        return PYOBMEM_COPY_DTOH;
    if (st == CU_MEMORYTYPE_DEVICE && dt == CU_MEMORYTYPE_DEVICE)
        return PYOBMEM_COPY_DTOD;
    return PYOBMEM_COPY_OTHER;
}

static void emit_copy_nd(CUmemorytype st, uint64_t src, CUmemorytype dt, uint64_t dst, uint64_t bytes, int async,
                         CUstream s)
{
    int kind = nd_kind(st, dt);
    uint64_t dw = side_is_device(dt) ? blocks_access_word(dst) : 0;
    uint64_t sw = side_is_device(st) ? blocks_access_word(src) : 0;
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_MEMCPY, .flags = (uint16_t)(kind | (async ? PYOBMEM_COPY_ASYNC : 0)),
                                        .memcpy = {.op = shim_next_op(), .dst = dw, .src = sw, .bytes = bytes,
                                                   .stream = (uint64_t)(uintptr_t)s}}, 1);
}

static void emit_copy2d(const CUDA_MEMCPY2D *p, int async, CUstream s)
{
    if (!p)
        return;
    uint64_t src = p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes;
    uint64_t dst = p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes;
    emit_copy_nd(p->srcMemoryType, src, p->dstMemoryType, dst, (uint64_t)p->WidthInBytes * p->Height, async, s);
}

static void emit_copy3d(const CUDA_MEMCPY3D *p, int async, CUstream s)
{
    if (!p)
        return;
    uint64_t src = p->srcDevice + (p->srcZ * p->srcHeight + p->srcY) * p->srcPitch + p->srcXInBytes;
    uint64_t dst = p->dstDevice + (p->dstZ * p->dstHeight + p->dstY) * p->dstPitch + p->dstXInBytes;
    emit_copy_nd(p->srcMemoryType, src, p->dstMemoryType, dst, (uint64_t)p->WidthInBytes * p->Height * p->Depth,
                 async, s);
}

/* Swap mode: an N-D copy's key and words (first and last byte of each device side). */
static uint64_t nd_words2d(const CUDA_MEMCPY2D *p, uint64_t w[4])
{
    memset(w, 0, 4 * sizeof *w);
    if (!p)
        return SWAP_KEY_COPY(PYOBMEM_COPY_OTHER);
    uint64_t span = p->Height ? (p->Height - 1) : 0;
    if (side_is_device(p->dstMemoryType)) {
        w[0] = p->dstDevice + p->dstY * p->dstPitch + p->dstXInBytes;
        w[1] = w[0] + span * p->dstPitch + (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    if (side_is_device(p->srcMemoryType)) {
        w[2] = p->srcDevice + p->srcY * p->srcPitch + p->srcXInBytes;
        w[3] = w[2] + span * p->srcPitch + (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    return SWAP_KEY_COPY(nd_kind(p->srcMemoryType, p->dstMemoryType));
}

static uint64_t nd_words3d(const CUDA_MEMCPY3D *p, uint64_t w[4])
{
    memset(w, 0, 4 * sizeof *w);
    if (!p)
        return SWAP_KEY_COPY(PYOBMEM_COPY_OTHER);
    if (side_is_device(p->dstMemoryType)) {
        w[0] = p->dstDevice + (p->dstZ * p->dstHeight + p->dstY) * p->dstPitch + p->dstXInBytes;
        w[1] = w[0] + ((p->Depth ? p->Depth - 1 : 0) * p->dstHeight + (p->Height ? p->Height - 1 : 0)) * p->dstPitch +
               (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    if (side_is_device(p->srcMemoryType)) {
        w[2] = p->srcDevice + (p->srcZ * p->srcHeight + p->srcY) * p->srcPitch + p->srcXInBytes;
        w[3] = w[2] + ((p->Depth ? p->Depth - 1 : 0) * p->srcHeight + (p->Height ? p->Height - 1 : 0)) * p->srcPitch +
               (p->WidthInBytes ? p->WidthInBytes - 1 : 0);
    }
    return SWAP_KEY_COPY(nd_kind(p->srcMemoryType, p->dstMemoryType));
}
#define nd_words_CUDA_MEMCPY2D nd_words2d
#define nd_words_CUDA_MEMCPY3D nd_words3d

#define DEF_COPY_ND(NAME, T, EMIT)                                                \
    CUresult CUDAAPI NAME(const T *p)                                             \
    {                                                                             \
        OP_OPEN(NAME, 0, 0, key_ = nd_words_##T(p, w_))                           \
        CUresult r = REAL(NAME, (p));                                             \
        if (rec && r == CUDA_SUCCESS)                                             \
            EMIT(p, 0, 0);                                                        \
        OP_CLOSE(r)                                                               \
        GPUCLOCK(NAME, 0, r);                                                     \
        return r;                                                                 \
    }
#define DEF_COPY_ND_ASYNC(NAME, T, EMIT)                                          \
    CUresult CUDAAPI NAME(const T *p, CUstream s)                                 \
    {                                                                             \
        OP_OPEN(NAME, 0, s, key_ = nd_words_##T(p, w_))                           \
        CUresult r = REAL(NAME, (p, s));                                          \
        if (rec && r == CUDA_SUCCESS)                                             \
            EMIT(p, 1, s);                                                        \
        OP_CLOSE(r)                                                               \
        GPUCLOCK(NAME, s, r);                                                     \
        return r;                                                                 \
    }
DEF_COPY_ND(cuMemcpy2D_v2, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND(cuMemcpy2D_v2_ptds, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND_ASYNC(cuMemcpy2DAsync_v2, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND_ASYNC(cuMemcpy2DAsync_v2_ptsz, CUDA_MEMCPY2D, emit_copy2d)
DEF_COPY_ND(cuMemcpy3D_v2, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND(cuMemcpy3D_v2_ptds, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND_ASYNC(cuMemcpy3DAsync_v2, CUDA_MEMCPY3D, emit_copy3d)
DEF_COPY_ND_ASYNC(cuMemcpy3DAsync_v2_ptsz, CUDA_MEMCPY3D, emit_copy3d)

/* ---- batched copies: cuMemcpyBatchAsync and cuMemcpy3DBatchAsync ----
 *
 * Two shapes: CUDA 12.8's (cuMemcpyBatchAsync, _ptsz: a `size_t *failIdx` before the stream) and
 * 13.0's (_v2, _v2_ptsz: none). Each wrapper passes its own arguments through untouched.
 *
 * A batch is one op: one op seq and one MEMCPY record, kind OTHER | ASYNC as for cuMemcpyAsync
 * (the pointers are unified), b and c = the first copy's destination and source words, d = bytes
 * of all copies, e = stream; in the same ring group, ACCESS records with the same op seq name the
 * other blocks the batch touches (each once, at the first offset seen). In swap mode it is one swap
 * op (one plan position, as the planner counts one op seq) whose words are both ends of every
 * pointer operand of every copy: every block any copy touches is resident before the real call.
 *
 * 3D batches: extents are in elements; between two pointers an element is a byte. When one side
 * is a CUDA array, its element size is not queried: the bytes recorded and the pointer side's last
 * word use 1 (a lower bound; the first byte still names the block, and a copy never spans two
 * allocations). Array operands are not blocks. */
#define BATCH_STACK_OPS 64

/* Swap mode: the candidate words of a batch (4 per copy). */
struct batch_words {
    uint64_t *w;
    size_t n;
    int how; /* SWAP_OP_INCOMPLETE when they could not be listed: everything comes back first */
    uint64_t stack[4 * BATCH_STACK_OPS];
};

static int batch_words_init(struct batch_words *bw, size_t ops, int readable)
{
    bw->w = bw->stack;
    bw->n = 0;
    bw->how = 0;
    if (ops == 0)
        return 0;
    if (!readable) { /* arrays the driver will refuse: name nothing, assume anything */
        bw->how = SWAP_OP_INCOMPLETE;
        return 0;
    }
    if (ops <= BATCH_STACK_OPS)
        return 1;
    uint64_t *w = ops <= SIZE_MAX / (4 * sizeof *w) ? malloc(ops * 4 * sizeof *w) : NULL;
    if (!w) {
        bw->how = SWAP_OP_INCOMPLETE;
        return 0;
    }
    bw->w = w;
    return 1;
}

static void batch_words_free(struct batch_words *bw)
{
    if (bw->w != bw->stack)
        free(bw->w);
}

static void batch_words_1d(struct batch_words *bw, const CUdeviceptr *dsts, const CUdeviceptr *srcs,
                           const size_t *sizes, size_t count)
{
    if (!batch_words_init(bw, count, dsts && srcs && sizes))
        return;
    for (size_t i = 0; i < count; i++)
        copy_words(bw->w + 4 * i, PYOBMEM_COPY_OTHER, dsts[i], srcs[i], sizes[i]);
    bw->n = 4 * count;
}

/* First and last byte of a 3D batch operand (0, 0 for a CUDA array). */
static void operand_words(const CUmemcpy3DOperand *o, const CUextent3D *e, uint64_t w[2])
{
    w[0] = w[1] = 0;
    if (o->type != CU_MEMCPY_OPERAND_TYPE_POINTER || !o->op.ptr.ptr)
        return;
    uint64_t row = o->op.ptr.rowLength ? o->op.ptr.rowLength : e->width;
    uint64_t layer = o->op.ptr.layerHeight ? o->op.ptr.layerHeight : e->height;
    uint64_t h = e->height ? e->height - 1 : 0, d = e->depth ? e->depth - 1 : 0;
    w[0] = o->op.ptr.ptr;
    w[1] = w[0] + (d * layer + h) * row + (e->width ? e->width - 1 : 0);
}

static void batch_words_3d(struct batch_words *bw, const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n)
{
    if (!batch_words_init(bw, n, ops != NULL))
        return;
    for (size_t i = 0; i < n; i++) {
        operand_words(&ops[i].dst, &ops[i].extent, bw->w + 4 * i);
        operand_words(&ops[i].src, &ops[i].extent, bw->w + 4 * i + 2);
    }
    bw->n = 4 * n;
}

/* Access word of addr; the caller holds the blocks read lock. */
static uint64_t word_locked(uint64_t addr)
{
    const struct block *b = addr ? blocks_lookup(addr) : NULL;
    return b ? PYOBMEM_ACCESS_WORD(b->id, addr - b->start) : 0;
}

/* The batch's MEMCPY record and its ACCESS records (t->words[n0..]), one ring group. */
static void emit_batch(uint64_t b, uint64_t c, uint64_t bytes, CUstream s, const struct touched *t, uint32_t n0)
{
    static int noted;
    uint64_t seq = shim_next_op();
    struct pyobmem_record op = {.type = PYOBMEM_EV_MEMCPY, .flags = PYOBMEM_COPY_OTHER | PYOBMEM_COPY_ASYNC,
                                .memcpy = {.op = seq, .dst = b, .src = c, .bytes = bytes,
                                           .stream = (uint64_t)(uintptr_t)s}};
    ring_write_op(&op, seq, t->words + n0, t->n > n0 ? t->n - n0 : 0);
    if (t->truncated && !__atomic_exchange_n(&noted, 1, __ATOMIC_RELAXED))
        ring_note("batch copy touched more than %d blocks: the others are not recorded", SHIM_MAX_TOUCHED);
}

static void emit_batch_1d(const CUdeviceptr *dsts, const CUdeviceptr *srcs, const size_t *sizes, size_t count,
                          CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint64_t b = 0, c = 0, bytes = 0;
    uint32_t n0 = 0;
    if (count && dsts && srcs && sizes) {
        blocks_read_lock();
        b = word_locked(dsts[0]);
        c = word_locked(srcs[0]);
        touched_add(&t, dsts[0]);
        touched_add(&t, srcs[0]);
        n0 = t.n; /* named by b and c */
        for (size_t i = 0; i < count; i++) {
            touched_add(&t, dsts[i]);
            touched_add(&t, srcs[i]);
            bytes += sizes[i];
        }
        blocks_read_unlock();
    }
    emit_batch(b, c, bytes, s, &t, n0);
}

static void emit_batch_3d(const CUDA_MEMCPY3D_BATCH_OP *ops, size_t n, CUstream s)
{
    struct touched t;
    t.n = 0;
    t.truncated = 0;
    uint64_t b = 0, c = 0, bytes = 0, w[4];
    uint32_t n0 = 0;
    if (n && ops) {
        blocks_read_lock();
        for (size_t i = 0; i < n; i++) {
            operand_words(&ops[i].dst, &ops[i].extent, w);
            operand_words(&ops[i].src, &ops[i].extent, w + 2);
            if (i == 0) {
                b = word_locked(w[0]);
                c = word_locked(w[2]);
            }
            if (w[0])
                touched_add(&t, w[0]);
            if (w[2])
                touched_add(&t, w[2]);
            if (i == 0)
                n0 = t.n;
            bytes += (uint64_t)ops[i].extent.width * ops[i].extent.height * ops[i].extent.depth;
        }
        blocks_read_unlock();
    }
    emit_batch(b, c, bytes, s, &t, n0);
}

/* One hook: the swap op around the real call (swap mode), the record after a success. */
#define DEF_BATCH(NAME, PARAMS, ARGS, WORDS, EMIT)                                                        \
    CUresult CUDAAPI NAME PARAMS                                                                          \
    {                                                                                                     \
        int rec = shim_begin();                                                                           \
        int sw = rec && SHIM_UNLIKELY(g_shim.swap);                                                       \
        struct swap_op op;                                                                                \
        op.active = 0;                                                                                    \
        if (sw) {                                                                                         \
            struct batch_words bw;                                                                        \
            WORDS;                                                                                        \
            CUresult f = swap_op_begin(&op, SWAP_KEY_COPY(PYOBMEM_COPY_OTHER),                           \
                                       swap_norm_stream(hStream, per_thread_name(#NAME)), bw.how, bw.w, bw.n); \
            batch_words_free(&bw);                                                                        \
            if (f != CUDA_SUCCESS)                                                                        \
                return f;                                                                                 \
        }                                                                                                 \
        CUresult r = REAL(NAME, ARGS);                                                                    \
        if (rec && r == CUDA_SUCCESS)                                                                     \
            EMIT;                                                                                         \
        if (sw)                                                                                           \
            swap_op_end(&op, r);                                                                          \
        GPUCLOCK(NAME, hStream, r);  \
        return r;                                                                                         \
    }
#define BATCH_1D_PARAMS CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, CUmemcpyAttributes *attrs, \
                        size_t *attrsIdxs, size_t numAttrs
#define BATCH_1D_ARGS dsts, srcs, sizes, count, attrs, attrsIdxs, numAttrs
#define BATCH_1D_WORDS batch_words_1d(&bw, dsts, srcs, sizes, count)
#define BATCH_1D_EMIT emit_batch_1d(dsts, srcs, sizes, count, hStream)
#define BATCH_3D_WORDS batch_words_3d(&bw, opList, numOps)
#define BATCH_3D_EMIT emit_batch_3d(opList, numOps, hStream)
DEF_BATCH(cuMemcpyBatchAsync, (BATCH_1D_PARAMS, size_t *failIdx, CUstream hStream),
          (BATCH_1D_ARGS, failIdx, hStream), BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_ptsz, (BATCH_1D_PARAMS, size_t *failIdx, CUstream hStream),
          (BATCH_1D_ARGS, failIdx, hStream), BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_v2, (BATCH_1D_PARAMS, CUstream hStream), (BATCH_1D_ARGS, hStream), BATCH_1D_WORDS,
          BATCH_1D_EMIT)
DEF_BATCH(cuMemcpyBatchAsync_v2_ptsz, (BATCH_1D_PARAMS, CUstream hStream), (BATCH_1D_ARGS, hStream),
          BATCH_1D_WORDS, BATCH_1D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags, CUstream hStream),
          (numOps, opList, failIdx, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_ptsz,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, size_t *failIdx, unsigned long long flags, CUstream hStream),
          (numOps, opList, failIdx, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_v2, (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags, CUstream hStream),
          (numOps, opList, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)
DEF_BATCH(cuMemcpy3DBatchAsync_v2_ptsz,
          (size_t numOps, CUDA_MEMCPY3D_BATCH_OP *opList, unsigned long long flags, CUstream hStream),
          (numOps, opList, flags, hStream), BATCH_3D_WORDS, BATCH_3D_EMIT)

/* Sets: MEMSET d = bytes written (elements x element size); flags = PYOBMEM_COPY_ASYNC for the
 * stream-ordered variants. */
/* Swap mode: a set's words (its first and last byte). */
static void set_words(uint64_t w[4], uint64_t dst, uint64_t extent)
{
    w[0] = dst;
    w[1] = extent ? dst + extent - 1 : dst;
    w[2] = w[3] = 0;
}
#define DEF_SET_OP(NAME, PARAMS, ARGS, S, EXTENT, ASYNC, BYTES)                                  \
    CUresult CUDAAPI NAME PARAMS                                                                  \
    {                                                                                             \
        OP_OPEN(NAME, SWAP_KEY_SET, S, set_words(w_, dst, (EXTENT)))                              \
        CUresult r = REAL(NAME, ARGS);                                                            \
        if (rec && r == CUDA_SUCCESS)                                                             \
            emit_set(ASYNC, dst, v, (BYTES), S);                                                  \
        OP_CLOSE(r)                                                                               \
        GPUCLOCK(NAME, S, r);                                                                     \
        return r;                                                                                 \
    }
#define DEF_SET(NAME, VT, ESZ) \
    DEF_SET_OP(NAME, (CUdeviceptr dst, VT v, size_t n), (dst, v, n), 0, (uint64_t)n * ESZ, 0, (uint64_t)n * ESZ)
#define DEF_SET_ASYNC(NAME, VT, ESZ)                                                                      \
    DEF_SET_OP(NAME, (CUdeviceptr dst, VT v, size_t n, CUstream s), (dst, v, n, s), s, (uint64_t)n * ESZ, 1, \
               (uint64_t)n * ESZ)
#define SET2D_EXTENT(pitch, w, h, ESZ) ((h) ? ((uint64_t)(h) - 1) * (pitch) + (uint64_t)(w) * (ESZ) : 0)
#define DEF_SET2D(NAME, VT, ESZ)                                                                       \
    DEF_SET_OP(NAME, (CUdeviceptr dst, size_t pitch, VT v, size_t w, size_t h), (dst, pitch, v, w, h), 0, \
               SET2D_EXTENT(pitch, w, h, ESZ), 0, (uint64_t)w * h * ESZ)
#define DEF_SET2D_ASYNC(NAME, VT, ESZ)                                                                 \
    DEF_SET_OP(NAME, (CUdeviceptr dst, size_t pitch, VT v, size_t w, size_t h, CUstream s),            \
               (dst, pitch, v, w, h, s), s, SET2D_EXTENT(pitch, w, h, ESZ), 1, (uint64_t)w * h * ESZ)
DEF_SET(cuMemsetD8_v2, unsigned char, 1)
DEF_SET(cuMemsetD8_v2_ptds, unsigned char, 1)
DEF_SET(cuMemsetD16_v2, unsigned short, 2)
DEF_SET(cuMemsetD16_v2_ptds, unsigned short, 2)
DEF_SET(cuMemsetD32_v2, unsigned int, 4)
DEF_SET(cuMemsetD32_v2_ptds, unsigned int, 4)
DEF_SET_ASYNC(cuMemsetD8Async, unsigned char, 1)
DEF_SET_ASYNC(cuMemsetD8Async_ptsz, unsigned char, 1)
DEF_SET_ASYNC(cuMemsetD16Async, unsigned short, 2)
DEF_SET_ASYNC(cuMemsetD16Async_ptsz, unsigned short, 2)
DEF_SET_ASYNC(cuMemsetD32Async, unsigned int, 4)
DEF_SET_ASYNC(cuMemsetD32Async_ptsz, unsigned int, 4)
DEF_SET2D(cuMemsetD2D8_v2, unsigned char, 1)
DEF_SET2D(cuMemsetD2D8_v2_ptds, unsigned char, 1)
DEF_SET2D(cuMemsetD2D32_v2, unsigned int, 4)
DEF_SET2D(cuMemsetD2D32_v2_ptds, unsigned int, 4)
DEF_SET2D_ASYNC(cuMemsetD2D8Async, unsigned char, 1)
DEF_SET2D_ASYNC(cuMemsetD2D8Async_ptsz, unsigned char, 1)
DEF_SET2D_ASYNC(cuMemsetD2D32Async, unsigned int, 4)
DEF_SET2D_ASYNC(cuMemsetD2D32Async_ptsz, unsigned int, 4)
