/*
 * Producer side of the shared-memory event ring (protocol in pyobmem/include/pyobmem/abi.h).
 *
 * A group of n records (a launch and its ACCESS records, the chunks of one text) is reserved
 * as n consecutive slots with one CAS on head, so a group is written whole or dropped whole.
 * Slots are freed by the single consumer strictly in order, so when the group's last slot is
 * free for this lap all earlier ones are too. A full ring never blocks: the group is counted in
 * header.dropped and in a per-process pending count, and the next group this process writes
 * is preceded by a DROPPED record carrying that count.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#define RING_CAS_TRIES 64 /* CAS losses before giving up on a group (counted as dropped) */
/* Slots after a written group that are prefetched for writing. The ring (64 MiB by default) is
 * far larger than the caches, so each slot's line was last touched a lap ago: without the
 * prefetch the next op's reserve and publish wait for memory. A launch writes 2 slots typically. */
#define RING_PREFETCH 4
#define TEXT_MAX_CHUNKS 8

static struct pyobmem_ring_header *g_hdr;
static struct pyobmem_record *g_recs;
static uint64_t g_mask;
static uint64_t g_pending_drops; /* atomic: dropped here, not yet reported in a DROPPED record */
static uint64_t g_after; /* atomic: the slot after this process's last group, where its next one likely starts */

/* Every record's time is a clock_gettime, which the kernel's vDSO serves: its code and its data
 * page ([vvar]) are two more pages whose lines and TLB entries the application's work between two
 * launches evicts, and the read waits for them (the vDSO orders its rdtsc after its loads). The
 * shim calls the vDSO's function itself (glibc's wrapper and the pointer it loads are two more)
 * and ring_prefetch starts loading both before the driver's call. Fake driver, 4 MiB evicted
 * between launches: the ring write 247 -> 133 ns; 256 KiB: 127 -> 110. Not found (no vDSO, another
 * libc): clock_gettime, no prefetch. The vDSO is what clock_gettime calls: the same clock. */
typedef int (*vdso_gettime_fn)(clockid_t, struct timespec *);
static vdso_gettime_fn g_vdso_gettime;
static const char *g_vdso_code; /* its first lines */
static const char *g_vvar;      /* the start of [vvar]: the time data's first lines, on Linux 5 and 6 */

uint64_t shim_now_ns(void)
{
    struct timespec ts;
    if (g_vdso_gettime)
        g_vdso_gettime(CLOCK_MONOTONIC, &ts);
    else
        clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void clock_find(void)
{
    void *h = dlopen("linux-vdso.so.1", RTLD_NOLOAD | RTLD_LAZY);
    void *f = h ? dlsym(h, "__vdso_clock_gettime") : NULL; /* x86-64 */
    if (h && !f)
        f = dlsym(h, "__kernel_clock_gettime"); /* aarch64 */
    FILE *m = fopen("/proc/self/maps", "re");
    char line[256];
    unsigned long a, b;
    while (m && fgets(line, sizeof line, m))
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && strstr(line, " [vvar]\n"))
            g_vvar = (const char *)a;
    if (m)
        fclose(m);
    g_vdso_code = f;
    g_vdso_gettime = (vdso_gettime_fn)f;
}

int ring_open(const char *path)
{
    if (!path || !*path)
        return 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    void *m = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= PYOBMEM_RING_HEADER_SIZE)
        m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return 0;
    struct pyobmem_ring_header *h = m;
    uint64_t cap = __atomic_load_n(&h->capacity, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != PYOBMEM_RING_MAGIC || h->abi_version != PYOBMEM_ABI_VERSION ||
        h->record_size != PYOBMEM_RECORD_SIZE || cap == 0 || (cap & (cap - 1)) != 0 ||
        (uint64_t)st.st_size < PYOBMEM_RING_HEADER_SIZE + cap * PYOBMEM_RECORD_SIZE) {
        munmap(m, (size_t)st.st_size);
        return 0;
    }
#ifdef MADV_POPULATE_WRITE
    /* Only a ring is populated (no page fault per 64 records in the first lap); a fork child
     * inherits the mapping, not its page tables. Older kernels refuse the advice: faults then. */
    madvise(m, (size_t)st.st_size, MADV_POPULATE_WRITE);
#endif
    clock_find();
    g_hdr = h;
    g_recs = (struct pyobmem_record *)((char *)m + PYOBMEM_RING_HEADER_SIZE);
    g_mask = cap - 1;
    return 1;
}

void ring_reset_after_fork(void)
{
    /* The parent's pending drops are already in header.dropped and are the parent's to report. */
    g_pending_drops = 0;
}

/* Reserve n consecutive slots; returns 1 and sets *pos, or 0 when the ring is full. */
static int reserve(unsigned n, uint64_t *pos_out)
{
    if (n == 0 || n > g_mask + 1)
        return 0;
    uint64_t pos = __atomic_load_n(&g_hdr->head, __ATOMIC_RELAXED);
    for (int tries = 0; tries < RING_CAS_TRIES; tries++) {
        uint64_t last = pos + n - 1;
        uint64_t seq = __atomic_load_n(&g_recs[last & g_mask].seq, __ATOMIC_ACQUIRE);
        int64_t diff = (int64_t)(seq - last);
        if (diff == 0) {
            if (__atomic_compare_exchange_n(&g_hdr->head, &pos, pos + n, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
                *pos_out = pos;
                return 1;
            }
            /* pos was reloaded by the failed CAS */
        } else if (diff < 0) {
            /* The slot still holds a record from the previous lap: full, unless head moved. */
            uint64_t now = __atomic_load_n(&g_hdr->head, __ATOMIC_RELAXED);
            if (now == pos)
                return 0;
            pos = now;
        } else {
            pos = __atomic_load_n(&g_hdr->head, __ATOMIC_RELAXED);
        }
    }
    return 0;
}

/* One slot of a reserved group: the payload, then its seq, published. */
static inline void publish_slot(uint64_t p, uint16_t type, uint16_t flags, uint64_t ts, const struct pyobmem_words *w)
{
    struct pyobmem_record *slot = &g_recs[p & g_mask];
    slot->type = type;
    slot->flags = flags;
    slot->pid = g_shim.pid;
    slot->ts_ns = ts;
    slot->words = *w;
    /* Publish only if the slot is still ours: a consumer that gave up on it (we were stopped
     * or preempted between reserve and publish for longer than its stuck timeout) moved its
     * seq on to the next lap, pos + cap. A plain store would set it back to pos + 1 and no
     * producer could ever reserve that slot again: the ring would drop everything from then
     * on. The record is lost either way; the consumer counted it as skipped. */
    uint64_t expect = p;
    __atomic_compare_exchange_n(&slot->seq, &expect, p + 1, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static void publish(uint64_t pos, const struct pyobmem_record *recs, unsigned n, uint64_t ts)
{
    for (unsigned i = 0; i < n; i++)
        publish_slot(pos + i, recs[i].type, recs[i].flags, ts, &recs[i].words);
}

static void flush_pending_drops(uint64_t ts)
{
    uint64_t p = __atomic_exchange_n(&g_pending_drops, 0, __ATOMIC_RELAXED);
    if (!p)
        return;
    uint64_t pos;
    if (reserve(1, &pos)) {
        struct pyobmem_record r = {.type = PYOBMEM_EV_DROPPED, .dropped = {.count = p}};
        publish(pos, &r, 1, ts);
    } else {
        /* Still full: the DROPPED record itself is no event, so it is not counted; carry on. */
        __atomic_add_fetch(&g_pending_drops, p, __ATOMIC_RELAXED);
    }
}

/* Reserve n slots for a group (reporting earlier drops first); 0 when the ring is full (counted). */
static inline int group_begin(unsigned n, uint64_t *pos, uint64_t *ts)
{
    *ts = shim_now_ns();
    if (SHIM_UNLIKELY(__atomic_load_n(&g_pending_drops, __ATOMIC_RELAXED)))
        flush_pending_drops(*ts);
    if (reserve(n, pos)) {
        __atomic_store_n(&g_after, *pos + n, __ATOMIC_RELAXED);
        return 1;
    }
    __atomic_add_fetch(&g_hdr->dropped, n, __ATOMIC_RELAXED);
    __atomic_add_fetch(&g_pending_drops, n, __ATOMIC_RELAXED);
    return 0;
}

/* Always inlined: a function made of prefetches alone is taken for one without effects, and gcc 12
 * dropped its calls (the shim went without these prefetches from b428607 to 2026-12-02). */
static inline __attribute__((always_inline)) void group_end(uint64_t next)
{
#pragma GCC unroll 4
    for (unsigned k = 0; k < RING_PREFETCH; k++)
        __builtin_prefetch(&g_recs[(next + k) & g_mask], 1, 3);
}

void ring_prefetch(void)
{
    if (!g_hdr)
        return;
    uint64_t p = __atomic_load_n(&g_after, __ATOMIC_RELAXED);
    __builtin_prefetch(&g_hdr->head, 1, 3);
    __builtin_prefetch(&g_recs[p & g_mask], 1, 3);
    __builtin_prefetch(&g_recs[(p + 1) & g_mask], 1, 3);
    const char *v = g_vvar, *c = g_vdso_code; /* a prefetch never faults */
    if (v && c) {
        __builtin_prefetch(v);
        __builtin_prefetch(v + 64);
        __builtin_prefetch(v + 128);
        __builtin_prefetch(v + 192);
        __builtin_prefetch(c);
        __builtin_prefetch(c + 64);
        __builtin_prefetch(c + 128);
        __builtin_prefetch(c + 192);
    }
}

int ring_write(const struct pyobmem_record *recs, unsigned n)
{
    if (!g_hdr)
        return 0;
    ST_BEGIN(t0);
    uint64_t pos, ts;
    int ok = group_begin(n, &pos, &ts);
    if (ok) {
        publish(pos, recs, n, ts);
        group_end(pos + n);
    }
    ST_END(t0, ST_RING_WRITE);
    return ok;
}

int ring_write_op(const struct pyobmem_record *op, uint64_t seq, const uint64_t *words, uint32_t n)
{
    if (!g_hdr)
        return 0;
    ST_BEGIN(t0);
    unsigned n_acc = (n + 3) / 4;
    uint64_t pos, ts;
    int ok = group_begin(1 + n_acc, &pos, &ts);
    if (ok) {
        publish_slot(pos, op->type, op->flags, ts, &op->words);
        for (unsigned r = 0; r < n_acc; r++, words += 4, n -= 4) {
            struct pyobmem_words w = {seq, words[0], n > 1 ? words[1] : 0, n > 2 ? words[2] : 0, n > 3 ? words[3] : 0};
            publish_slot(pos + 1 + r, PYOBMEM_EV_ACCESS, 0, ts, &w);
        }
        group_end(pos + 1 + n_acc);
    }
    ST_END(t0, ST_RING_WRITE);
    return ok;
}

void ring_text(uint16_t type, uint64_t key, const char *text)
{
    struct pyobmem_record recs[TEXT_MAX_CHUNKS];
    size_t len = strlen(text);
    unsigned n = (unsigned)((len + PYOBMEM_TEXT_CHUNK - 1) / PYOBMEM_TEXT_CHUNK);
    if (n == 0)
        n = 1;
    if (n > TEXT_MAX_CHUNKS)
        n = TEXT_MAX_CHUNKS;
    memset(recs, 0, sizeof recs);
    for (unsigned i = 0; i < n; i++) {
        size_t off = (size_t)i * PYOBMEM_TEXT_CHUNK;
        size_t k = off < len ? len - off : 0;
        if (k > PYOBMEM_TEXT_CHUNK)
            k = PYOBMEM_TEXT_CHUNK;
        recs[i].type = type;
        recs[i].flags = (uint16_t)(i | (i == n - 1 ? PYOBMEM_TEXT_LAST : 0));
        recs[i].note.key = key; /* KERNEL_NAME and NOTE share the text payload */
        memcpy(recs[i].note.text, text + off, k);
    }
    ring_write(recs, n);
}

void ring_note(const char *fmt, ...)
{
    char buf[PYOBMEM_TEXT_CHUNK * TEXT_MAX_CHUNKS + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ring_text(PYOBMEM_EV_NOTE, 0, buf);
}
