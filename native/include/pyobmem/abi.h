/*
 * pyobmem ABI: the shared-memory event ring and the event records.
 *
 * This header is the one definition shared by the shim (C) and the daemon (Python).
 * pyobmem/abi.py mirrors it as numpy dtypes; tests/test_abi.py compiles this header and
 * checks every size and offset against the Python side, so the two cannot drift.
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

#define PYOBMEM_ABI_VERSION 1u
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
#define PYOBMEM_ENV_GPU_CLOCK_EVERY "PYOBMEM_GPU_CLOCK_EVERY" /* GPU time sample every N ops (default 32; 0: off) */
#define PYOBMEM_ENV_GPU_CLOCK_POOL "PYOBMEM_GPU_CLOCK_POOL"   /* timing events per context (default 256) */

/* Event types (pyobmem_record.type). Payload words a..e per type are documented inline. */
enum pyobmem_event_type {
    PYOBMEM_EV_NONE = 0,
    /* A traced process started (first hook). a = ppid, b = driver version (cuDriverGetVersion,
     * 0 if unknown), c = launch source (pyobmem_launch_source of this process),
     * d = rank (low 32 bits) | local rank (high 32 bits), 0xFFFFFFFF where unknown,
     * e = world size (low 32 bits, 0 if unknown) | pyobmem_rank_source (bits 32..39): the rank a
     * launcher (torchrun, mpirun, srun) gave the process in its environment when the record was
     * written. The record is written at the first hook, with c = HOOKS; when the CUPTI
     * subscription starts (after cuInit) the process writes PROCESS again with c = CUPTI: the
     * last one of a pid holds. */
    PYOBMEM_EV_PROCESS = 1,
    /* A block appeared. a = block id, b = device address, c = size (bytes),
     * d = stream (async kinds, else 0), e = pyobmem_alloc_kind. flags = device ordinal. */
    PYOBMEM_EV_ALLOC = 2,
    /* A block went away. a = block id, b = address, c = size, d = stream, e = alloc kind. */
    PYOBMEM_EV_FREE = 3,
    /* A kernel launch. a = op seq (per process, shared with copies/sets/graph launches),
     * b = function handle (CUfunction or CUkernel as passed), c = stream,
     * d = thread blocks in the grid (x*y*z),
     * e = blocks touched (low 32 bits) | 8-byte argument words scanned (high 32 bits).
     * flags = pyobmem_launch_flags. ACCESS records with the same op seq follow. */
    PYOBMEM_EV_LAUNCH = 4,
    /* Blocks touched by op `a`: b..e are access words (PYOBMEM_ACCESS_WORD), 0 = unused. */
    PYOBMEM_EV_ACCESS = 5,
    /* A copy. a = op seq, b = destination access word, c = source access word (0 when the
     * side is host memory or an unknown range), d = bytes, e = stream.
     * flags = pyobmem_copy_kind | PYOBMEM_COPY_ASYNC. */
    PYOBMEM_EV_MEMCPY = 6,
    /* A memset. a = op seq, b = destination access word, c = value, d = bytes, e = stream. */
    PYOBMEM_EV_MEMSET = 7,
    /* A CUDA graph launch. a = op seq, b = CUgraphExec, c = stream, d = kernel nodes,
     * e = blocks touched. ACCESS records with the same op seq follow. */
    PYOBMEM_EV_GRAPH_LAUNCH = 8,
    /* Name of a kernel: a = function handle, b..e = 32 bytes of text.
     * flags = chunk index | PYOBMEM_TEXT_LAST on the final chunk. */
    PYOBMEM_EV_KERNEL_NAME = 9,
    /* A pointer the shim never saw allocated: a = address, b = pyobmem_untracked_kind. */
    PYOBMEM_EV_UNTRACKED = 10,
    /* Free text "key=value" (environment, status): a = 0, b..e = text chunk, flags as names. */
    PYOBMEM_EV_NOTE = 11,
    /* Events lost in the ring before this one (ring full): a = count. */
    PYOBMEM_EV_DROPPED = 12,
    /* Written by the daemon as the last record of a complete capture (never by the shim):
     * a = events dropped in the ring in total, b = exit status of the traced command
     * (negative: killed by that signal). */
    PYOBMEM_EV_CAPTURE_END = 13,
    /* Swap mode (the shim's swap executor). a = block id, b = bytes, c = duration of the
     * operation in ns when known (0 otherwise), d = stream the copy ran on.
     * SWAP_OUT: the block was copied to pinned host memory and its device memory released.
     * SWAP_IN: the block was mapped and copied back; flags = pyobmem_swap_in_cause. */
    PYOBMEM_EV_SWAP_OUT = 14,
    PYOBMEM_EV_SWAP_IN = 15,
    /* A plan was adopted (a = plan generation, b = actions) or dropped because the launch
     * sequence left the plan's template (a = generation, b = position in the iteration,
     * flags = 1). */
    PYOBMEM_EV_PLAN = 16,
    /* An NCCL call that names device memory (native/nccl.c), recorded after it returned
     * ncclSuccess or ncclInProgress. flags = pyobmem_nccl_call. a = access word of the send
     * buffer (registration, allocation: the buffer), b = access word of the receive buffer
     * (0 when the side is absent or in no known block), c = bytes: count x the datatype's size
     * as the call counts (allgather: sent per rank, reducescatter: received per rank; 0 for an
     * unknown datatype); registration and allocation: their size, d = stream (0 if none),
     * e = peer or root rank (low 32 bits, 0xFFFFFFFF if none) | index of the communicator in
     * this process (high 32 bits, NOTE nccl.comm<index>; 0xFFFFFFFF if none). Not an op: it
     * has no op seq, and the kernels NCCL launches are recorded as launches. In swap mode the
     * named blocks are never swapped from then on. */
    PYOBMEM_EV_NCCL = 17,
    /* When op `a` had run on the GPU (native/gpuclock.c): a timing event recorded on the op's
     * stream right after it completed at GPU time c, in CLOCK_MONOTONIC ns (the capture's time
     * base, mapped through a reference event the shim timed on its own idle stream).
     * a = op seq, b = stream (NULL: legacy, 0x2: per-thread default), c = GPU time ns,
     * d = context. ts_ns = when the shim read it back. Written every PYOBMEM_GPU_CLOCK_EVERY
     * ops, never for an op on a capturing stream; skipped samples are counted in the NOTE
     * gpu_clock=... the shim writes at exit. */
    PYOBMEM_EV_GPU_TIME = 18,
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
    PYOBMEM_NCCL_COMM_REGISTER = 11,   /* ncclCommRegister: a = the buffer, c = its size */
    PYOBMEM_NCCL_WINDOW_REGISTER = 12, /* ncclCommWindowRegister: the same */
    PYOBMEM_NCCL_MEM_ALLOC = 13,       /* ncclMemAlloc: a = the new buffer, c = its size */
};

/* Where a process's rank came from (PROCESS e, bits 32..39): the first family of environment
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
    PYOBMEM_SWAP_IN_LATE = 2,     /* planned prefetch not done when the consumer launched: stall */
    PYOBMEM_SWAP_IN_DEMAND = 3,   /* safety net: an op touched a block that was out, unplanned */
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
};

enum pyobmem_copy_kind {
    PYOBMEM_COPY_HTOD = 1,
    PYOBMEM_COPY_DTOH = 2,
    PYOBMEM_COPY_DTOD = 3,
    PYOBMEM_COPY_OTHER = 4, /* cuMemcpy / cuMemcpyAsync (unified), 2D/3D, peer */
    PYOBMEM_COPY_ASYNC = 0x100,
};

enum pyobmem_untracked_kind {
    PYOBMEM_UNTRACKED_FREE = 1,  /* free of a pointer never seen allocated */
    PYOBMEM_UNTRACKED_UNMAP = 2, /* unmap of a range never seen mapped */
};

enum pyobmem_launch_source {
    PYOBMEM_SOURCE_HOOKS = 0, /* launches attributed from the shim's own hooks */
    PYOBMEM_SOURCE_CUPTI = 1, /* launches attributed from CUPTI callbacks */
};

#define PYOBMEM_TEXT_LAST 0x8000u
#define PYOBMEM_ACCESS_OFFSET_BITS 40
/* An access word: block id in the high 24 bits, byte offset into the block in the low 40. */
#define PYOBMEM_ACCESS_WORD(block, offset) \
    (((uint64_t)(block) << PYOBMEM_ACCESS_OFFSET_BITS) | ((uint64_t)(offset) & ((1ull << PYOBMEM_ACCESS_OFFSET_BITS) - 1)))

/* One event, 64 bytes. `seq` belongs to the ring protocol; the rest is the payload. */
struct pyobmem_record {
    uint64_t seq;
    uint16_t type;  /* pyobmem_event_type */
    uint16_t flags; /* per type */
    uint32_t pid;
    uint64_t ts_ns; /* CLOCK_MONOTONIC */
    uint64_t a, b, c, d, e;
};

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
    PYOBMEM_ACT_PREFETCH = 2, /* before the op at `at` is issued: map the block and copy it in
                               * (first waiting until the GPU has run the block's MARK op) */
    PYOBMEM_ACT_MARK = 3,     /* after the op at `at` is issued: record the block's mark event on
                               * its stream; the next PREFETCH of the block waits for it, so that
                               * a host running ahead of the GPU does not map the memory early */
    PYOBMEM_ACT_IDLE = 4,     /* a hint, not an action: the block is idle after its access at `at`
                               * until its next access at `until`; when the shim must evict beyond
                               * the plan, it takes the block whose next access is farthest */
};

struct pyobmem_action {
    uint32_t at;   /* position in the iteration: op index from the iteration's first op */
    uint16_t kind; /* pyobmem_action_kind */
    uint16_t until; /* IDLE: position of the next access (mod period); else 0 */
    uint64_t addr; /* the block's device address, as allocated */
    uint64_t size; /* its size in bytes */
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
