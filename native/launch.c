/*
 * Kernel launches: the hooks, and the launch path shared with the CUPTI callback
 * (cached layout -> scan 8-byte argument words -> block table -> LAUNCH + ACCESS records).
 *
 * The path allocates nothing and makes no syscall or driver call once a handle's layout is
 * cached and each of its argument offsets has been asked about (at most once, see ask_driver):
 * one hash probe, one read section, a binary search per candidate word, one ring group.
 * Argument bytes are only read (memcpy), never written.
 */
#include <string.h>

#include "shim.h"

#define MAX_EXTRA_PAIRS 64

static inline void append(struct touched *t, const struct block *b, uint64_t word)
{
    t->starts[t->n] = b->start;
    t->sizes[t->n] = b->end - b->start;
    t->words[t->n] = PYOBMEM_ACCESS_WORD(b->id, word - b->start);
    t->n++;
}

static inline uint32_t index_slot(uint64_t start)
{
    return (uint32_t)((start * 0x9E3779B97F4A7C15ull) >> (64 - SHIM_TOUCHED_INDEX_BITS));
}

/* t's index of starts, from scratch (t->n has just reached SHIM_TOUCHED_LINEAR). */
static void index_build(struct touched *t)
{
    memset(t->index, 0, sizeof t->index);
    for (uint32_t i = 0; i < t->n; i++) {
        uint32_t k = index_slot(t->starts[i]);
        while (t->index[k])
            k = (k + 1) & (SHIM_TOUCHED_INDEX - 1);
        t->index[k] = (uint16_t)(i + 1);
    }
}

/* add_word beyond SHIM_TOUCHED_LINEAR blocks (foreach launches name up to 150): the lookup first,
 * then its block's start in the index, so a launch of n blocks costs n lookups, not n^2 / 2
 * comparisons. */
static __attribute__((noinline)) int add_word_indexed(struct touched *t, uint64_t word)
{
    const struct block *b = blocks_lookup(word);
    if (!b)
        return 0;
    uint32_t k = index_slot(b->start);
    for (; t->index[k]; k = (k + 1) & (SHIM_TOUCHED_INDEX - 1))
        if (t->starts[t->index[k] - 1] == b->start)
            return 1;
    if (t->n == SHIM_MAX_TOUCHED) {
        t->truncated = 1;
        return 1;
    }
    t->index[k] = (uint16_t)(t->n + 1);
    append(t, b, word);
    return 1;
}

/* Blocks do not overlap, so a word inside a block already in t is that block: no lookup (a
 * launch's pointers often share a segment). Returns 1 when the word is in a block. */
static inline int add_word(struct touched *t, uint64_t word)
{
    if (SHIM_UNLIKELY(t->n >= SHIM_TOUCHED_LINEAR))
        return add_word_indexed(t, word);
    for (uint32_t i = 0; i < t->n; i++)
        if (word - t->starts[i] < t->sizes[i])
            return 1;
    const struct block *b = blocks_lookup(word);
    if (!b)
        return 0;
    append(t, b, word); /* n < LINEAR < MAX: room */
    if (SHIM_UNLIKELY(t->n == SHIM_TOUCHED_LINEAR))
        index_build(t);
    return 1;
}

int touched_add(struct touched *t, uint64_t word) { return add_word(t, word); }

/* Argument words in no block: is the word at this offset of this kernel an address? The driver is
 * asked once per (kernel, offset), with the first value there that is in no block
 * (cuPointerGetAttribute, outside the block lock); the answer is kept in the layout's slot. */
enum { SLOT_UNASKED = 0, SLOT_ASKING = 1, SLOT_ADDRESS = 2, SLOT_NOT_ADDRESS = 3 }; /* odd: nothing to do */
#define MIN_ADDRESS 0x10000ull          /* below: a small integer or NULL, never asked */
#define MAX_ADDRESS 0x00ffffffffffffffull /* above: not a user-space or device address */
#define MAX_ASKS 8                      /* per launch; the others are asked at a later launch */

/* The slots claimed in one launch's scan, for ask_driver. */
struct asks {
    uint32_t n;
    uint32_t slot[MAX_ASKS]; /* [0, n) only are set */
    uint64_t word[MAX_ASKS];
};

/* One launch's scan state. */
struct scan {
    struct touched *t;
    uint64_t lo, span;  /* the blocks' span in this read section */
    uint8_t *slots;     /* the layout's slots; NULL: none (layout unknown) */
    int unknown;        /* a word at an ADDRESS slot is in no block */
    struct asks *asks;
};

/* Claim an unasked slot for the driver's answer (ask_driver, after the read section). */
static __attribute__((noinline)) void claim_ask(struct asks *a, uint8_t *slot, uint32_t i, uint64_t w)
{
    uint8_t st = SLOT_UNASKED;
    if (a->n < MAX_ASKS && __atomic_compare_exchange_n(slot, &st, SLOT_ASKING, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
        a->slot[a->n] = i;
        a->word[a->n++] = w;
    }
}

static const char *memory_type_name(unsigned type)
{
    switch (type) {
    case CU_MEMORYTYPE_HOST: return "host";
    case CU_MEMORYTYPE_DEVICE: return "device";
    case CU_MEMORYTYPE_ARRAY: return "array";
    case CU_MEMORYTYPE_UNIFIED: return "unified";
    default: return "unknown";
    }
}

/* The driver's answers for the words `a` collected (blocks lock not held), into l's slots;
 * returns 1 when one is an address. The query's error, if any, is returned to the shim alone:
 * nothing is left pending for the application. */
static int ask_driver(const struct asks *a, const struct param_layout *l, uintptr_t handle)
{
    int unknown = 0;
    for (uint32_t k = 0; k < a->n; k++) {
        /* An ask claimed in a read section that a writer made start again may be for a word the
         * consistent pass found in a block: give the slot back, unasked. */
        if (blocks_access_word(a->word[k])) {
            __atomic_store_n(&l->slots[a->slot[k]], SLOT_UNASKED, __ATOMIC_RELEASE);
            continue;
        }
        unsigned type = 0;
        shim_tls_guard++;
        CUresult r = real_cuPointerGetAttribute
                         ? real_cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)a->word[k])
                         : CUDA_ERROR_NOT_INITIALIZED;
        shim_tls_guard--;
        __atomic_store_n(&l->slots[a->slot[k]], r == CUDA_SUCCESS ? SLOT_ADDRESS : SLOT_NOT_ADDRESS, __ATOMIC_RELEASE);
        if (r == CUDA_SUCCESS) {
            unknown = 1;
            ring_note(PYOBMEM_NOTE_UNKNOWN_ADDRESS ".%#llx+%u=%s memory at %#llx, in no recorded block", (unsigned long long)handle,
                      a->slot[k] * 8, memory_type_name(type), (unsigned long long)a->word[k]);
        }
    }
    return unknown;
}


/* n words from p (one parameter's, param_word_range), the first at slot slot0 of the layout when
 * with_slots (a known layout: its slots cover every word of its scan list; a constant at each
 * call, so each gets its own loop): a word outside the span of all blocks, [lo, lo + span) (most
 * words of a struct of sizes and strides), needs no lookup; a word in no block may still be an
 * address the driver knows, unless it is a small integer, NULL or above any address, or the layout
 * is unknown; else its slot says (asked about long ago, in the common case). A PyTorch launch
 * scans ~45-90 words and names ~2.5 blocks: the loop is what most words cost (~18 instructions a
 * word with a slot to read, 25 before the scan list). It keeps lo, span and the slots in registers
 * (through a pointer to the scan, each store of add_word would make the compiler load them
 * again). */
static inline __attribute__((always_inline)) uint32_t scan_words(struct scan *s, const char *p, uint32_t slot0,
                                                                 uint32_t n, int with_slots)
{
    const uint64_t lo = s->lo, span = s->span;
    uint8_t *const sl = with_slots ? s->slots + slot0 : NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, sizeof w);
        if (w - lo < span && add_word(s->t, w))
            continue;
        if (!with_slots || w - MIN_ADDRESS > MAX_ADDRESS - MIN_ADDRESS)
            continue;
        uint8_t st = __atomic_load_n(&sl[i], __ATOMIC_ACQUIRE);
        if (SHIM_LIKELY(st & 1)) /* NOT_ADDRESS, ASKING */
            continue;
        if (st == SLOT_ADDRESS)
            s->unknown = 1;
        else
            claim_ask(s->asks, &sl[i], slot0 + i, w);
    }
    return n;
}

/* The packed argument buffer of `extra`, if any. */
static int extra_buffer(void **extra, const char **buf, size_t *size)
{
    const char *b = NULL;
    size_t s = 0;
    int have_size = 0;
    for (int i = 0; i < MAX_EXTRA_PAIRS && extra[2 * i] != CU_LAUNCH_PARAM_END; i++) {
        if (extra[2 * i] == CU_LAUNCH_PARAM_BUFFER_POINTER) {
            b = extra[2 * i + 1];
        } else if (extra[2 * i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[2 * i + 1]) {
            memcpy(&s, extra[2 * i + 1], sizeof s);
            have_size = 1;
        }
    }
    if (!b || !have_size)
        return 0;
    *buf = b;
    *size = s;
    return 1;
}

uint32_t scan_launch_args(uintptr_t handle, void **kernelParams, void **extra, struct touched *t, uint16_t *flags)
{
    const struct param_layout *l = params_get(handle);
    const char *buf = NULL;
    size_t bufsize = 0;
    int have_buf = !kernelParams && extra && extra_buffer(extra, &buf, &bufsize);
    uint32_t words = 0;

    if (!l->known)
        *flags |= PYOBMEM_LAUNCH_NO_LAYOUT | PYOBMEM_LAUNCH_OPAQUE;
    else if (!kernelParams && !have_buf && l->count > 0)
        *flags |= PYOBMEM_LAUNCH_OPAQUE;

    /* The asks claimed in an attempt stay claimed (their slots are ASKING) when a writer makes the
     * read section start again: they are kept, and `unknown` is found again. */
    struct asks asks;
    asks.n = 0;
    struct scan sc = {.t = t, .slots = l->known ? l->slots : NULL,
                      .asks = &asks};
    uint32_t seq;
    int attempt = 0;
again:
    seq = blocks_read_begin(attempt++);
    t->n = 0;
    t->truncated = 0;
    sc.unknown = 0;
    words = 0;
    uint64_t lo, hi;
    blocks_bounds(&lo, &hi);
    sc.lo = lo;
    sc.span = hi - lo;
    if (l->known && kernelParams) {
        for (uint32_t k = 0; k < l->n_scan; k++) {
            const struct param_scan *ps = &l->scan[k];
            const char *p = kernelParams[ps->index];
            if (p)
                words += scan_words(&sc, p + ps->k0, ps->slot0, ps->n, 1);
        }
    } else if (l->known && have_buf) {
        for (uint32_t k = 0; k < l->n_scan; k++) {
            const struct param_scan *ps = &l->scan[k];
            if (ps->end <= bufsize)
                words += scan_words(&sc, buf + ps->offset + ps->k0, ps->slot0, ps->n, 1);
        }
    } else if (have_buf) {
        words += scan_words(&sc, buf, 0, (uint32_t)((bufsize > UINT32_MAX ? UINT32_MAX : bufsize) / 8), 0);
    }
    if (!blocks_read_end(seq))
        goto again;
    if (SHIM_UNLIKELY(asks.n) && ask_driver(&asks, l, handle))
        sc.unknown = 1;
    if (t->truncated)
        *flags |= PYOBMEM_LAUNCH_TRUNCATED;
    if (sc.unknown)
        *flags |= PYOBMEM_LAUNCH_UNKNOWN_ADDRESS;
    return words;
}

static void emit_launch(uint16_t flags, uintptr_t handle, uint64_t stream, uint64_t grid, uint32_t words,
                        const struct touched *t)
{
    uint64_t seq = shim_next_op();
    struct pyobmem_record op = {.type = PYOBMEM_EV_LAUNCH, .flags = flags,
                                .launch = {.op = seq, .function = handle, .stream = stream, .grid = grid,
                                           .n_touched = t->n, .n_words = words}};
    emit_op_with_accesses(&op, seq, t);
}

static inline __attribute__((always_inline)) void record_into(struct touched *t, uintptr_t handle, uint64_t stream,
                                                              uint64_t grid, void **kernelParams, void **extra,
                                                              uint16_t flags)
{
    t->n = 0;
    t->truncated = 0;
    uint32_t words = scan_launch_args(handle, kernelParams, extra, t, &flags);
    emit_launch(flags, handle, stream, grid, words, t);
}

void record_launch(uintptr_t handle, uint64_t stream, uint64_t grid, void **kernelParams, void **extra,
                   uint16_t flags)
{
    ST_BEGIN(t0);
    struct touched t;
    record_into(&t, handle, stream, grid, kernelParams, extra, flags);
    ST_END(t0, ST_LAUNCH_RECORD);
}

CUresult launch_swap_begin(struct launch_swap *ls, uintptr_t handle, CUstream run_stream, void **kernelParams,
                           void **extra, uint16_t flags)
{
    ls->t.n = 0;
    ls->t.truncated = 0;
    ls->flags = flags;
    ls->words = scan_launch_args(handle, kernelParams, extra, &ls->t, &ls->flags);
    int how = (ls->flags & PYOBMEM_LAUNCH_OPAQUE) ? SWAP_OP_OPAQUE : 0;
    if (ls->flags & PYOBMEM_LAUNCH_TRUNCATED)
        how |= SWAP_OP_INCOMPLETE;
    return swap_op_begin(&ls->op, handle, run_stream, how, ls->t.starts, ls->t.n);
}

void launch_swap_end(struct launch_swap *ls, uintptr_t handle, uint64_t stream, uint64_t grid, CUresult r)
{
    if (r == CUDA_SUCCESS)
        emit_launch(ls->flags, handle, stream, grid, ls->words, &ls->t);
    swap_op_end(&ls->op, r);
}

/* The hooks' swap-mode launch: scan, bring blocks back, launch, record. */
#define SWAP_LAUNCH(NAME, F, S, G, KP, EXTRA, FLAGS, CALL)                                             \
    if (SHIM_UNLIKELY(g_shim.swap)) {                                                                  \
        if (!hooks_record_launches()) { /* CUPTI does it, or not recording */                          \
            CUresult r0_ = CALL;                                                                       \
            GPUCLOCK(NAME, S, r0_);                                                                    \
            return r0_;                                                                                \
        }                                                                                              \
        struct launch_swap ls_;                                                                        \
        CUresult f_ = launch_swap_begin(&ls_, (uintptr_t)(F), swap_norm_stream((S), per_thread_name(#NAME)), KP, \
                                        EXTRA, (FLAGS));                                              \
        if (f_ != CUDA_SUCCESS)                                                                        \
            return f_;                                                                                 \
        CUresult r_ = CALL;                                                                            \
        launch_swap_end(&ls_, (uintptr_t)(F), (uint64_t)(uintptr_t)(S), (G), r_);                     \
        GPUCLOCK(NAME, S, r_);                                                                         \
        return r_;                                                                                     \
    }

uint16_t launch_config_flags(const CUlaunchConfig *config)
{
    uint16_t f = PYOBMEM_LAUNCH_EX;
    if (config && config->attrs)
        for (unsigned i = 0; i < config->numAttrs; i++)
            if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && config->attrs[i].value.cooperative)
                f |= PYOBMEM_LAUNCH_COOPERATIVE;
    return f;
}

static inline int hooks_record_launches(void)
{
    return shim_begin() && !__atomic_load_n(&g_shim.cupti_active, __ATOMIC_ACQUIRE);
}

/* Before the driver's call, start loading what the record after it reads: the ring's next slots,
 * the kernel's layout, the block table's read line, the op counter (and the GPU clock's next seq,
 * on its line) and this frame's touched set. The application's and the driver's work between two
 * launches evicts them, and their TLB entries; the record would wait for them one after another once
 * the call returns (its atomics wait for every load before them), where now they arrive during the
 * call (~4 us on the H200). On the fake driver with 4 MiB written between launches (shim_cost.py
 * --time --evict-kb 4096, the CI machine), this alone: launch record 679 -> 485 ns, its ring write
 * 394 -> 220; with 256 KiB, 275 -> 268 (docs/internals.md has the figures of all of it). */
static inline void launch_prefetch(uintptr_t f, const struct touched *t)
{
    op_prefetch();
    params_prefetch(f);
    __builtin_prefetch(t, 1, 3); /* n and the first access words */
    __builtin_prefetch(t->starts, 1, 3);
    __builtin_prefetch(t->sizes, 1, 3);
}

/* The hooks' launch outside swap mode: prefetch, the real call, the record (the prefetch and the
 * record timed as one launch record). */
#define TRACED_LAUNCH(NAME, F, S, G, KP, EXTRA, FLAGS, CALL)                                          \
    int rec_ = hooks_record_launches();                                                               \
    struct touched t_;                                                                                \
    ST_BEGIN(tp_);                                                                                    \
    if (rec_)                                                                                         \
        launch_prefetch((uintptr_t)(F), &t_);                                                         \
    ST_MORE(tp_, ST_LAUNCH_RECORD);                                                                   \
    ST_BEGIN(t0_);                                                                                    \
    CUresult r_ = CALL;                                                                               \
    ST_END(t0_, ST_LAUNCH_DRIVER);                                                                    \
    if (rec_ && r_ == CUDA_SUCCESS) {                                                                 \
        ST_BEGIN(t1_);                                                                                \
        record_into(&t_, (uintptr_t)(F), (uint64_t)(uintptr_t)(S), (G), KP, EXTRA, FLAGS);            \
        ST_END(t1_, ST_LAUNCH_RECORD);                                                                \
    }                                                                                                 \
    GPUCLOCK(NAME, S, r_);                                                                            \
    return r_;

#define GRID(x, y, z) ((uint64_t)(x) * (uint64_t)(y) * (uint64_t)(z))

#define DEF_LAUNCH(NAME)                                                                                         \
    CUresult CUDAAPI NAME(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,      \
                          unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **kernelParams, \
                          void **extra)                                                                          \
    {                                                                                                            \
        SWAP_LAUNCH(NAME, f, s, GRID(gx, gy, gz), kernelParams, extra, 0,                                        \
                    REAL(NAME, (f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra)))                     \
        TRACED_LAUNCH(NAME, f, s, GRID(gx, gy, gz), kernelParams, extra, 0,                                      \
                      REAL(NAME, (f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams, extra)))                   \
    }
DEF_LAUNCH(cuLaunchKernel)
DEF_LAUNCH(cuLaunchKernel_ptsz)

#define DEF_LAUNCH_EX(NAME)                                                                                 \
    CUresult CUDAAPI NAME(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)    \
    {                                                                                                       \
        if (!config) { /* the driver's error to return; nothing to record */                               \
            (void)hooks_record_launches();                                                                  \
            return REAL(NAME, (config, f, kernelParams, extra));                                            \
        }                                                                                                   \
        SWAP_LAUNCH(NAME, f, config->hStream, GRID(config->gridDimX, config->gridDimY, config->gridDimZ),   \
                    kernelParams, extra, launch_config_flags(config), REAL(NAME, (config, f, kernelParams, extra))) \
        TRACED_LAUNCH(NAME, f, config->hStream, GRID(config->gridDimX, config->gridDimY, config->gridDimZ), \
                      kernelParams, extra, launch_config_flags(config), REAL(NAME, (config, f, kernelParams, extra))) \
    }
DEF_LAUNCH_EX(cuLaunchKernelEx)
DEF_LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define DEF_LAUNCH_COOP(NAME)                                                                                    \
    CUresult CUDAAPI NAME(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,      \
                          unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **kernelParams) \
    {                                                                                                            \
        SWAP_LAUNCH(NAME, f, s, GRID(gx, gy, gz), kernelParams, NULL, PYOBMEM_LAUNCH_COOPERATIVE,                \
                    REAL(NAME, (f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams)))                            \
        TRACED_LAUNCH(NAME, f, s, GRID(gx, gy, gz), kernelParams, NULL, PYOBMEM_LAUNCH_COOPERATIVE,              \
                      REAL(NAME, (f, gx, gy, gz, bx, by, bz, shmem, s, kernelParams)))                          \
    }
DEF_LAUNCH_COOP(cuLaunchCooperativeKernel)
DEF_LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)
