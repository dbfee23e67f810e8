/*
 * Internal header of the shim (libpyobmem.so). Not installed; the ABI shared with Python is
 * pyobmem/include/pyobmem/abi.h.
 */
#ifndef PYOBMEM_SHIM_H
#define PYOBMEM_SHIM_H

/* Stop cuda.h's renames (cuMemAlloc -> cuMemAlloc_v2, cuLaunchKernel -> _ptsz under PTDS):
 * every name in the shim is the exact symbol libcuda exports. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "pyobmem/abi.h"

#define SHIM_EXPORT __attribute__((visibility("default")))
#define SHIM_LIKELY(x) __builtin_expect(!!(x), 1)
#define SHIM_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- hooks.def: real-function pointer types, pointers, exported wrappers ---- */
#define HOOK(ret, name, params, args) typedef ret (*pfn_##name) params;
#define CALL(ret, name, params) typedef ret (*pfn_##name) params;
#include "hooks.def"

#define HOOK(ret, name, params, args) extern pfn_##name real_##name;
#define CALL(ret, name, params) extern pfn_##name real_##name;
#include "hooks.def"

/* The wrappers carry the driver's names and are the library's exports. Declaring them here
 * from hooks.def makes the compiler check each line against cuda.h's own prototype. */
#define HOOK(ret, name, params, args) SHIM_EXPORT ret CUDAAPI name params;
#include "hooks.def"

/* Self-timing, in a build with -DPYOBMEM_SELF_TIME (`make -B native SELFTIME=1`): cycles and
 * calls of the shim's parts on the application's threads, printed to stderr at exit
 * (selftime.c): where a traced program's time goes, measured inside it (a cuDNN LSTM's 12% was
 * found so). In the normal build the macros are empty. */
#ifdef PYOBMEM_SELF_TIME
/* GPUCLOCK_CAPTURING, _CTX and _RECORD are the sample's three driver calls, inside GPUCLOCK_SAMPLE. */
enum st_part { ST_LAUNCH_DRIVER, ST_LAUNCH_RECORD, ST_COPY_RECORD, ST_RING_WRITE, ST_PARAMS_REFRESH, ST_GPUCLOCK_SAMPLE,
               ST_GPUCLOCK_CAPTURING, ST_GPUCLOCK_CTX, ST_GPUCLOCK_RECORD, ST_PARTS };
uint64_t st_now(void);
void st_add(enum st_part part, uint64_t ticks);
void st_more(enum st_part part, uint64_t ticks);
#define ST_BEGIN(v) uint64_t v = st_now()
#define ST_END(v, part) st_add(part, st_now() - (v))
/* Time of a part done in two pieces: the first piece's ticks, the call counted with the second. */
#define ST_MORE(v, part) st_more(part, st_now() - (v))
#else
#define ST_BEGIN(v) ((void)0)
#define ST_END(v, part) ((void)0)
#define ST_MORE(v, part) ((void)0)
#endif

/* Call the real function, or fail as an absent driver would if it was never resolved. */
#define REAL(name, args) (real_##name ? real_##name args : CUDA_ERROR_NOT_INITIALIZED)

/* ---- process state (intercept.c) ---- */
struct shim_state {
    int recording;            /* ring mapped and not disabled */
    int disabled;             /* PYOBMEM_DISABLE=1 */
    void *libcuda;            /* our handle on libcuda (dlopen) */
    uint32_t pid;             /* cached getpid(), reset in a fork child */
    uint32_t ppid;
    int driver_version;       /* cuDriverGetVersion, 0 if unknown */
    int need_process;         /* atomic: emit PROCESS at the next hook (after fork) */
    int cupti_active;         /* launches are recorded by the CUPTI callback, not the hooks */
    int cuinit_done;          /* atomic: post-cuInit work (notes, CUPTI) done once per process */
    int swap;                 /* swap mode: PYOBMEM_CONTROL mapped (set once at init, before
                               * recording; cleared in a fork child). The op hooks test it once. */
    int init_done;            /* atomic: shim_init has run (every hook's check; pthread_once before) */
    uint64_t handle_epoch;    /* atomic: params.c's epoch of the calls that free handles; here, on the
                               * line shim_begin reads, since cuDNN asks for handles ~180 times a step */
    /* The counters every op or allocation writes, on a cache line of their own: the fields
     * above are read by every hook on every thread and must not bounce with them. */
    _Alignas(64) uint64_t op_seq; /* atomic: per-process op sequence (launch, copy, set, graph) */
    uint32_t block_seq;       /* atomic: per-process block id counter */
    uint64_t device_bytes;    /* atomic: bytes of live device blocks (not managed, not host): the budget's base */
    uint64_t gpuclock_next;   /* atomic: op seq of gpuclock.c's next sample (UINT64_MAX: off), next to op_seq:
                               * every op reads it right after taking its seq */
};
_Static_assert(offsetof(struct shim_state, handle_epoch) < 64 && offsetof(struct shim_state, gpuclock_next) < 128,
               "g_shim's fields on their cache lines");
extern struct shim_state g_shim;
/* >0: inside the shim, hooks pass straight through. Initial-exec: every hook reads it, and the
 * default model for a shared object costs a __tls_get_addr call each time; the shim is loaded at
 * start (LD_PRELOAD), so its TLS is in the static block. */
#define SHIM_TLS __thread __attribute__((tls_model("initial-exec")))
extern SHIM_TLS int shim_tls_guard;

void shim_init_wait(void);
/* Initialise on first use: one load once done (pthread_once's fast path is two calls, one through
 * the PLT, at every hook). */
static inline void shim_init_once(void)
{
    if (SHIM_UNLIKELY(!__atomic_load_n(&g_shim.init_done, __ATOMIC_ACQUIRE)))
        shim_init_wait();
}
void shim_emit_process(void);

/* Called at the top of every hook. Returns nonzero when the hook should record. */
static inline int shim_begin(void)
{
    if (shim_tls_guard)
        return 0;
    shim_init_once();
    if (!g_shim.recording)
        return 0;
    if (SHIM_UNLIKELY(__atomic_load_n(&g_shim.need_process, __ATOMIC_RELAXED)))
        shim_emit_process();
    return 1;
}

extern SHIM_TLS uint64_t shim_tls_op; /* the last op seq this thread took (gpuclock.c); initial-exec as shim_tls_guard */
static inline uint64_t shim_next_op(void)
{
    return shim_tls_op = __atomic_add_fetch(&g_shim.op_seq, 1, __ATOMIC_RELAXED);
}

uint64_t shim_now_ns(void);

/* ---- ring.c, blocks.c: what every op's record reads ---- */
/* Start loading the ring's head, the two slots after this process's last group (where a launch's
 * LAUNCH and first ACCESS record likely go) and the clock's code and data. */
void ring_prefetch(void);
/* Start loading what a blocks read section reads first (the count, the span, the table). */
void blocks_prefetch(void);
/* Before an op hook's real call: start loading what every op's record reads after it (the ring's
 * slots and clock, the block table's read line, the op counter's line, where the GPU clock's next
 * seq is too), so that it arrives during the call (launch.c, launch_prefetch). */
static inline void op_prefetch(void)
{
    ring_prefetch();
    blocks_prefetch();
    __builtin_prefetch(&g_shim.op_seq, 1, 3);
}

/* ---- ring.c ---- */
int ring_open(const char *path);
void ring_reset_after_fork(void);
/* Write n records as one group: all or nothing. Payload fields (type, flags, the payload) come
 * from recs; seq, pid and ts are filled in. Returns 1 if written, 0 if dropped (counted). */
int ring_write(const struct pyobmem_record *recs, unsigned n);
/* An op record (LAUNCH, GRAPH_LAUNCH, MEMCPY) of op seq `seq` and the ACCESS records naming
 * words[0, n) (four a record, the last one padded with 0) as one group, written in place into
 * the ring's slots (the launch path: no copy of the records through the stack). Returns as ring_write. */
int ring_write_op(const struct pyobmem_record *op, uint64_t seq, const uint64_t *words, uint32_t n);
/* NOTE (key = 0) or KERNEL_NAME (key = handle) text in 32-byte chunks, at most 8. */
void ring_text(uint16_t type, uint64_t key, const char *text);
void ring_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- blocks.c ---- */
struct block {
    uint64_t start, end; /* [start, end) */
    uint32_t id;
    uint16_t kind;
    uint16_t device;
    uint64_t stream;
};
/* Insert a block (evicting any stale overlapping ones, which get a FREE record), emit ALLOC.
 * Returns its id (0: not inserted, out of memory). */
uint32_t blocks_add(uint64_t addr, uint64_t size, uint64_t stream, int kind, int device);
/* Look up the block starting exactly at addr. Returns 1 and fills *out when found. */
int blocks_find_start(uint64_t addr, struct block *out);
/* Remove the block starting at addr if it still has id `id`; emit FREE. */
void blocks_remove(uint64_t addr, uint32_t id, uint64_t stream);
/* Remove every block overlapping [start, end); emit FREE for each. Returns how many. */
int blocks_remove_range(uint64_t start, uint64_t end, uint64_t stream);
/* Read-side lookup for the launch path: hold blocks_read_lock() around blocks_lookup(). */
void blocks_read_lock(void);
void blocks_read_unlock(void);
const struct block *blocks_lookup(uint64_t addr);
/* [lo, hi): the span of all blocks (lo = hi when there are none). A word outside it is in no
 * block. Read in the same read section as the lookups it spares. */
void blocks_bounds(uint64_t *lo, uint64_t *hi);
/* Lock-free read section (a seqlock): s = blocks_read_begin(attempt), lookups, then
 * blocks_read_end(s) says whether they stand; when it returns 0, undo what the lookups found
 * and start again with attempt + 1. After a few attempts begin takes the read lock instead
 * (returns BLOCKS_READ_LOCKED) and end releases it and returns 1. */
#define BLOCKS_READ_LOCKED 1u
uint32_t blocks_read_begin(int attempt);
int blocks_read_end(uint32_t s);
/* Access word of addr (0 if in no block), in a read section of its own. */
uint64_t blocks_access_word(uint64_t addr);
void blocks_reset_after_fork(void);
void blocks_atfork_prepare(void);
void blocks_atfork_parent(void);

/* ---- params.c ---- */
/* A parameter a launch scans, worked out once per layout (param_word_range): parameter `index`, its
 * bytes [offset, end) of the argument buffer, and its n words from byte k0 of it, at slots slot0... */
struct param_scan {
    uint32_t index, offset, end, k0, n, slot0;
};
struct param_layout {
    int known;         /* 0: layout could not be queried (NO_LAYOUT) */
    uint32_t count;
    uint32_t *offset;  /* count entries */
    uint32_t *size;
    uint32_t n_slots;  /* 8-byte words of the argument buffer (known layouts) */
    uint8_t *slots;    /* per word at offset 8*i: SLOT_* (launch.c), atomic; NULL: none */
    uint64_t epoch;    /* atomic: the handle-freeing epoch (params.c) it was last queried in */
    uint32_t n_scan;   /* the parameters with words to scan (of cuDNN's ~10-30, the pointers and
                        * structs): the launch path walks these, not all `count` */
    const struct param_scan *scan;
};
/* Layout of a function or kernel handle; queried and cached on first sight (which also emits
 * the KERNEL_NAME records). Never NULL. */
const struct param_layout *params_get(uintptr_t handle);
/* Start loading the cached layout of a handle, if any (launch_prefetch); reads the cache only. */
void params_prefetch(uintptr_t handle);
/* memory.c: the host-alias table's lock around fork. */
void host_alias_atfork_prepare(void);
void host_alias_atfork_parent(void);
void host_alias_atfork_child(void);
/* The 8-byte words of one kernel parameter whose bytes start at p and which sits at byte offset
 * `offset` of the argument buffer: the words aligned to 8 in the buffer, where pointers are
 * (param_word_range: n words from p + k0). Calls word(ctx, offset of the word in the buffer,
 * value) for each; returns how many. The scan of graph kernel nodes (graph.c); launch.c's
 * scan_words walks the same range (the layout's scan list) with its state in registers. */
static inline uint32_t param_word_range(uint32_t offset, uint32_t size, uint32_t *k0)
{
    *k0 = (uint32_t)(-offset) & 7u; /* bytes before the first word aligned to 8 in the buffer */
    return *k0 + 8 > size ? 0 : (size - *k0) / 8;
}
static inline __attribute__((always_inline)) uint32_t param_words(const char *p, uint32_t offset, uint32_t size,
                                                                  void (*word)(void *, uint32_t, uint64_t), void *ctx)
{
    uint32_t k0, n = param_word_range(offset, size, &k0);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t w;
        memcpy(&w, p + k0 + 8 * i, sizeof w);
        word(ctx, offset + k0 + 8 * i, w);
    }
    return n;
}
void params_atfork_prepare(void);
void params_atfork_parent(void);
void params_atfork_child(void);

/* ---- swap*.c (swap_state.h): VMM backing, the allocator and the swap executor (swap mode only) ---- */
#define SWAP_MAX_OP_BLOCKS 256 /* as SHIM_MAX_TOUCHED: a foreach launch names up to 150 */
/* One op (launch, graph launch, copy, set) as the executor sees it, from swap_op_begin to
 * swap_op_end (same thread). */
struct swap_op {
    int active;        /* swap_op_begin ran: call swap_op_end */
    int capturing;     /* the op's stream is capturing a graph: no swap action, no event on it */
    int opaque;        /* the op may touch blocks it does not name */
    int overflow;      /* more swap blocks than `addrs` holds */
    int all;           /* it counts in g_inflight_all (opaque or overflow): nothing may go out */
    uint64_t key;      /* PYOBMEM_OP_KEY of the op */
    CUstream stream;   /* normalised (see swap_norm_stream) */
    int64_t pos;       /* the op's position in the followed plan, -1 if none */
    uint32_t n;
    uint64_t addrs[SWAP_MAX_OP_BLOCKS]; /* start addresses of the swap blocks it touches */
};
/* Map the control file; returns 1 when swap mode is on. Called once at init. */
int swap_open(const char *path);
/* The stream an op really runs on: a NULL stream of a per-thread (_ptsz/_ptds) entry point is
 * CU_STREAM_PER_THREAD; the legacy NULL stream stays NULL. */
static inline CUstream swap_norm_stream(CUstream s, int per_thread)
{
    return (!s && per_thread) ? CU_STREAM_PER_THREAD : s;
}
/* Whether a hooked entry point's name is a per-thread-stream one (_ptsz, _ptds). */
static inline int per_thread_name(const char *name) { return strstr(name, "_pt") != NULL; }
/* Before the real call: follow the plan, bring touched blocks back (demand), make the op's
 * stream wait for their copies. `words` are candidate addresses (launch: the touched blocks'
 * starts; copies: both ends of each device side). A failure (a block that cannot be brought
 * back) is returned and the op must not run; the op is then not recorded. `how`: SWAP_OP_* flags. */
#define SWAP_OP_OPAQUE 1     /* blocks it names are never swapped again; implies INCOMPLETE */
#define SWAP_OP_INCOMPLETE 2 /* it may touch blocks it does not name: all come back first */
CUresult swap_op_begin(struct swap_op *op, uint64_t key, CUstream s, int how, const uint64_t *words, size_t n);
/* After the real call: last-use events, planned swap-outs. */
void swap_op_end(struct swap_op *op, CUresult r);
/* An allocation in swap mode: returns 1 with *dptr set when the shim serves it from its own
 * VMM-backed memory; 0 when the caller must use the real allocator (too small, a graph capture,
 * a pool the shim does not serve, or any VMM failure). kind: SWAP_ALLOC_*; s: the normalised
 * stream (ordered kinds); pool: the pool asked (FROM_POOL). */
#define SWAP_ALLOC_DRIVER 0    /* cuMemAlloc_v2 */
#define SWAP_ALLOC_ASYNC 1     /* cuMemAllocAsync: the device's current pool */
#define SWAP_ALLOC_FROM_POOL 2 /* cuMemAllocFromPoolAsync */
int swap_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, int kind, CUstream s);
/* A stream-ordered allocation the driver's pool served (succeeded): counted at the plan's site. */
void swap_counted_elsewhere(size_t size);
void swap_bind_id(uint64_t addr, uint32_t id);
/* A free in swap mode: returns 1 and *rc when dptr is a block the shim serves. ordered: a
 * cuMemFreeAsync on stream s (takes effect at its stream point); 0: cuMemFree (waits for the
 * block's last uses, as the real free waits for the device). */
int swap_free(CUdeviceptr dptr, CUstream s, int ordered, CUresult *rc);
/* Pools: creation (whether the shim may serve it), destruction, and the queries that count the
 * shim's blocks as the pool's (value: a cuuint64_t of the used/reserved attributes). */
void swap_pool_created(CUmemoryPool pool, const CUmemPoolProps *props);
void swap_pool_destroyed(CUmemoryPool pool);
void swap_pool_attr(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
void swap_pool_reset_high(CUmemoryPool pool, CUmemPool_attribute attr);
void swap_pool_trim(CUmemoryPool pool, size_t keep);
/* An application thread enters (returns the time, ns) and leaves cuCtxSynchronize or
 * cuStreamSynchronize: queued swap-outs are not issued meanwhile (swap_copy.c), and the followed
 * plan's position is kept for the smaller window before it (swap_plan.c); NOTE swap.app_syncs
 * counts the calls and their time. No lock taken. */
uint64_t swap_app_sync_begin(void);
void swap_app_sync_end(uint64_t t_begin);
/* cuMemSetAccess on a VMM-backed block: returns 1 and *rc when handled. */
int swap_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count, CUresult *rc);
/* IPC-exported or named by NCCL: never swapped again; a block that is out comes back now
 * (synchronously, on the shim stream). */
void swap_never(CUdeviceptr p);
/* A pointer query names p: the block holding it comes back now if it is out (synchronously). */
void swap_touch(CUdeviceptr p);
/* The blocks of words[0..n) that are out, brought back at once (one lock, one LRU stamp): the
 * pointers of a graph's memcpy and memset nodes, which the driver checks (graph.c). */
void swap_touch_many(const uint64_t *words, size_t n);
void swap_atfork_prepare(void);
void swap_atfork_parent(void);
void swap_atfork_child(void);
/* Copies and sets: the template key (matches pyobmem.planner.op_keys). */
#define SWAP_KEY_COPY(kind) PYOBMEM_OP_KEY_COPY(PYOBMEM_EV_MEMCPY, (kind))
#define SWAP_KEY_SET PYOBMEM_OP_KEY_COPY(PYOBMEM_EV_MEMSET, 0)

/* ---- launch.c ---- */
#define SHIM_MAX_TOUCHED 256 /* PyTorch's multi_tensor_apply names up to 150 tensors (depth 5 x 30) */
#define SHIM_TOUCHED_LINEAR 16 /* up to this many blocks, a new word is checked against each */
#define SHIM_TOUCHED_INDEX_BITS 9 /* the index of starts beyond that: 512 slots, at most half full */
#define SHIM_TOUCHED_INDEX (1u << SHIM_TOUCHED_INDEX_BITS)
_Static_assert(SHIM_TOUCHED_INDEX >= 2 * SHIM_MAX_TOUCHED && SHIM_MAX_TOUCHED < 65535, "touched index too small");
/* A set of distinct blocks touched by one op (deduplicated by block). Empty: n = 0 (nothing else
 * needs setting up: the index is built when n reaches SHIM_TOUCHED_LINEAR). */
struct touched {
    uint32_t n;
    int truncated;
    uint64_t words[SHIM_MAX_TOUCHED]; /* access words */
    uint64_t starts[SHIM_MAX_TOUCHED]; /* block start addresses (for the swap executor) */
    uint64_t sizes[SHIM_MAX_TOUCHED];  /* block sizes: a word inside a block already here needs no lookup */
    uint16_t index[SHIM_TOUCHED_INDEX]; /* n >= LINEAR: open addressing on starts, i + 1 of starts[i]; 0 empty */
};
/* Look up one candidate word (caller is in a blocks read section or holds the read lock); returns 1
 * when it is in a block. */
int touched_add(struct touched *t, uint64_t word);
/* Scan the arguments of a launch into t (emptied first); returns the number of 8-byte words
 * scanned and ORs OPAQUE/NO_LAYOUT/UNKNOWN_ADDRESS into *flags as needed. Runs its own blocks read
 * section. */
uint32_t scan_launch_args(uintptr_t handle, void **kernelParams, void **extra, struct touched *t, uint16_t *flags);
/* Emit a LAUNCH or GRAPH_LAUNCH record (`op`, of op seq `seq`) followed by its ACCESS records (of t),
 * as one ring group. */
static inline void emit_op_with_accesses(const struct pyobmem_record *op, uint64_t seq, const struct touched *t)
{
    ring_write_op(op, seq, t->words, t->n);
}
void record_launch(uintptr_t handle, uint64_t stream, uint64_t grid, void **kernelParams, void **extra,
                   uint16_t flags);
uint16_t launch_config_flags(const CUlaunchConfig *config);
/* Swap mode: the launch path split around the real call (hooks and CUPTI). begin scans the
 * arguments and runs swap_op_begin; a non-success result means: do not launch. end emits the
 * LAUNCH record (if r succeeded) and runs swap_op_end. */
struct launch_swap {
    struct touched t;
    struct swap_op op;
    uint16_t flags;
    uint32_t words;
};
CUresult launch_swap_begin(struct launch_swap *ls, uintptr_t handle, CUstream run_stream, void **kernelParams,
                           void **extra, uint16_t flags);
void launch_swap_end(struct launch_swap *ls, uintptr_t handle, uint64_t stream, uint64_t grid, CUresult r);

/* ---- gpuclock.c: GPU time samples (timing events every N ops) ---- */
void gpuclock_init(void);
void gpuclock_atfork_child(void);
void gpuclock_sample(uint64_t seq, CUstream s);
/* After an op was issued on stream s (normalised: swap_norm_stream) by this thread: one load and
 * a compare unless this op is due for a sample. */
static inline void gpuclock_after(CUstream s)
{
    if (SHIM_UNLIKELY(shim_tls_op >= __atomic_load_n(&g_shim.gpuclock_next, __ATOMIC_RELAXED)))
        gpuclock_sample(shim_tls_op, s);
}
/* The one line the op hooks add after the real call. */
#define GPUCLOCK(NAME, S, R)                                                  \
    do {                                                                      \
        if ((R) == CUDA_SUCCESS)                                              \
            gpuclock_after(swap_norm_stream((S), per_thread_name(#NAME)));    \
    } while (0)

/* ---- graph.c ---- */
/* graph_build.c: the bodies of a conditional node seen created (cuGraphAddNode), copied into
 * bodies[GRAPH_MAX_COND_BODIES]; 0 when unknown. */
#define GRAPH_MAX_COND_BODIES 64
unsigned graph_cond_bodies(CUgraphNode node, CUgraph *bodies);
void graph_conds_atfork_prepare(void);
void graph_conds_atfork_parent(void);
void graph_conds_atfork_child(void);
void graphs_atfork_prepare(void);
void graphs_atfork_parent(void);
void graphs_atfork_child(void);

/* ---- cupti.c ---- */
void cupti_start(void);

/* ---- intercept.c ---- */
/* Note, once per (name, version), a requested family symbol that has no hook. */
void note_unhooked(const char *name, int version);
/* The first definition of `name` in the objects loaded after the shim (RTLD_LOCAL ones too),
 * or NULL: how nccl.c finds the real libnccl. */
void *shim_next(const char *name);
/* A decimal environment value: `dflt` when unset, empty or not a whole number, at most `max`. */
uint64_t shim_env_u64(const char *name, uint64_t dflt, uint64_t max);

/* ---- nccl.c ---- */
/* Our wrapper of an NCCL function `name`, or NULL when the shim does not hook that name. */
void *nccl_hook(const char *name);
/* The real function our wrapper of `name` forwards to (resolved once), or NULL. */
void *nccl_real(const char *name);

#endif
