/*
 * A sorted table of disjoint address intervals [start, end), searched by binary search: the
 * shim's block table (blocks.c) and the swap executor's table of its blocks (swap_state.h) are
 * both one. Elements have a fixed size and begin with their bounds (struct interval); the
 * caller does the locking. Lookups may also run without the lock, inside a seqlock read section
 * (blocks.c): the count and the array are loaded atomically, and an array the table grew out of
 * is kept, never freed, since such a reader may still be in it (sizes double, so what is kept is
 * less than the final array).
 */
#ifndef PYOBMEM_INTERVALS_H
#define PYOBMEM_INTERVALS_H

#include <stddef.h>
#include <stdint.h>

struct interval {
    uint64_t start, end; /* [start, end) */
};

struct itable {
    char *v;        /* atomic: n elements of `size` bytes, sorted by start */
    size_t n, cap;  /* n atomic, stored after v when both change */
    size_t size;
    void *retired;  /* the arrays grown out of, linked through their first bytes */
};
#define ITABLE_OF(type) {NULL, 0, 0, sizeof(type), NULL}

static inline void *itable_at(const struct itable *t, size_t i) { return t->v + i * t->size; }

/* Index in v[0, n) of the first element with start > addr (inline: the launch path looks up
 * every argument word). The count is loaded before the array: a table that grows publishes the
 * new array before the larger count, so v[0, n) is always inside the array read. */
static inline size_t itable_upper_in(const char *v, size_t n, size_t size, uint64_t addr)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (((const struct interval *)(v + mid * size))->start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
static inline size_t itable_upper(const struct itable *t, uint64_t addr)
{
    size_t n = __atomic_load_n(&t->n, __ATOMIC_ACQUIRE);
    return itable_upper_in(__atomic_load_n(&t->v, __ATOMIC_ACQUIRE), n, t->size, addr);
}

/* The element holding addr, or NULL (the lookup of every argument word of a launch); `size` is
 * t->size, a constant where the caller knows it (the block table's: the multiplies are shifts).
 * The same search as itable_upper_in, branchless: the halving is a conditional move of a pointer,
 * with no multiply on its chain of loads, and both possible next midpoints are prefetched (inside
 * v[0, n): a prefetch never faults either). Which half an argument word falls in is
 * unpredictable, and a mispredicted branch per level cost more than the search's loads. A
 * microbenchmark (the CPU machine, L1 cooled between lookups), ns per lookup, branchy -> this: 400
 * different addresses in turn, in 1,024 blocks ~60 -> ~30, in 4,096 ~85 -> ~45; one address again
 * and again ~11 -> ~22. itable_find_in: the same in base[0, n), loaded by the caller. */
static inline void *itable_find_in(const char *base, size_t n, uint64_t addr, size_t size)
{
    if (n == 0)
        return NULL;
    while (n > 1) { /* the last element with start <= addr, if any, is in base[0, n) */
        size_t half = n / 2, quarter = half / 2 * size;
        const char *mid = base + half * size;
        __builtin_prefetch(base + quarter);
        __builtin_prefetch(mid + quarter);
        base = ((const struct interval *)mid)->start <= addr ? mid : base;
        n -= half;
    }
    const struct interval *iv = (const struct interval *)base;
    return iv->start <= addr && addr < iv->end ? (void *)iv : NULL;
}
static inline void *itable_find_sized(const struct itable *t, uint64_t addr, size_t size)
{
    size_t n = __atomic_load_n(&t->n, __ATOMIC_ACQUIRE);
    return itable_find_in(__atomic_load_n(&t->v, __ATOMIC_ACQUIRE), n, addr, size);
}
static inline void *itable_find(const struct itable *t, uint64_t addr) { return itable_find_sized(t, addr, t->size); }
/* [*lo, *hi): from the first element's start to the last one's end; 0, 0 when empty. */
static inline void itable_bounds(const struct itable *t, uint64_t *lo, uint64_t *hi)
{
    size_t n = __atomic_load_n(&t->n, __ATOMIC_ACQUIRE);
    const char *v = __atomic_load_n(&t->v, __ATOMIC_ACQUIRE);
    *lo = n ? ((const struct interval *)v)->start : 0;
    *hi = n ? ((const struct interval *)(v + (n - 1) * t->size))->end : 0;
}
/* [*i, *j): the elements overlapping [start, end) (start < end). */
void itable_overlapping(const struct itable *t, uint64_t start, uint64_t end, size_t *i, size_t *j);
/* Insert a copy of elem at its place (the caller removed what it overlaps). Returns the stored
 * element, or NULL when the table cannot grow (nothing inserted). */
void *itable_insert(struct itable *t, const void *elem);
/* Remove the elements [i, j). */
void itable_erase(struct itable *t, size_t i, size_t j);

#endif
