/*
 * The block table: live ranges [start, end) (device and host blocks) -> (block id, kind), a
 * sorted interval table (intervals.h). Writers (alloc, free, map, unmap) take the write lock and
 * make the sequence count odd while they change the table. The hot paths (a launch's scan, a
 * copy's or set's two words, a free's lookup) read without writing shared memory: they note the
 * count, look up, and start again if a writer ran meanwhile (a seqlock); after a few such
 * retries, or while a writer holds the table, they take the read lock. Other readers hold the
 * read lock. The table keeps the arrays it grew out of, which such a reader may still be in.
 *
 * Block ids come from a per-process counter starting at 1. An access word keeps 24 bits of
 * block id, so ids wrap after 16,777,215 blocks (back to 1, never 0): a process that makes
 * more blocks than that over its life reuses ids of long-freed blocks, which the capture
 * reader resolves by allocation order (the latest ALLOC of an id wins).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "intervals.h"
#include "shim.h"

#define BLOCK_ID_MAX 0xFFFFFFu

#define SEQ_TRIES 4 /* lock-free attempts before a reader takes the read lock */

static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
/* What a lookup's read section reads besides the table's elements, on one cache line (64 bytes):
 * the sequence count, the span of all blocks (kept here by the writers: from the first and last
 * elements, two more lines a launch would read otherwise) and the table. */
static struct {
    uint32_t seq;     /* atomic: odd while a writer changes the table */
    uint64_t lo, hi;  /* atomic: [lo, hi), the span of all blocks; 0, 0 when there are none */
    struct itable blocks;
} __attribute__((aligned(64))) g_rs = {.blocks = ITABLE_OF(struct block)};

/* Writer side of the sequence count (write lock held). */
static void write_begin(void)
{
    __atomic_store_n(&g_rs.seq, g_rs.seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE); /* the odd count before any change */
}
static void write_end(void)
{
    uint64_t lo, hi; /* blocks are sorted and disjoint: the first starts lowest, the last ends highest */
    itable_bounds(&g_rs.blocks, &lo, &hi);
    __atomic_store_n(&g_rs.lo, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&g_rs.hi, hi, __ATOMIC_RELAXED);
    __atomic_store_n(&g_rs.seq, g_rs.seq + 1, __ATOMIC_RELEASE);
}

static uint32_t next_block_id(void)
{
    uint32_t n = __atomic_add_fetch(&g_shim.block_seq, 1, __ATOMIC_RELAXED);
    return (n - 1) % BLOCK_ID_MAX + 1;
}

static struct block *at(size_t i) { return itable_at(&g_rs.blocks, i); }

/* Each thread's last hits: the table index of the block an address was last found in, by the
 * address's 64 KiB window (hashed). Launch after launch, words point into the same few blocks, and
 * checking that one element (blocks are disjoint: an element holding the address is its block)
 * spares the binary search its chain of loads; with PyTorch's caching allocator's segments (gpt_tiny,
 * 20 blocks) ~95% of lookups hit, with a tensor a block (gpt_tiny_async, 2,230) ~40%. An index is
 * only a guess: one the table moved on from fails the check or lies past its end, and the search
 * runs as before. */
#define HIT_BITS 8
static SHIM_TLS uint32_t t_hit[1u << HIT_BITS];

const struct block *blocks_lookup(uint64_t addr)
{
    size_t n = __atomic_load_n(&g_rs.blocks.n, __ATOMIC_ACQUIRE); /* the count first: see itable_upper */
    const struct block *v = __atomic_load_n((struct block **)&g_rs.blocks.v, __ATOMIC_ACQUIRE);
    uint32_t *hit = &t_hit[((addr >> 16) * 0x9E3779B97F4A7C15ull) >> (64 - HIT_BITS)];
    uint32_t i = *hit;
    if (i < n && v[i].start <= addr && addr < v[i].end)
        return &v[i];
    const struct block *b = itable_find_in((const char *)v, n, addr, sizeof *b);
    if (b)
        *hit = (uint32_t)(b - v);
    return b;
}

void blocks_prefetch(void) { __builtin_prefetch(&g_rs); }

void blocks_bounds(uint64_t *lo, uint64_t *hi)
{
    *lo = __atomic_load_n(&g_rs.lo, __ATOMIC_RELAXED);
    *hi = __atomic_load_n(&g_rs.hi, __ATOMIC_RELAXED);
}

void blocks_read_lock(void) { pthread_rwlock_rdlock(&g_lock); }
void blocks_read_unlock(void) { pthread_rwlock_unlock(&g_lock); }

uint32_t blocks_read_begin(int attempt)
{
    if (attempt < SEQ_TRIES) {
        uint32_t s = __atomic_load_n(&g_rs.seq, __ATOMIC_ACQUIRE);
        if (!(s & 1))
            return s;
    }
    pthread_rwlock_rdlock(&g_lock);
    return BLOCKS_READ_LOCKED;
}

int blocks_read_end(uint32_t s)
{
    if (s == BLOCKS_READ_LOCKED) {
        pthread_rwlock_unlock(&g_lock);
        return 1;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE); /* the lookups' loads before the second count */
    return __atomic_load_n(&g_rs.seq, __ATOMIC_RELAXED) == s;
}

uint64_t blocks_access_word(uint64_t addr)
{
    if (!addr)
        return 0;
    uint64_t w;
    uint32_t s;
    int attempt = 0;
    do {
        s = blocks_read_begin(attempt++);
        const struct block *b = blocks_lookup(addr);
        w = b ? PYOBMEM_ACCESS_WORD(b->id, addr - b->start) : 0;
    } while (!blocks_read_end(s));
    return w;
}

static void emit_free(const struct block *b, uint64_t stream)
{
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_FREE, .flags = b->device,
                                        .free = {.block_id = b->id, .addr = b->start, .size = b->end - b->start,
                                                 .stream = stream, .kind = b->kind}}, 1);
}

/* Remove entries [i, j) (write lock held), emitting FREE for each. */
/* Device memory the budget counts: what the driver allocates on the device for the block. */
static int on_device(const struct block *b)
{
    return b->kind != PYOBMEM_ALLOC_MANAGED && b->kind != PYOBMEM_ALLOC_HOST;
}

static void erase(size_t i, size_t j, uint64_t stream)
{
    for (size_t k = i; k < j; k++) {
        emit_free(at(k), stream);
        if (on_device(at(k)))
            __atomic_sub_fetch(&g_shim.device_bytes, at(k)->end - at(k)->start, __ATOMIC_RELAXED);
    }
    itable_erase(&g_rs.blocks, i, j);
}

uint32_t blocks_add(uint64_t addr, uint64_t size, uint64_t stream, int kind, int device)
{
    if (size == 0)
        size = 1; /* a zero-byte allocation still has an address worth naming */
    struct block nb = {.start = addr, .end = addr + size, .kind = (uint16_t)kind, .device = (uint16_t)device,
                       .stream = stream};
    pthread_rwlock_wrlock(&g_lock);
    write_begin();
    nb.id = next_block_id();
    size_t i, j;
    itable_overlapping(&g_rs.blocks, nb.start, nb.end, &i, &j);
    if (j > i) /* stale ranges freed behind our back (an unhooked free): they are gone now */
        erase(i, j, 0);
    if (!itable_insert(&g_rs.blocks, &nb)) {
        write_end();
        pthread_rwlock_unlock(&g_lock);
        return 0;
    }
    write_end();
    if (on_device(&nb))
        __atomic_add_fetch(&g_shim.device_bytes, size, __ATOMIC_RELAXED);
    ring_write(&(struct pyobmem_record){.type = PYOBMEM_EV_ALLOC, .flags = nb.device,
                                        .alloc = {.block_id = nb.id, .addr = addr, .size = size, .stream = stream,
                                                  .kind = (uint64_t)kind}}, 1);
    pthread_rwlock_unlock(&g_lock);
    return nb.id;
}

int blocks_find_start(uint64_t addr, struct block *out)
{
    int found;
    uint32_t s;
    int attempt = 0;
    do {
        s = blocks_read_begin(attempt++);
        const struct block *b = blocks_lookup(addr);
        found = b && b->start == addr;
        if (found)
            *out = *b;
    } while (!blocks_read_end(s));
    return found;
}

void blocks_remove(uint64_t addr, uint32_t id, uint64_t stream)
{
    pthread_rwlock_wrlock(&g_lock);
    size_t i = itable_upper(&g_rs.blocks, addr);
    if (i > 0 && at(i - 1)->start == addr && at(i - 1)->id == id) {
        write_begin();
        erase(i - 1, i, stream);
        write_end();
    }
    pthread_rwlock_unlock(&g_lock);
}

int blocks_remove_range(uint64_t start, uint64_t end, uint64_t stream)
{
    if (end <= start)
        return 0;
    pthread_rwlock_wrlock(&g_lock);
    size_t i, j;
    itable_overlapping(&g_rs.blocks, start, end, &i, &j);
    if (j > i) {
        write_begin();
        erase(i, j, stream);
        write_end();
    }
    pthread_rwlock_unlock(&g_lock);
    return (int)(j - i);
}

void blocks_atfork_prepare(void) { pthread_rwlock_wrlock(&g_lock); }
void blocks_atfork_parent(void) { pthread_rwlock_unlock(&g_lock); }

void blocks_reset_after_fork(void)
{
    /* A child's CUDA context is not the parent's: its blocks start empty, ids from 1. */
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_INITIALIZER;
    g_lock = fresh;
    g_rs.blocks.n = 0;
    g_rs.lo = g_rs.hi = 0;
    g_shim.block_seq = 0;
    g_shim.device_bytes = 0;
}
