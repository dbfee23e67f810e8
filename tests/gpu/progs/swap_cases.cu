// Swap-mode test programs (tests/gpu/test_swap_*.py): one binary, one case per argv[1].
//
//   swap_cases roundtrip [ROUNDS] [async]  4 blocks touched in turn ROUNDS times (default 20);
//                                          async: cudaMallocAsync blocks (the shim serves them)
//   swap_cases c08 struct|split     a block reached only through a device-side struct / a split pointer
//   swap_cases c09                  blocks reached only through a pointer table copied by H2D
//   swap_cases c10                  a captured graph touching 2 of 6 blocks, replayed between direct touches
//   swap_cases c10u                 a captured one-kernel graph retargeted in the executable graph
//                                   (cudaGraphExecKernelNodeSetParams) to block r % 4 at replay r
//   swap_cases c26                  an IF node (cudaGraphAddNode) whose body steps blocks 0 and 1, replayed
//                                   between direct touches of the four others
//   swap_cases c11                  stream captures (global mode) while the shim swaps, same and other thread
//   swap_cases c14                  2000 cudaMallocAsync / pool allocations next to swap blocks
//   swap_cases c16                  a spinning kernel on one stream while blocks swap on another
//   swap_cases c17                  app VMM mappings, host-mapped and host-located memory next to swap blocks
//   swap_cases c18                  a managed allocation next to swap blocks
//   swap_cases lowbudget [SECS]     an iteration whose first kernel needs 3 blocks of 64 MiB at once
//
// Blocks are 64 MiB cudaMalloc allocations (the shim VMM-backs cuMemAlloc_v2 blocks of at least
// --min-swap-bytes, default 4 MiB). Each block i holds pat(i, word, round): a kernel moves it one
// round forward and counts the words that did not hold the previous round (errors in device memory,
// an 8-byte allocation the shim never swaps); at the end the host copies every block back and checks
// every word. Everything is printed as "@ key=value" lines (gpu_util.parse_kv); t_* keys are
// CLOCK_MONOTONIC ns, the capture's clock. Exit 0 when every check passed, 1 when a check failed,
// 2 when a CUDA call failed (its name and code are printed as @ failed / @ failed_rc).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>
#include <vector>
#include <unistd.h>
#include <cuda_runtime.h>
#include "drv_common.h"

#define RK(call)                                                                                            \
    do {                                                                                                    \
        cudaError_t e_ = (call);                                                                            \
        if (e_ != cudaSuccess) {                                                                            \
            printf("@ failed=%s:%d\n@ failed_rc=%d\n", __FILE__, __LINE__, (int)e_);                        \
            fprintf(stderr, "%s:%d: %s -> %s (%s)\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_),      \
                    cudaGetErrorString(e_));                                                                \
            fflush(stdout);                                                                                 \
            exit(2);                                                                                        \
        }                                                                                                   \
    } while (0)

static const size_t MIB = (size_t)1 << 20;
static const size_t BLOCK_BYTES = 64 * MIB;
static const int GRID = 1024, THREADS = 256;

static uint64_t now_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__host__ __device__ static inline uint32_t pat(uint32_t blk, uint64_t j, uint32_t r)
{
    uint64_t x = j * 0x9E3779B97F4A7C15ull + ((uint64_t)blk << 40) + (uint64_t)r * 0xD1B54A32D192ED03ull + 1;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint32_t)(x >> 16);
}

// ---------------------------------------------------------------------------- kernels

__device__ static void step_body(uint32_t *p, size_t n, uint32_t blk, uint32_t r, unsigned long long *err)
{
    unsigned long long bad = 0;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x) {
        if (p[j] != pat(blk, j, r))
            bad++;
        p[j] = pat(blk, j, r + 1);
    }
    if (bad)
        atomicAdd(err, bad);
}

extern "C" __global__ void fill(uint32_t *p, size_t n, uint32_t blk, uint32_t r)
{
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        p[j] = pat(blk, j, r);
}

// Checks round r, writes round r + 1.
extern "C" __global__ void step(uint32_t *p, size_t n, uint32_t blk, uint32_t r, unsigned long long *err)
{
    step_body(p, n, blk, r, err);
}

// Read only: counts the words that do not hold round r.
extern "C" __global__ void check(const uint32_t *p, size_t n, uint32_t blk, uint32_t r, unsigned long long *err)
{
    unsigned long long bad = 0;
    for (size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x; j < n; j += (size_t)gridDim.x * blockDim.x)
        if (p[j] != pat(blk, j, r))
            bad++;
    if (bad)
        atomicAdd(err, bad);
}

// Three blocks at once (lowbudget): each at the same round.
extern "C" __global__ void step3(uint32_t *a, uint32_t *b, uint32_t *c, size_t n, uint32_t r, unsigned long long *err)
{
    step_body(a, n, 0, r, err);
    step_body(b, n, 1, r, err);
    step_body(c, n, 2, r, err);
}

// C10: the round comes from device memory, so one captured graph serves every replay.
extern "C" __global__ void step_dev(uint32_t *p, size_t n, uint32_t blk, const uint32_t *round, unsigned long long *err)
{
    step_body(p, n, blk, *round, err);
}

extern "C" __global__ void bump(uint32_t *round)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        (*round)++;
}

// C08: the block is named only inside a struct in device memory (NCCL's work struct) ...
struct Work {
    uint32_t *buf;
    size_t n;
    uint32_t blk;
};

extern "C" __global__ void set_work(Work *w, uint32_t *buf, size_t n, uint32_t blk)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        w->buf = buf;
        w->n = n;
        w->blk = blk;
    }
}

extern "C" __global__ void work_struct(const Work *w, uint32_t r, unsigned long long *err)
{
    step_body(w->buf, w->n, w->blk, r, err);
}

// ... or split into two 32-bit halves in separate parameters, next to a small integer in a
// pointer-sized slot (tag = 3) that must not be taken for a pointer.
extern "C" __global__ void work_split(uint32_t lo, uint32_t blk, uint32_t hi, uint32_t r, const void *tag, size_t n,
                                      unsigned long long *err)
{
    if (tag != (const void *)3) {
        if (blockIdx.x == 0 && threadIdx.x == 0)
            atomicAdd(err, 1ull);
        return;
    }
    step_body((uint32_t *)(((uint64_t)hi << 32) | lo), n, blk, r, err);
}

// C09: every block of a pointer table (written by a host-to-device copy), all at round r.
extern "C" __global__ void table_step(uint32_t *const *table, uint32_t nt, size_t n, uint32_t r, unsigned long long *err)
{
    for (uint32_t i = 0; i < nt; i++)
        step_body(table[i], n, i, r, err);
}

// C16: spins until f[0] != 0 (host-mapped memory), at most timeout_ns. f[1] = started,
// f[2] = finished, f[3] = timed out.
__device__ static inline unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void spin(volatile int *f, unsigned long long timeout_ns)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    f[1] = 1;
    __threadfence_system();
    unsigned long long t0 = gtime();
    while (f[0] == 0) {
        if (gtime() - t0 > timeout_ns) {
            f[3] = 1;
            break;
        }
        __nanosleep(1000);
    }
    f[2] = 1;
    __threadfence_system();
}

// ---------------------------------------------------------------------------- host side

// The blocks of a case: device pointer, pattern id, current round, and how to free it.
enum FreeKind { FREE_RT, FREE_ASYNC, FREE_NONE };

struct Blocks {
    cudaStream_t s = nullptr;
    unsigned long long *err = nullptr; // 8 bytes: far under any --min-swap-bytes
    std::vector<uint32_t *> p;
    std::vector<uint32_t> round;
    std::vector<size_t> bytes;
    std::vector<FreeKind> how;
    std::vector<char> copyback; // checked by copying it back at the end (else checked elsewhere)
    uint32_t *host = nullptr;
    size_t host_bytes = 0;

    void init()
    {
        RK(cudaSetDevice(0));
        RK(cudaFree(0));
        RK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        RK(cudaMalloc((void **)&err, sizeof *err));
        RK(cudaMemset(err, 0, sizeof *err));
    }

    // A block of `b` bytes allocated by cudaMalloc, printed as "@ NAME=ptr".
    int alloc(const char *name, size_t b = BLOCK_BYTES)
    {
        uint32_t *q = nullptr;
        RK(cudaMalloc((void **)&q, b));
        return adopt(name, q, b, FREE_RT);
    }

    // A stream-ordered block of `b` bytes (cudaMallocAsync on s, freed with cudaFreeAsync on s).
    int alloc_async(const char *name, size_t b = BLOCK_BYTES)
    {
        uint32_t *q = nullptr;
        RK(cudaMallocAsync((void **)&q, b, s));
        return adopt(name, q, b, FREE_ASYNC);
    }

    // A block allocated elsewhere (managed, app VMM, host-mapped).
    int adopt(const char *name, void *q, size_t b, FreeKind k, bool copy_back = true)
    {
        p.push_back((uint32_t *)q);
        round.push_back(0);
        bytes.push_back(b);
        how.push_back(k);
        copyback.push_back(copy_back);
        printf("@ %s=%p\n", name, q);
        return (int)p.size() - 1;
    }

    size_t n(int i) const { return bytes[i] / sizeof(uint32_t); }

    void fill_one(int i, bool sync = true)
    {
        fill<<<GRID, THREADS, 0, s>>>(p[i], n(i), (uint32_t)i, round[i]);
        RK(cudaGetLastError());
        if (sync)
            RK(cudaStreamSynchronize(s));
    }

    void fill_all()
    {
        for (size_t i = 0; i < p.size(); i++)
            fill_one((int)i);
    }

    // One round forward on stream st (default: s), then synchronise that stream.
    void touch(int i, bool sync = true, cudaStream_t st = nullptr)
    {
        cudaStream_t use = st ? st : s;
        step<<<GRID, THREADS, 0, use>>>(p[i], n(i), (uint32_t)i, round[i], err);
        RK(cudaGetLastError());
        round[i]++;
        if (sync)
            RK(cudaStreamSynchronize(use));
    }

    // Copy every block back (cudaMemcpy DeviceToHost) and count the words that are wrong.
    unsigned long long host_check()
    {
        unsigned long long bad = 0;
        RK(cudaDeviceSynchronize());
        for (size_t i = 0; i < p.size(); i++) {
            if (!copyback[i])
                continue;
            if (bytes[i] > host_bytes) {
                free(host);
                host = (uint32_t *)malloc(bytes[i]);
                host_bytes = bytes[i];
                if (!host)
                    DIE("malloc %zu failed", bytes[i]);
            }
            RK(cudaMemcpy(host, p[i], bytes[i], cudaMemcpyDeviceToHost));
            unsigned long long b = 0;
            for (size_t j = 0; j < n((int)i); j++)
                b += host[j] != pat((uint32_t)i, j, round[i]);
            printf("@ host_bad_%zu=%llu\n@ round_%zu=%u\n", i, b, i, round[i]);
            bad += b;
        }
        return bad;
    }

    // A 64 MiB block allocated, written, checked and freed: its allocation makes the shim evict
    // (least recently used first) even when every other block is resident.
    void scratch(uint32_t r)
    {
        uint32_t *x = nullptr;
        RK(cudaMalloc((void **)&x, BLOCK_BYTES));
        fill<<<GRID, THREADS, 0, s>>>(x, BLOCK_BYTES / 4, 99, r);
        check<<<GRID, THREADS, 0, s>>>(x, BLOCK_BYTES / 4, 99, r, err);
        RK(cudaGetLastError());
        RK(cudaStreamSynchronize(s));
        RK(cudaFree(x));
    }

    unsigned long long dev_errors()
    {
        unsigned long long e = 0;
        RK(cudaMemcpy(&e, err, sizeof e, cudaMemcpyDeviceToHost));
        return e;
    }

    // The common end: checks printed, blocks freed; the exit code.
    int finish(unsigned long long extra_bad = 0)
    {
        unsigned long long hb = host_check();
        unsigned long long de = dev_errors();
        printf("@ host_bad=%llu\n@ dev_errors=%llu\n", hb, de);
        for (size_t i = 0; i < p.size(); i++)
            if (how[i] == FREE_RT)
                RK(cudaFree(p[i]));
            else if (how[i] == FREE_ASYNC)
                RK(cudaFreeAsync(p[i], s));
        RK(cudaStreamSynchronize(s));
        RK(cudaFree(err));
        RK(cudaStreamDestroy(s));
        RK(cudaDeviceSynchronize());
        free(host);
        printf("@ done=1\n");
        return (hb || de || extra_bad) ? 1 : 0;
    }
};

static void print_common(const Blocks &b)
{
    printf("@ pid=%d\n@ block_bytes=%zu\n@ blocks=%zu\n", (int)getpid(), BLOCK_BYTES, b.p.size());
}

// ---------------------------------------------------------------------------- cases

static int case_roundtrip(int rounds, bool ordered)
{
    Blocks b;
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3"};
    for (int i = 0; i < 4; i++)
        ordered ? b.alloc_async(names[i]) : b.alloc(names[i]);
    printf("@ ordered=%d\n", (int)ordered);
    print_common(b);
    b.fill_all();
    printf("@ t_loop_start=%llu\n", (unsigned long long)now_ns());
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 4; i++)
            b.touch(i);
    printf("@ t_loop_end=%llu\n@ rounds=%d\n@ touches=%d\n", (unsigned long long)now_ns(), rounds, rounds * 4);
    return b.finish();
}

static int case_c08(const char *variant, int rounds)
{
    bool split = strcmp(variant, "split") == 0;
    if (!split && strcmp(variant, "struct") != 0)
        DIE("c08: variant must be struct or split");
    Blocks b;
    b.init();
    int hidden = b.alloc("hidden"); // block 0: reached only through the struct / the split pointer
    const char *names[] = {"blk1", "blk2", "blk3", "blk4"};
    for (int i = 0; i < 4; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all();
    Work *w = nullptr;
    if (!split) {
        RK(cudaMalloc((void **)&w, 256));
        printf("@ work=%p\n", (void *)w);
        set_work<<<1, 1, 0, b.s>>>(w, b.p[hidden], b.n(hidden), (uint32_t)hidden);
        RK(cudaGetLastError());
        RK(cudaStreamSynchronize(b.s));
    }
    uint64_t a = (uint64_t)(uintptr_t)b.p[hidden];
    for (int r = 0; r < rounds; r++) {
        // The other four blocks are touched after the hidden one: under a budget of two blocks
        // each of these touches brings its block back and evicts the least recently used one, so
        // the hidden block is out by the time of the hidden launch, unless the shim keeps it
        // (the scratch allocation first makes room even when a launch brought everything back).
        b.scratch((uint32_t)r);
        for (int i = 1; i <= 4; i++)
            b.touch(i);
        if (split)
            work_split<<<GRID, THREADS, 0, b.s>>>((uint32_t)a, (uint32_t)hidden, (uint32_t)(a >> 32),
                                                  b.round[hidden], (const void *)3, b.n(hidden), b.err);
        else
            work_struct<<<GRID, THREADS, 0, b.s>>>(w, b.round[hidden], b.err);
        RK(cudaGetLastError());
        b.round[hidden]++;
        RK(cudaStreamSynchronize(b.s));
    }
    printf("@ variant=%s\n@ hidden_launches=%d\n", variant, rounds);
    int rc = b.finish();
    if (w)
        RK(cudaFree(w));
    return rc;
}

static int case_c09(int rounds)
{
    Blocks b;
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3", "blk4"};
    for (int i = 0; i < 5; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all();
    uint32_t **table = nullptr; // blocks 0..3; block 4 is only ever named directly
    RK(cudaMalloc((void **)&table, 4096));
    uint32_t *h[4] = {b.p[0], b.p[1], b.p[2], b.p[3]};
    RK(cudaMemcpy(table, h, sizeof h, cudaMemcpyHostToDevice));
    printf("@ table=%p\n", (void *)table);
    for (int r = 0; r < rounds; r++) {
        b.scratch((uint32_t)r); // makes room even when the last table launch brought everything back
        for (int i = 0; i < 4; i++)
            b.touch(i); // all four at the same round
        b.touch(4);     // brought back: evicts the least recently used table blocks
        table_step<<<GRID, THREADS, 0, b.s>>>(table, 4, b.n(0), b.round[0], b.err);
        RK(cudaGetLastError());
        for (int i = 0; i < 4; i++)
            b.round[i]++;
        RK(cudaStreamSynchronize(b.s));
    }
    printf("@ table_launches=%d\n", rounds);
    int rc = b.finish();
    RK(cudaFree(table));
    return rc;
}

// Six 64 MiB blocks (blk0..blk5), filled: the graph cases' set-up.
static void six_blocks(Blocks &b)
{
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3", "blk4", "blk5"};
    for (int i = 0; i < 6; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all();
}

// Replays ge, which moves blocks 0 and 1 one round forward, with the four others touched after
// each: under a two-block budget both are out before every replay after the first.
static void replay_between_touches(Blocks &b, cudaGraphExec_t ge, int replays)
{
    for (int r = 0; r < replays; r++) {
        RK(cudaGraphLaunch(ge, b.s));
        RK(cudaStreamSynchronize(b.s));
        b.round[0]++;
        b.round[1]++;
        for (int i = 2; i < 6; i++)
            b.touch(i);
    }
    printf("@ graph_launches=%d\n", replays);
}

static int case_c10(int replays)
{
    Blocks b;
    six_blocks(b);
    uint32_t *d_round = nullptr;
    RK(cudaMalloc((void **)&d_round, sizeof *d_round));
    RK(cudaMemset(d_round, 0, sizeof *d_round));
    RK(cudaDeviceSynchronize());
    // Capture: blocks 0 and 1 one round forward, then the round counter.
    cudaGraph_t g;
    cudaGraphExec_t ge;
    RK(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeGlobal));
    step_dev<<<GRID, THREADS, 0, b.s>>>(b.p[0], b.n(0), 0, d_round, b.err);
    step_dev<<<GRID, THREADS, 0, b.s>>>(b.p[1], b.n(1), 1, d_round, b.err);
    bump<<<1, 1, 0, b.s>>>(d_round);
    RK(cudaStreamEndCapture(b.s, &g));
    RK(cudaGraphInstantiate(&ge, g, 0));
    printf("@ graph_exec=%p\n@ t_graph_ready=%llu\n", (void *)ge, (unsigned long long)now_ns());
    replay_between_touches(b, ge, replays);
    RK(cudaGraphExecDestroy(ge));
    RK(cudaGraphDestroy(g));
    int rc = b.finish();
    RK(cudaFree(d_round));
    return rc;
}

// C10 with node updates (XLA's command buffers): the graph is captured naming block 0; before
// replay r its kernel node is set, in the executable graph, to step block r % 4 at its round.
// Blocks 4 and 5 are touched after every replay, so under a two-block budget the next replay's
// block is out when its parameters are set.
static int case_c10u(int replays)
{
    Blocks b;
    six_blocks(b);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    RK(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeGlobal));
    step<<<GRID, THREADS, 0, b.s>>>(b.p[0], b.n(0), 0, b.round[0], b.err);
    RK(cudaStreamEndCapture(b.s, &g));
    RK(cudaGraphInstantiate(&ge, g, 0));
    cudaGraphNode_t node;
    size_t n_nodes = 1;
    RK(cudaGraphGetNodes(g, &node, &n_nodes));
    cudaKernelNodeParams kp;
    RK(cudaGraphKernelNodeGetParams(node, &kp));
    printf("@ graph_exec=%p\n", (void *)ge);
    for (int r = 0; r < replays; r++) {
        int k = r % 4;
        uint32_t *p = b.p[k];
        size_t n = b.n(k);
        uint32_t blk = (uint32_t)k, round = b.round[k];
        unsigned long long *err = b.err;
        void *args[] = {&p, &n, &blk, &round, &err};
        kp.kernelParams = args;
        RK(cudaGraphExecKernelNodeSetParams(ge, node, &kp));
        printf("@ t_replay_%d=%llu\n@ target_%d=%d\n", r, (unsigned long long)now_ns(), r, k);
        RK(cudaGraphLaunch(ge, b.s));
        RK(cudaStreamSynchronize(b.s));
        b.round[k]++;
        b.touch(4);
        b.touch(5);
    }
    printf("@ graph_launches=%d\n", replays);
    RK(cudaGraphExecDestroy(ge));
    RK(cudaGraphDestroy(g));
    return b.finish();
}

// C26: a graph of one conditional IF node (default value 1: the body runs at every launch) whose
// body, captured into the node's body graph, moves blocks 0 and 1 one round forward; as in c10 the
// four other blocks are touched between replays, so under a two-block budget both body blocks are
// out before every replay after the first.
static int case_c26(int replays)
{
    Blocks b;
    six_blocks(b);
    uint32_t *d_round = nullptr;
    RK(cudaMalloc((void **)&d_round, sizeof *d_round));
    RK(cudaMemset(d_round, 0, sizeof *d_round));
    RK(cudaDeviceSynchronize());
    cudaGraph_t g;
    RK(cudaGraphCreate(&g, 0));
    cudaGraphConditionalHandle h;
    RK(cudaGraphConditionalHandleCreate(&h, g, 1, cudaGraphCondAssignDefault));
    cudaGraphNodeParams cp = {};
    cp.type = cudaGraphNodeTypeConditional;
    cp.conditional.handle = h;
    cp.conditional.type = cudaGraphCondTypeIf;
    cp.conditional.size = 1;
    cudaGraphNode_t cn;
    RK(cudaGraphAddNode(&cn, g, nullptr, nullptr, 0, &cp));
    cudaGraph_t body = cp.conditional.phGraph_out[0];
    RK(cudaStreamBeginCaptureToGraph(b.s, body, nullptr, nullptr, 0, cudaStreamCaptureModeGlobal));
    step_dev<<<GRID, THREADS, 0, b.s>>>(b.p[0], b.n(0), 0, d_round, b.err);
    step_dev<<<GRID, THREADS, 0, b.s>>>(b.p[1], b.n(1), 1, d_round, b.err);
    bump<<<1, 1, 0, b.s>>>(d_round);
    cudaGraph_t captured;
    RK(cudaStreamEndCapture(b.s, &captured));
    cudaGraphExec_t ge;
    RK(cudaGraphInstantiate(&ge, g, 0));
    printf("@ graph_exec=%p\n", (void *)ge);
    replay_between_touches(b, ge, replays);
    RK(cudaGraphExecDestroy(ge));
    RK(cudaGraphDestroy(g));
    int rc = b.finish();
    RK(cudaFree(d_round));
    return rc;
}

// Waits (at most 10 s) until flag is set; returns 0 on time-out.
static int wait_flag(std::atomic<int> &flag)
{
    for (int i = 0; i < 10000; i++) {
        if (flag.load())
            return 1;
        usleep(1000);
    }
    return 0;
}

static int case_c11()
{
    Blocks b;
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3", "blk4"};
    for (int i = 0; i < 5; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all(); // in order: under a two-block budget 0, 1, 2 end up out
    cudaStream_t s1, s2;
    RK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    RK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    unsigned long long extra_bad = 0;

    // 1. This thread captures (global mode) launches on blocks that are out.
    cudaGraph_t g1 = nullptr;
    printf("@ t_c1_begin=%llu\n", (unsigned long long)now_ns());
    RK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    step<<<GRID, THREADS, 0, s1>>>(b.p[0], b.n(0), 0, b.round[0], b.err);
    cudaError_t l1 = cudaGetLastError();
    step<<<GRID, THREADS, 0, s1>>>(b.p[1], b.n(1), 1, b.round[1], b.err);
    cudaError_t l2 = cudaGetLastError();
    cudaError_t rc1 = cudaStreamEndCapture(s1, &g1);
    printf("@ t_c1_end=%llu\n", (unsigned long long)now_ns());
    printf("@ capture1_launch_rc=%d\n@ capture1_rc=%d\n", (int)(l1 != cudaSuccess ? l1 : l2), (int)rc1);
    if (rc1 == cudaSuccess && l1 == cudaSuccess && l2 == cudaSuccess) {
        cudaGraphExec_t e1;
        RK(cudaGraphInstantiate(&e1, g1, 0));
        RK(cudaGraphLaunch(e1, s1));
        RK(cudaStreamSynchronize(s1));
        b.round[0]++;
        b.round[1]++;
        RK(cudaGraphExecDestroy(e1));
    } else {
        extra_bad++;
        (void)cudaGetLastError();
    }
    if (g1)
        RK(cudaGraphDestroy(g1));

    // 2. While this thread's global-mode capture is open, another thread launches on blocks that
    //    are out on a stream of its own (no synchronisation there: the app keeps to what a capture
    //    in another thread allows); the shim swaps for those launches.
    std::atomic<int> go{0}, done{0}, u_err{0};
    std::thread u([&] {
        if (!wait_flag(go)) {
            u_err = -1;
            done = 1;
            return;
        }
        for (int i = 2; i < 5; i++) {
            step<<<GRID, THREADS, 0, s2>>>(b.p[i], b.n(i), (uint32_t)i, b.round[i], b.err);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess && !u_err)
                u_err = (int)e;
        }
        done = 1;
    });
    cudaGraph_t g2 = nullptr;
    printf("@ t_c2_begin=%llu\n", (unsigned long long)now_ns());
    RK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
    go = 1;
    int waited = wait_flag(done);
    step<<<GRID, THREADS, 0, s1>>>(b.p[0], b.n(0), 0, b.round[0], b.err);
    cudaError_t l3 = cudaGetLastError();
    step<<<GRID, THREADS, 0, s1>>>(b.p[1], b.n(1), 1, b.round[1], b.err);
    cudaError_t l4 = cudaGetLastError();
    cudaError_t rc2 = cudaStreamEndCapture(s1, &g2);
    printf("@ t_c2_end=%llu\n", (unsigned long long)now_ns());
    u.join();
    printf("@ other_thread_done=%d\n@ other_thread_rc=%d\n", waited, u_err.load());
    printf("@ capture2_launch_rc=%d\n@ capture2_rc=%d\n", (int)(l3 != cudaSuccess ? l3 : l4), (int)rc2);
    RK(cudaStreamSynchronize(s2));
    if (u_err == 0 && waited)
        for (int i = 2; i < 5; i++)
            b.round[i]++;
    else
        extra_bad++;
    if (rc2 == cudaSuccess && l3 == cudaSuccess && l4 == cudaSuccess) {
        cudaGraphExec_t e2;
        RK(cudaGraphInstantiate(&e2, g2, 0));
        RK(cudaGraphLaunch(e2, s1));
        RK(cudaStreamSynchronize(s1));
        b.round[0]++;
        b.round[1]++;
        RK(cudaGraphExecDestroy(e2));
    } else {
        extra_bad++;
        (void)cudaGetLastError();
    }
    if (g2)
        RK(cudaGraphDestroy(g2));
    RK(cudaStreamDestroy(s1));
    RK(cudaStreamDestroy(s2));
    return b.finish(extra_bad);
}

static int case_c14(int cycles)
{
    Blocks b;
    b.init();
    b.alloc("blk0");
    b.alloc("blk1");
    print_common(b);
    b.fill_all();
    cudaMemPool_t pool;
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    RK(cudaMemPoolCreate(&pool, &props));
    int fails = 0, first_fail_rc = 0, from_pool = 0, from_default = 0;
    unsigned long long bytes_total = 0;
    for (int c = 0; c < cycles; c++) {
        size_t size = (size_t)((c % 16) + 1) * MIB + (size_t)(c % 7) * 4096;
        void *q = nullptr;
        cudaError_t e;
        if (c % 3 == 2) {
            e = cudaMallocFromPoolAsync(&q, size, pool, b.s);
            from_pool += e == cudaSuccess;
        } else {
            e = cudaMallocAsync(&q, size, b.s);
            from_default += e == cudaSuccess;
        }
        if (e != cudaSuccess) {
            if (!fails)
                first_fail_rc = (int)e;
            fails++;
            (void)cudaGetLastError();
            continue;
        }
        bytes_total += size;
        uint32_t id = 100 + (uint32_t)(c % 50);
        size_t words = size / sizeof(uint32_t);
        fill<<<64, THREADS, 0, b.s>>>((uint32_t *)q, words, id, (uint32_t)c);
        check<<<64, THREADS, 0, b.s>>>((const uint32_t *)q, words, id, (uint32_t)c, b.err);
        RK(cudaGetLastError());
        RK(cudaFreeAsync(q, b.s));
        if (c % 100 == 99)
            b.touch((c / 100) % 2); // the two swap blocks take turns under a one-block budget
    }
    RK(cudaStreamSynchronize(b.s));
    printf("@ cycles=%d\n@ async_fail=%d\n@ async_first_fail_rc=%d\n@ async_from_pool=%d\n@ async_from_default=%d\n",
           cycles, fails, first_fail_rc, from_pool, from_default);
    printf("@ async_bytes_total=%llu\n", bytes_total);
    int rc = b.finish(fails);
    RK(cudaMemPoolDestroy(pool));
    return rc;
}

static int case_c16(int rounds)
{
    Blocks b;
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3"};
    for (int i = 0; i < 4; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all();
    for (int i = 0; i < 4; i++)
        b.touch(i); // every kernel loaded (lazy loading) before the spinner runs
    volatile int *hf = nullptr;
    RK(cudaHostAlloc((void **)&hf, 64, cudaHostAllocMapped));
    memset((void *)hf, 0, 64);
    int *df = nullptr;
    RK(cudaHostGetDevicePointer((void **)&df, (void *)hf, 0));
    cudaStream_t s1;
    RK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    const unsigned long long timeout_ns = 8000000000ull;
    // A 1-block spinner also loads `spin` before it matters; it returns at once (flag set).
    hf[0] = 1;
    spin<<<1, 32, 0, s1>>>(df, timeout_ns);
    RK(cudaGetLastError());
    RK(cudaStreamSynchronize(s1));
    memset((void *)hf, 0, 64);

    spin<<<1, 32, 0, s1>>>(df, timeout_ns);
    RK(cudaGetLastError());
    int started = 0;
    for (int i = 0; i < 5000 && !started; i++) {
        started = hf[1];
        if (!started)
            usleep(1000);
    }
    uint64_t t0 = now_ns();
    printf("@ spinner_started=%d\n@ t_spin_start=%llu\n", started, (unsigned long long)t0);
    // Blocks in turn on the default case stream (not s1), synchronising only that stream.
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 4; i++)
            b.touch(i);
    uint64_t t1 = now_ns();
    int still = hf[2] == 0;
    printf("@ t_other_done=%llu\n@ other_ms=%.3f\n@ spinner_running_after_other=%d\n@ touches=%d\n",
           (unsigned long long)t1, (t1 - t0) / 1e6, still, rounds * 4);
    hf[0] = 1;
    __sync_synchronize();
    RK(cudaStreamSynchronize(s1));
    printf("@ t_spin_end=%llu\n@ spinner_timed_out=%d\n", (unsigned long long)now_ns(), hf[3]);
    int rc = b.finish(hf[3] || !started);
    RK(cudaStreamDestroy(s1));
    RK(cudaFreeHost((void *)hf));
    return rc;
}

static int case_c17(int rounds)
{
    Blocks b;
    b.init();
    drv_open();
    b.alloc("blk0");
    b.alloc("blk1");
    b.alloc("blk2");

    // The app's own VMM range: two 32 MiB physical allocations mapped side by side.
    typedef CUresult (*gran_t)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                 unsigned long long);
    typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
    typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
    typedef CUresult (*afree_t)(CUdeviceptr, size_t);
    gran_t gran = (gran_t)SYM("cuMemGetAllocationGranularity");
    reserve_t reserve = (reserve_t)SYM("cuMemAddressReserve");
    create_t create = (create_t)SYM("cuMemCreate");
    map_t map = (map_t)SYM("cuMemMap");
    access_t access = (access_t)SYM("cuMemSetAccess");
    unmap_t unmap = (unmap_t)SYM("cuMemUnmap");
    release_t release = (release_t)SYM("cuMemRelease");
    afree_t afree = (afree_t)SYM("cuMemAddressFree");

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t g = 0;
    CK(gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t half = 32 * MIB;
    if (half % g)
        DIE("granularity %zu does not divide 32 MiB", g);
    CUdeviceptr v = 0;
    CUmemGenericAllocationHandle h1, h2;
    CK(reserve(&v, 2 * half, 0, 0, 0));
    CK(create(&h1, half, &prop, 0));
    CK(create(&h2, half, &prop, 0));
    CK(map(v, half, 0, h1, 0));
    CK(map(v + half, half, 0, h2, 0));
    CUmemAccessDesc ad;
    memset(&ad, 0, sizeof ad);
    ad.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ad.location.id = 0;
    ad.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(access(v, 2 * half, &ad, 1));
    int app_vmm = b.adopt("app_vmm", (void *)(uintptr_t)v, 2 * half, FREE_NONE);
    printf("@ app_vmm_half=%zu\n@ granularity=%zu\n", half, g);

    // Pinned host memory mapped into the device's address space.
    const size_t HOST_BYTES = 8 * MIB;
    void *hp = nullptr, *dhp = nullptr;
    RK(cudaHostAlloc(&hp, HOST_BYTES, cudaHostAllocMapped));
    RK(cudaHostGetDevicePointer(&dhp, hp, 0));
    int host_mapped = b.adopt("host_mapped", dhp, HOST_BYTES, FREE_NONE, false); // checked by the CPU below

    // A host-located VMM allocation, where the driver supports it (CUDA 12.2+). Not one of the
    // Blocks: it is stepped and checked by kernels only, with its own error counter.
    CUmemAllocationProp hprop;
    memset(&hprop, 0, sizeof hprop);
    hprop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    hprop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    hprop.location.id = 0;
    size_t hg = 0;
    CUresult hr = gran(&hg, &hprop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    printf("@ host_vmm_granularity_rc=%d\n", (int)hr);
    CUdeviceptr hv = 0;
    CUmemGenericAllocationHandle hh = 0;
    size_t hbytes = 0;
    int host_vmm_used = 0, host_vmm_mapped = 0;
    if (hr == CUDA_SUCCESS && hg) {
        hbytes = ((8 * MIB) + hg - 1) / hg * hg;
        hr = create(&hh, hbytes, &hprop, 0);
        printf("@ host_vmm_create_rc=%d\n", (int)hr);
        if (hr != CUDA_SUCCESS)
            hh = 0;
        CUresult rr = hh ? reserve(&hv, hbytes, 0, 0, 0) : CUDA_ERROR_NOT_SUPPORTED;
        if (hh)
            printf("@ host_vmm_reserve_rc=%d\n", (int)rr);
        if (rr != CUDA_SUCCESS)
            hv = 0;
        CUresult mr = hv ? map(hv, hbytes, 0, hh, 0) : CUDA_ERROR_NOT_SUPPORTED;
        if (hv)
            printf("@ host_vmm_map_rc=%d\n", (int)mr);
        if (mr == CUDA_SUCCESS) {
            CUresult ar = access(hv, hbytes, &ad, 1);
            printf("@ host_vmm_access_rc=%d\n@ host_vmm=0x%llx\n@ host_vmm_bytes=%zu\n", (int)ar,
                   (unsigned long long)hv, hbytes);
            host_vmm_used = ar == CUDA_SUCCESS;
        }
        host_vmm_mapped = mr == CUDA_SUCCESS;
    }
    printf("@ host_vmm_used=%d\n", host_vmm_used);
    print_common(b);
    b.fill_all();
    (void)app_vmm;
    const uint32_t HV_ID = 77;
    uint32_t hv_round = 0;
    unsigned long long *hv_err = nullptr;
    RK(cudaMalloc((void **)&hv_err, sizeof *hv_err));
    RK(cudaMemset(hv_err, 0, sizeof *hv_err));
    uint32_t *hvp = (uint32_t *)(uintptr_t)hv;
    size_t hvn = hbytes / sizeof(uint32_t);
    if (host_vmm_used) {
        fill<<<GRID, THREADS, 0, b.s>>>(hvp, hvn, HV_ID, 0);
        RK(cudaGetLastError());
    }
    // Every block, the app's and the host ones included, a round forward per pass; the three swap
    // blocks take turns under a one-block budget (each touch of a swap block is a remap).
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < b.p.size(); i++)
            b.touch((int)i);
        if (host_vmm_used) {
            step<<<GRID, THREADS, 0, b.s>>>(hvp, hvn, HV_ID, hv_round++, hv_err);
            RK(cudaGetLastError());
            RK(cudaStreamSynchronize(b.s));
        }
    }
    unsigned long long hv_bad = 0;
    if (host_vmm_used) {
        check<<<GRID, THREADS, 0, b.s>>>(hvp, hvn, HV_ID, hv_round, hv_err);
        RK(cudaGetLastError());
        RK(cudaStreamSynchronize(b.s));
        RK(cudaMemcpy(&hv_bad, hv_err, sizeof hv_bad, cudaMemcpyDeviceToHost));
    }
    printf("@ host_vmm_bad=%llu\n", hv_bad);
    RK(cudaFree(hv_err));
    unsigned long long direct_bad = 0;
    {
        const uint32_t *hw = (const uint32_t *)hp;
        for (size_t j = 0; j < HOST_BYTES / 4; j++)
            direct_bad += hw[j] != pat((uint32_t)host_mapped, j, b.round[host_mapped]);
    }
    printf("@ host_mapped_direct_bad=%llu\n", direct_bad);
    int rc = b.finish(direct_bad + hv_bad);
    // Unmap the app range in one call across its two mappings (recorded as two blocks).
    CUresult ur = unmap(v, 2 * half);
    printf("@ unmap_whole_rc=%d\n", (int)ur);
    if (ur != CUDA_SUCCESS) {
        CUresult u1 = unmap(v, half), u2 = unmap(v + half, half);
        printf("@ unmap_halves_rc=%d\n", (int)(u1 != CUDA_SUCCESS ? u1 : u2));
    }
    CK(release(h1));
    CK(release(h2));
    CK(afree(v, 2 * half));
    if (host_vmm_mapped)
        CK(unmap(hv, hbytes));
    if (hv)
        CK(afree(hv, hbytes));
    if (hh)
        CK(release(hh));
    RK(cudaFreeHost(hp));
    printf("@ vmm_done=1\n");
    return rc;
}

static int case_c18(int rounds)
{
    Blocks b;
    b.init();
    b.alloc("blk0");
    b.alloc("blk1");
    b.alloc("blk2");
    void *m = nullptr;
    RK(cudaMallocManaged(&m, BLOCK_BYTES, cudaMemAttachGlobal));
    int managed = b.adopt("managed", m, BLOCK_BYTES, FREE_RT);
    print_common(b);
    b.fill_all();
    unsigned long long cpu_bad = 0;
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 4; i++)
            b.touch(i);
        // The CPU reads the managed block between kernels (the driver migrates it; we must not).
        RK(cudaDeviceSynchronize());
        const uint32_t *mw = (const uint32_t *)m;
        for (size_t j = 0; j < b.n(managed); j += 4099)
            cpu_bad += mw[j] != pat((uint32_t)managed, j, b.round[managed]);
    }
    printf("@ managed_cpu_bad=%llu\n", cpu_bad);
    return b.finish(cpu_bad);
}

static int case_lowbudget(double secs)
{
    Blocks b;
    b.init();
    const char *names[] = {"blk0", "blk1", "blk2", "blk3"};
    for (int i = 0; i < 4; i++)
        b.alloc(names[i]);
    print_common(b);
    b.fill_all();
    uint32_t *in = nullptr;
    RK(cudaMalloc((void **)&in, 4096));
    static uint32_t host_in[1024];
    uint64_t t0 = now_ns(), until = t0 + (uint64_t)(secs * 1e9);
    int it = 0;
    while (now_ns() < until) {
        host_in[0] = (uint32_t)it;
        RK(cudaMemcpyAsync(in, host_in, sizeof host_in, cudaMemcpyHostToDevice, b.s));
        // One kernel needs blocks 0, 1 and 2 (192 MiB) at once, then block 3 alone.
        step3<<<GRID, THREADS, 0, b.s>>>(b.p[0], b.p[1], b.p[2], b.n(0), b.round[0], b.err);
        RK(cudaGetLastError());
        RK(cudaStreamSynchronize(b.s)); // the shim evicts idle blocks only: let 0, 1, 2 become idle
        b.round[0]++;
        b.round[1]++;
        b.round[2]++;
        b.touch(3);
        usleep(500);
        it++;
    }
    printf("@ iterations=%d\n@ loop_s=%.3f\n", it, (now_ns() - t0) / 1e9);
    int rc = b.finish();
    RK(cudaFree(in));
    return rc;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (argc < 2)
        DIE("usage: %s roundtrip|c08|c09|c10|c10u|c26|c11|c14|c16|c17|c18|lowbudget [args]", argv[0]);
    const char *mode = argv[1];
    printf("@ pid=%d\n@ mode=%s\n", (int)getpid(), mode);
    if (!strcmp(mode, "roundtrip"))
        return case_roundtrip(argc > 2 ? atoi(argv[2]) : 20, argc > 3 && !strcmp(argv[3], "async"));
    if (!strcmp(mode, "c08"))
        return case_c08(argc > 2 ? argv[2] : "struct", argc > 3 ? atoi(argv[3]) : 6);
    if (!strcmp(mode, "c09"))
        return case_c09(argc > 2 ? atoi(argv[2]) : 5);
    if (!strcmp(mode, "c10"))
        return case_c10(argc > 2 ? atoi(argv[2]) : 8);
    if (!strcmp(mode, "c10u"))
        return case_c10u(argc > 2 ? atoi(argv[2]) : 8);
    if (!strcmp(mode, "c26"))
        return case_c26(argc > 2 ? atoi(argv[2]) : 8);
    if (!strcmp(mode, "c11"))
        return case_c11();
    if (!strcmp(mode, "c14"))
        return case_c14(argc > 2 ? atoi(argv[2]) : 2000);
    if (!strcmp(mode, "c16"))
        return case_c16(argc > 2 ? atoi(argv[2]) : 5);
    if (!strcmp(mode, "c17"))
        return case_c17(argc > 2 ? atoi(argv[2]) : 4);
    if (!strcmp(mode, "c18"))
        return case_c18(argc > 2 ? atoi(argv[2]) : 5);
    if (!strcmp(mode, "lowbudget"))
        return case_lowbudget(argc > 2 ? atof(argv[2]) : 3.0);
    DIE("unknown mode %s", mode);
}
