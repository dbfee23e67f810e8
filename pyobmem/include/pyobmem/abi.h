/*
 * pyobmem ABI: the shared-memory event ring and the event records.
 *
 * This header is the one definition shared by the shim (C) and the daemon (Python):
 * pyobmem/abi.py reads it at import with cffi (enums, integer constants, struct layouts) and a
 * regex (string constants); tests/test_abi.py compiles it and checks the Python side against
 * the C compiler's view. It stays C11 and within what cffi's cdef parses: #include, #ifndef
 * guards, function-like macros and _Static_assert lines are stripped for cffi (abi.py), so
 * keep each of those on lines of its own.
 *
 * Ring protocol (bounded multi-producer queue, D. Vyukov's sequence-per-slot scheme):
 *   slot i starts with seq == i (written by whoever creates the ring).
 *   producer: pos = head; if slot[pos % cap].seq == pos, CAS head pos -> pos+1, fill the
 *             record, then store-release seq = pos + 1. If seq < pos the ring is full: the
 *             event is dropped and counted (header.dropped), the producer never waits.
 *   consumer (the daemon, single): reads slot[tail % cap] while its seq == tail + 1, then
 *             sets seq = tail + cap and tail += 1.
 * Many threads and processes (fork children, exec'd children) write one ring.
 */
#ifndef PYOBMEM_ABI_H
#define PYOBMEM_ABI_H

#include <stdint.h>

#define PYOBMEM_ABI_VERSION 2u
#define PYOBMEM_RING_MAGIC 0x474e4952424f5950ull /* "PYOBRING" little-endian */
#define PYOBMEM_RECORD_SIZE 64u
#define PYOBMEM_RING_HEADER_SIZE 4096u /* records start here; one page */

/* Environment variables read by the shim. */
#define PYOBMEM_ENV_RING "PYOBMEM_RING"       /* path of the ring file (under /dev/shm) */
#define PYOBMEM_ENV_DISABLE "PYOBMEM_DISABLE" /* "1": pure pass-through */
#define PYOBMEM_ENV_CUPTI "PYOBMEM_CUPTI"     /* unset, "" or "0": no CUPTI (the default); "1": find
                                               * libcupti; a path: that library (pyobmem-run --cupti) */
#define PYOBMEM_ENV_CONTROL "PYOBMEM_CONTROL" /* swap mode: path of the control file (below) */
#define PYOBMEM_ENV_RELEASER "PYOBMEM_RELEASER" /* swap mode: "0": no release thread (releases at ops only) */
#define PYOBMEM_ENV_SYNC_HOLD "PYOBMEM_SYNC_HOLD" /* swap mode: "0": queued swap-outs are issued while the application syncs */
#define PYOBMEM_ENV_OUT_AHEAD "PYOBMEM_OUT_AHEAD_MIB" /* swap mode: MiB of swap-outs issued to the copy engine and not done (512; 128 shortly before the latest host sync's plan position) */
#define PYOBMEM_ENV_FREE_WAIT "PYOBMEM_FREE_WAIT" /* swap mode: ms the budget waits for a pending free (500); 0: never */
#define PYOBMEM_ENV_SLOW_LOG "PYOBMEM_SLOW_LOG" /* swap mode: a file for one line per executor call (or stretch between) of at least PYOBMEM_SLOW_US */
#define PYOBMEM_ENV_SLOW_US "PYOBMEM_SLOW_US"   /* its threshold, us (1000) */
#define PYOBMEM_ENV_CACHE_HANDLES "PYOBMEM_CACHE_HANDLES" /* swap mode: "0": a map never takes a cached block's memory (for an A/B) */
#define PYOBMEM_ENV_GPU_CLOCK_EVERY "PYOBMEM_GPU_CLOCK_EVERY" /* GPU time sample every N ops (0: off; unset: 32-256, adaptive) */
#define PYOBMEM_ENV_GPU_CLOCK_POOL "PYOBMEM_GPU_CLOCK_POOL"   /* timing events per context (default 256) */
#define PYOBMEM_ENV_GPU_CLOCK_POLL_US "PYOBMEM_GPU_CLOCK_POLL_US" /* fixed poll period in µs, at most 16000 (default: adaptive, 1-16 ms) */

/* Event types (pyobmem_record.type). Each has a payload struct below, its union member in
 * struct pyobmem_record named as the type in lower case (PYOBMEM_EV_ALLOC: .alloc). */
enum pyobmem_event_type {
    PYOBMEM_EV_NONE = 0,
    PYOBMEM_EV_PROCESS = 1,      /* a traced process started (first hook) */
    PYOBMEM_EV_ALLOC = 2,        /* a block appeared; flags = device ordinal */
    PYOBMEM_EV_FREE = 3,         /* a block went away; flags = device ordinal */
    PYOBMEM_EV_LAUNCH = 4,       /* a kernel launch; flags = pyobmem_launch_flags */
    PYOBMEM_EV_ACCESS = 5,       /* blocks touched by a launch, 4 per record, after it */
    PYOBMEM_EV_MEMCPY = 6,       /* a copy; flags = pyobmem_copy_kind | PYOBMEM_COPY_ASYNC */
    PYOBMEM_EV_MEMSET = 7,       /* a memset; flags = PYOBMEM_COPY_ASYNC or 0 */
    PYOBMEM_EV_GRAPH_LAUNCH = 8, /* a CUDA graph launch */
    PYOBMEM_EV_KERNEL_NAME = 9,  /* a kernel's name, in chunks */
    PYOBMEM_EV_UNTRACKED = 10,   /* a pointer the shim never saw allocated */
    PYOBMEM_EV_NOTE = 11,        /* free text "key=value" (PYOBMEM_NOTE_* keys), in chunks */
    PYOBMEM_EV_DROPPED = 12,     /* events lost in the ring before this one (ring full) */
    PYOBMEM_EV_CAPTURE_END = 13, /* the daemon's last record of a complete capture (never the shim's) */
    PYOBMEM_EV_SWAP_OUT = 14,    /* swap mode: a block was copied to pinned host memory, released; flags = pyobmem_swap_out_cause */
    PYOBMEM_EV_SWAP_IN = 15,     /* swap mode: a block was mapped, copied back; flags = pyobmem_swap_in_cause */
    PYOBMEM_EV_PLAN = 16,        /* swap mode: a plan adopted (flags = 0) or dropped (flags = 1) */
    PYOBMEM_EV_NCCL = 17,        /* an NCCL call that names device memory; flags = pyobmem_nccl_call */
    PYOBMEM_EV_GPU_TIME = 18,    /* when an op had run on the GPU (native/gpuclock.c) */
};

enum pyobmem_nccl_call {
    PYOBMEM_NCCL_ALL_REDUCE = 1,
    PYOBMEM_NCCL_BROADCAST = 2, /* also ncclBcast (in place: send = receive) */
    PYOBMEM_NCCL_REDUCE = 3,
    PYOBMEM_NCCL_ALL_GATHER = 4,
    PYOBMEM_NCCL_REDUCE_SCATTER = 5,
    PYOBMEM_NCCL_SEND = 6,
    PYOBMEM_NCCL_RECV = 7,
    PYOBMEM_NCCL_ALL_TO_ALL = 8,
    PYOBMEM_NCCL_GATHER = 9,
    PYOBMEM_NCCL_SCATTER = 10,
    PYOBMEM_NCCL_COMM_REGISTER = 11,   /* ncclCommRegister: send = the buffer, bytes = its size */
    PYOBMEM_NCCL_WINDOW_REGISTER = 12, /* ncclCommWindowRegister: the same */
    PYOBMEM_NCCL_MEM_ALLOC = 13,       /* ncclMemAlloc: send = the new buffer, bytes = its size */
};

/* Where a process's rank came from (PROCESS rank_source): the first family of environment
 * variables present, in this order. */
enum pyobmem_rank_source {
    PYOBMEM_RANK_NONE = 0,  /* no rank: not launched as one process of a distributed job */
    PYOBMEM_RANK_TORCH = 1, /* RANK, LOCAL_RANK, WORLD_SIZE (torchrun and most PyTorch launchers) */
    PYOBMEM_RANK_OMPI = 2,  /* OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE */
    PYOBMEM_RANK_PMI = 3,   /* PMI_RANK, MPI_LOCALRANKID, PMI_SIZE (MPICH, Intel MPI) */
    PYOBMEM_RANK_SLURM = 4, /* SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS (srun) */
};

enum pyobmem_swap_in_cause {
    PYOBMEM_SWAP_IN_PREFETCH = 1, /* planned prefetch, done before the consumer needed it: a hit */
    PYOBMEM_SWAP_IN_LATE = 2,     /* planned prefetch not done when the consumer launched: its stream waits for the copy */
    PYOBMEM_SWAP_IN_DEMAND = 3,   /* safety net: an op touched a block that was out, unplanned */
};

/* Why a block went out (SWAP_OUT flags; 0 in captures before session 13: not recorded). */
enum pyobmem_swap_out_cause {
    PYOBMEM_SWAP_OUT_PLANNED = 1, /* the plan's SWAP_OUT action */
    PYOBMEM_SWAP_OUT_BUDGET = 2,  /* an eviction for the budget, beyond the plan (or before one) */
    PYOBMEM_SWAP_OUT_ROOM = 3,    /* an eviction because the device had no memory for a map */
};

enum pyobmem_alloc_kind {
    PYOBMEM_ALLOC_DRIVER = 0,  /* cuMemAlloc_v2 */
    PYOBMEM_ALLOC_PITCH = 1,   /* cuMemAllocPitch_v2 */
    PYOBMEM_ALLOC_ASYNC = 2,   /* cuMemAllocAsync / cuMemAllocFromPoolAsync */
    PYOBMEM_ALLOC_VMM = 3,     /* one cuMemMap of a physical allocation into a reserved range */
    PYOBMEM_ALLOC_MANAGED = 4, /* cuMemAllocManaged: recorded only, never swapped */
    PYOBMEM_ALLOC_HOST = 5,    /* pinned or mapped host memory (cuMemHostAlloc, cuMemAllocHost(_v2),
                                * cuMemHostRegister(_v2); also the device pointer cuMemHostGetDevicePointer
                                * gives when it differs): never swapped, not device memory */
};

enum pyobmem_launch_flags {
    PYOBMEM_LAUNCH_OPAQUE = 1u << 0,      /* touched set may be incomplete */
    PYOBMEM_LAUNCH_NO_LAYOUT = 1u << 1,   /* parameter layout unknown (implies OPAQUE) */
    PYOBMEM_LAUNCH_EX = 1u << 2,          /* cuLaunchKernelEx */
    PYOBMEM_LAUNCH_COOPERATIVE = 1u << 3, /* cuLaunchCooperativeKernel */
    PYOBMEM_LAUNCH_VIA_CUPTI = 1u << 4,   /* seen by the CUPTI callback, else by the shim hook */
    PYOBMEM_LAUNCH_TRUNCATED = 1u << 5,   /* more blocks than recorded in ACCESS records */
    PYOBMEM_LAUNCH_UNKNOWN_ADDRESS = 1u << 6, /* an argument word is an address the driver knows
                                               * (cuPointerGetAttribute, asked once per kernel and
                                               * argument offset) that is in no recorded block */
    PYOBMEM_LAUNCH_CONDITIONAL = 1u << 7, /* a graph with conditional nodes: the device picks which
                                           * bodies run; the touched set is the union of them all */
};

enum pyobmem_copy_kind {
    PYOBMEM_COPY_HTOD = 1,
    PYOBMEM_COPY_DTOH = 2,
    PYOBMEM_COPY_DTOD = 3,
    PYOBMEM_COPY_OTHER = 4, /* cuMemcpy / cuMemcpyAsync (unified), 2D/3D, peer */
};
#define PYOBMEM_COPY_ASYNC 0x100u /* or'ed into MEMCPY and MEMSET flags */

enum pyobmem_untracked_kind {
    PYOBMEM_UNTRACKED_FREE = 1,  /* free of a pointer never seen allocated */
    PYOBMEM_UNTRACKED_UNMAP = 2, /* unmap of a range never seen mapped */
};

enum pyobmem_launch_source {
    PYOBMEM_SOURCE_HOOKS = 0, /* launches attributed from the shim's own hooks */
    PYOBMEM_SOURCE_CUPTI = 1, /* launches attributed from CUPTI callbacks */
};

#define PYOBMEM_TEXT_LAST 0x8000u /* flags of the final chunk of a text (KERNEL_NAME, NOTE) */
#define PYOBMEM_TEXT_CHUNK 32u     /* text bytes per record */
#define PYOBMEM_RANK_UNKNOWN 0xFFFFFFFFu /* a rank, local rank, peer or communicator not known */
#define PYOBMEM_ACCESS_OFFSET_BITS 40
/* An access word: block id in the high 24 bits, byte offset into the block in the low 40. */
#define PYOBMEM_ACCESS_WORD(block, offset) \
    (((uint64_t)(block) << PYOBMEM_ACCESS_OFFSET_BITS) | ((uint64_t)(offset) & ((1ull << PYOBMEM_ACCESS_OFFSET_BITS) - 1)))

/* Keys of the NOTE records the shim writes ("key=value"; <i>: a device or communicator index). */
#define PYOBMEM_NOTE_DRIVER_VERSION "driver_version" /* cuDriverGetVersion */
#define PYOBMEM_NOTE_DEVICE_COUNT "device_count"
#define PYOBMEM_NOTE_DEVICE "device"                /* device<i>.name, device<i>.total_bytes, device<i>.cc */
#define PYOBMEM_NOTE_CUPTI "cupti"                  /* off, unavailable: why, active: library */
#define PYOBMEM_NOTE_UNHOOKED "unhooked"            /* a driver function the shim does not hook: name@version */
#define PYOBMEM_NOTE_UNKNOWN_ADDRESS "unknown_address" /* unknown_address.<kernel>+<offset> */
#define PYOBMEM_NOTE_GPU_CLOCK "gpu_clock"          /* every=N every_max=N pool=N samples=N skipped=N, at exit */
#define PYOBMEM_NOTE_NCCL_COMM "nccl.comm"          /* nccl.comm<i>=rank=R nranks=N device=D */
#define PYOBMEM_NOTE_SWAP "swap"                    /* on budget=B min_swap_bytes=B, or off: why */
#define PYOBMEM_NOTE_SWAP_PINNED_BYTES "swap.pinned_bytes"
#define PYOBMEM_NOTE_SWAP_MEMLOCK_LIMIT "swap.memlock_limit"

/*
 * The payload of each event type: 40 bytes, five 8-byte words, named per type. Words the type
 * does not use are 0. Fields narrower than a word share it little-endian, low half first.
 */

/* PROCESS. Written at the first hook with source = HOOKS; when the CUPTI subscription starts
 * (after cuInit) the process writes PROCESS again with source = CUPTI: the last one of a pid holds.
 * The rank is what a launcher (torchrun, mpirun, srun) gave the process in its environment. */
struct pyobmem_ev_process {
    uint64_t ppid;
    uint64_t driver_version; /* cuDriverGetVersion, 0 if unknown */
    uint64_t source;         /* pyobmem_launch_source */
    uint32_t rank;           /* PYOBMEM_RANK_UNKNOWN where unknown */
    uint32_t local_rank;     /* PYOBMEM_RANK_UNKNOWN where unknown */
    uint32_t world_size;     /* 0 if unknown */
    uint8_t rank_source;     /* pyobmem_rank_source */
    uint8_t _pad[3];
};

/* ALLOC and FREE. */
struct pyobmem_ev_block {
    uint64_t block_id;
    uint64_t addr;   /* device address */
    uint64_t size;   /* bytes */
    uint64_t stream; /* async kinds, else 0 */
    uint64_t kind;   /* pyobmem_alloc_kind */
};

/* LAUNCH. ACCESS records with the same op seq follow. */
struct pyobmem_ev_launch {
    uint64_t op;         /* op seq (per process, shared with copies, sets and graph launches) */
    uint64_t function;   /* CUfunction or CUkernel as passed */
    uint64_t stream;
    uint64_t grid;       /* thread blocks in the grid (x*y*z) */
    uint32_t n_touched;  /* blocks touched */
    uint32_t n_words;    /* 8-byte argument words scanned */
};

/* ACCESS: blocks touched by op `op`. */
struct pyobmem_ev_access {
    uint64_t op;
    uint64_t words[4]; /* access words (PYOBMEM_ACCESS_WORD), 0 = unused */
};

/* MEMCPY. */
struct pyobmem_ev_memcpy {
    uint64_t op;
    uint64_t dst;   /* access word; 0 when the side is host memory or an unknown range */
    uint64_t src;   /* the same */
    uint64_t bytes;
    uint64_t stream;
};

/* MEMSET. */
struct pyobmem_ev_memset {
    uint64_t op;
    uint64_t dst;   /* access word */
    uint64_t value;
    uint64_t bytes;
    uint64_t stream;
};

/* GRAPH_LAUNCH. ACCESS records with the same op seq follow. */
struct pyobmem_ev_graph_launch {
    uint64_t op;
    uint64_t graph_exec; /* CUgraphExec */
    uint64_t stream;
    uint64_t kernel_nodes;
    uint64_t n_touched;  /* blocks touched */
};

/* KERNEL_NAME (key = function handle) and NOTE (key = 0): one chunk of a text. flags = chunk
 * index | PYOBMEM_TEXT_LAST on the final chunk. */
struct pyobmem_ev_text {
    uint64_t key;
    uint8_t text[PYOBMEM_TEXT_CHUNK]; /* not NUL-terminated when full */
};

/* UNTRACKED. */
struct pyobmem_ev_untracked {
    uint64_t addr;
    uint64_t kind; /* pyobmem_untracked_kind */
    uint64_t _pad[3];
};

/* DROPPED. */
struct pyobmem_ev_dropped {
    uint64_t count; /* events lost in the ring before this one */
    uint64_t _pad[4];
};

/* CAPTURE_END. */
struct pyobmem_ev_capture_end {
    uint64_t dropped;    /* events dropped in the ring in total */
    int64_t exit_status; /* of the traced command; negative: killed by that signal; INT32_MIN: unknown */
    uint64_t _pad[3];
};

/* SWAP_OUT and SWAP_IN (the shim's swap executor). */
struct pyobmem_ev_swap {
    uint64_t block_id;
    uint64_t bytes;
    uint64_t duration_ns; /* of the operation when known, else 0 */
    uint64_t stream;      /* the copy ran on */
    uint64_t _pad;
};

/* PLAN: adopted (flags = 0) or dropped because the launch sequence left its template (flags = 1). */
struct pyobmem_ev_plan {
    uint64_t generation;
    uint64_t value; /* adopted: actions; dropped: position in the iteration */
    uint64_t seen;     /* dropped: the key of the op issued there (PYOBMEM_OP_KEY) */
    uint64_t expected; /* dropped: the key the template has there */
    uint64_t _pad;
};

/* NCCL (native/nccl.c), recorded after the call returned ncclSuccess or ncclInProgress. Not an
 * op: it has no op seq, and the kernels NCCL launches are recorded as launches. In swap mode the
 * named blocks are never swapped from then on. */
struct pyobmem_ev_nccl {
    uint64_t send;   /* access word of the send buffer (registration, allocation: the buffer) */
    uint64_t recv;   /* access word of the receive buffer; 0 when absent or in no known block */
    uint64_t bytes;  /* count x the datatype's size as the call counts (allgather: sent per rank,
                      * reducescatter: received per rank; 0 for an unknown datatype);
                      * registration and allocation: their size */
    uint64_t stream; /* 0 if none */
    uint32_t peer;   /* peer or root rank; PYOBMEM_RANK_UNKNOWN if none */
    uint32_t comm;   /* index of the communicator in this process (NOTE nccl.comm<i>); PYOBMEM_RANK_UNKNOWN if none */
};

/* GPU_TIME: a timing event recorded on op `op`'s stream right after it completed at GPU time
 * t_gpu, in CLOCK_MONOTONIC ns (the capture's time base, mapped through a reference event the
 * shim timed on its own idle stream); ts_ns = when the shim read it back. Written every
 * PYOBMEM_GPU_CLOCK_EVERY ops, never for an op on a capturing stream; skipped samples are counted
 * in the NOTE gpu_clock the shim writes at exit. */
struct pyobmem_ev_gpu_time {
    uint64_t op;
    uint64_t stream;  /* NULL: legacy, 0x2: per-thread default */
    int64_t t_gpu;    /* ns */
    uint64_t context;
    uint64_t _pad;
};

/* The payload as five words, for code that moves records without reading them. */
struct pyobmem_words {
    uint64_t a, b, c, d, e;
};

/* One event, 64 bytes. `seq` belongs to the ring protocol; the rest is the payload. */
struct pyobmem_record {
    uint64_t seq;
    uint16_t type;  /* pyobmem_event_type */
    uint16_t flags; /* per type */
    uint32_t pid;
    uint64_t ts_ns; /* CLOCK_MONOTONIC */
    union {
        struct pyobmem_words words;
        struct pyobmem_ev_process process;
        struct pyobmem_ev_block alloc, free;
        struct pyobmem_ev_launch launch;
        struct pyobmem_ev_access access;
        struct pyobmem_ev_memcpy memcpy;
        struct pyobmem_ev_memset memset;
        struct pyobmem_ev_graph_launch graph_launch;
        struct pyobmem_ev_text kernel_name, note;
        struct pyobmem_ev_untracked untracked;
        struct pyobmem_ev_dropped dropped;
        struct pyobmem_ev_capture_end capture_end;
        struct pyobmem_ev_swap swap_out, swap_in;
        struct pyobmem_ev_plan plan;
        struct pyobmem_ev_nccl nccl;
        struct pyobmem_ev_gpu_time gpu_time;
    };
};
_Static_assert(sizeof(struct pyobmem_record) == PYOBMEM_RECORD_SIZE, "a payload struct is over 40 bytes");

/* The first page of the ring file. Producers touch `head` and `dropped`; the daemon `tail`. */
struct pyobmem_ring_header {
    uint64_t magic;
    uint32_t abi_version;
    uint32_t record_size;
    uint64_t capacity;    /* records; a power of two */
    uint64_t creator_pid; /* the daemon */
    uint64_t _pad0[4];
    uint64_t head; /* next slot to reserve (atomic), own cache line */
    uint64_t _pad1[7];
    uint64_t tail; /* next slot the daemon reads, own cache line */
    uint64_t _pad2[7];
    uint64_t dropped; /* events lost to a full ring (atomic) */
    uint64_t _pad3[7];
};

/*
 * Swap mode: the control file (daemon -> shim), a second shared-memory file next to the ring.
 *
 * The daemon learns the iteration from the events and writes a plan: the template of one
 * iteration (one key per op, PYOBMEM_OP_KEY) and actions at positions in it. The shim follows
 * the template op by op, at launch granularity, without waiting for the daemon: on a match it
 * advances; on a mismatch it drops the plan (PLAN event, control.plan_drops += 1), brings blocks
 * back on demand only, and waits for a new generation.
 *
 * Double buffer: the daemon writes plans[1 - active], then stores active (release). It writes a
 * slot again only once the shim has adopted the plan in force (adopted == plans[active].generation)
 * or none is in force, so the shim never reads a slot being written.
 */
#define PYOBMEM_CONTROL_MAGIC 0x4c5254434f4259ull /* "YOBCTRL" */
#define PYOBMEM_PLAN_MAX_OPS 32768u
#define PYOBMEM_PLAN_MAX_ACTIONS 16384u

/* The key of an op in a plan's template: the kernel handle (CUfunction/CUkernel) for a launch,
 * the CUgraphExec for a graph launch, and for copies and sets the event type and copy kind. */
#define PYOBMEM_OP_KEY_COPY(type, kind) ((0xFFull << 56) | ((uint64_t)(type) << 16) | (uint64_t)(kind))

enum pyobmem_action_kind {
    PYOBMEM_ACT_SWAP_OUT = 1, /* after the op at `at` is issued: copy the block out, release it */
    PYOBMEM_ACT_PREFETCH = 2, /* before the op at `at` is issued: map the block and copy it in */
    PYOBMEM_ACT_MARK = 3,     /* ignored (session 4's shim waited at the PREFETCH until the GPU had
                               * run this op; the wait made the host keep step with the GPU) */
    PYOBMEM_ACT_IDLE = 4,     /* a hint, not an action: the block is idle after its access at `at`
                               * until its next access at `until`; when the shim must evict beyond
                               * the plan, it takes the block whose next access is farthest */
};

/* An action names its block by address (a block live across iterations: site_at is
 * PYOBMEM_SITE_NONE) or, for a tensor allocated inside the iteration, by its allocation site:
 * site_at, the position of the last op issued before its allocation, and site_ord, its ordinal
 * among the stream-ordered allocations of at least min_swap_bytes since that op; with `size`, the
 * site names the same tensor in every iteration. The shim binds a site to the block it serves
 * there and unbinds it at the block's free. */
#define PYOBMEM_SITE_NONE 0xFFFFFFFFu

struct pyobmem_action {
    uint32_t at;   /* position in the iteration: op index from the iteration's first op */
    uint16_t kind; /* pyobmem_action_kind */
    uint16_t until; /* IDLE: position of the next access (mod period); else 0 */
    uint64_t addr; /* the block's device address, as allocated (0 for a site) */
    uint64_t size; /* its size in bytes */
    uint32_t site_at;  /* allocation site: position, or PYOBMEM_SITE_NONE */
    uint32_t site_ord; /* allocation site: ordinal */
};

struct pyobmem_plan {
    uint64_t generation; /* > 0; increases with every new plan */
    uint32_t pid;        /* the process the plan is for */
    uint32_t period;     /* ops per iteration, <= PYOBMEM_PLAN_MAX_OPS */
    uint32_t n_actions;  /* <= PYOBMEM_PLAN_MAX_ACTIONS, sorted by `at` */
    uint32_t _pad;
    uint64_t budget_bytes; /* device bytes the plan keeps the process under */
    uint64_t template_keys[PYOBMEM_PLAN_MAX_OPS];
    struct pyobmem_action actions[PYOBMEM_PLAN_MAX_ACTIONS];
};

struct pyobmem_control {
    uint64_t magic;
    uint32_t abi_version;
    uint32_t _pad0;
    uint64_t budget_bytes; /* the run's device-memory budget (--budget); 0: none */
    uint64_t min_swap_bytes; /* blocks smaller than this are never VMM-backed nor swapped */
    uint64_t active;       /* index (0 or 1) of the plan in force; the daemon stores it (release) */
    uint64_t adopted;      /* generation the shim follows now (the shim stores it) */
    uint64_t plan_drops;   /* plans the shim dropped for a template mismatch (atomic) */
    uint64_t _pad1;
    struct pyobmem_plan plans[2];
};

#endif
