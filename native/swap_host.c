/*
 * The pinned host pool of swap mode (swap_state.h): chunks of cuMemHostAlloc (1 GiB, halved down
 * to what fits), first-fit extents, and the host slot each swapped block keeps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "swap_state.h"

#define MAX_CHUNKS 64
#define POOL_CHUNK ((size_t)1 << 30)
#define HOST_ALIGN ((size_t)4096)

struct ext {
    char *p;
    size_t len;
    int chunk;
};
static struct ext *g_free;
static size_t g_nfree, g_capfree;
static int g_nchunks;
static size_t g_pinned, g_pin_cap;
static int g_host_dead;

static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    size_t kb = 0;
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static struct {
    char *p;
    size_t len;
} g_chunks[MAX_CHUNKS];

static int host_chunk_of(const char *p)
{
    for (int c = 0; c < g_nchunks; c++)
        if (p >= g_chunks[c].p && p < g_chunks[c].p + g_chunks[c].len)
            return c;
    return -1;
}

static int free_insert(size_t at, struct ext e)
{
    if (g_nfree == g_capfree) {
        size_t cap = g_capfree ? g_capfree * 2 : 64;
        struct ext *n = realloc(g_free, cap * sizeof *n);
        if (!n)
            return 0;
        g_free = n;
        g_capfree = cap;
    }
    memmove(&g_free[at + 1], &g_free[at], (g_nfree - at) * sizeof *g_free);
    g_free[at] = e;
    g_nfree++;
    return 1;
}

void host_free(void *ptr, size_t n)
{
    if (!ptr)
        return;
    n = (n + HOST_ALIGN - 1) & ~(HOST_ALIGN - 1);
    char *p = ptr;
    size_t i = 0;
    while (i < g_nfree && g_free[i].p < p)
        i++;
    int chunk = host_chunk_of(p);
    if (i > 0 && g_free[i - 1].chunk == chunk && g_free[i - 1].p + g_free[i - 1].len == p) {
        g_free[i - 1].len += n;
        if (i < g_nfree && g_free[i].chunk == chunk && g_free[i - 1].p + g_free[i - 1].len == g_free[i].p) {
            g_free[i - 1].len += g_free[i].len;
            memmove(&g_free[i], &g_free[i + 1], (g_nfree - i - 1) * sizeof *g_free);
            g_nfree--;
        }
        return;
    }
    if (i < g_nfree && g_free[i].chunk == chunk && p + n == g_free[i].p) {
        g_free[i].p = p;
        g_free[i].len += n;
        return;
    }
    free_insert(i, (struct ext){p, n, chunk}); /* on ENOMEM the slot is lost, never reused */
}

static int host_grow(size_t need)
{
    if (g_host_dead)
        return 0;
    if (!g_pin_cap) {
        size_t avail = mem_available();
        g_pin_cap = avail ? avail / 2 : (size_t)16 << 30;
    }
    size_t room = g_pin_cap > g_pinned ? g_pin_cap - g_pinned : 0;
    size_t c = need > POOL_CHUNK ? need : POOL_CHUNK;
    if (c > room)
        c = room & ~(HOST_ALIGN - 1);
    while (g_nchunks < MAX_CHUNKS && c >= need) {
        void *h = NULL;
        if (real_cuMemHostAlloc(&h, c, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS && h) {
            g_chunks[g_nchunks].p = h;
            g_chunks[g_nchunks].len = c;
            size_t i = 0;
            while (i < g_nfree && g_free[i].p < (char *)h)
                i++;
            if (!free_insert(i, (struct ext){h, c, g_nchunks})) {
                real_cuMemFreeHost(h);
                break;
            }
            g_nchunks++;
            g_pinned += c;
            ring_note("swap.pinned_bytes=%zu", g_pinned);
            return 1;
        }
        c = (c / 2) & ~(HOST_ALIGN - 1);
    }
    g_host_dead = 1;
    ring_note("swap: pinned host memory exhausted (%zu bytes pinned, a %zu-byte block stays resident)", g_pinned,
              need);
    return 0;
}

void *host_alloc(size_t n)
{
    n = (n + HOST_ALIGN - 1) & ~(HOST_ALIGN - 1);
    for (int tries = 0; tries < 2; tries++) {
        for (size_t i = 0; i < g_nfree; i++) {
            if (g_free[i].len < n)
                continue;
            char *p = g_free[i].p;
            g_free[i].p += n;
            g_free[i].len -= n;
            if (g_free[i].len == 0) {
                memmove(&g_free[i], &g_free[i + 1], (g_nfree - i - 1) * sizeof *g_free);
                g_nfree--;
            }
            return p;
        }
        if (!host_grow(n))
            return NULL;
    }
    return NULL;
}

/* A block keeps its host slot from its first swap-out until it is freed: no pool churn, and the
 * pool never holds more than the blocks that were swapped (first-fit slots of mixed sizes,
 * recycled at every swap-in, fragmented it past the total of all allocations on the H200). When
 * the pool cannot grow, a resident block's slot (its copy is stale) is given up for this one. */
void *host_slot(struct sblock *b)
{
    void *h = host_alloc(b->size);
    for (size_t i = 0; !h && i < g_tab.n; i++) {
        struct sblock *o = block_of(i);
        if (o != b && o->host && o->state == SB_RESIDENT) {
            host_free(o->host, o->size);
            o->host = NULL;
            h = host_alloc(b->size);
        }
    }
    return h;
}
