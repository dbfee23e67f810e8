/*
 * A sorted table of disjoint address intervals [start, end), searched by binary search: the
 * shim's block table (blocks.c) and the swap executor's table of its blocks (swap_state.h) are
 * both one. Elements have a fixed size and begin with their bounds (struct interval); the
 * caller does the locking.
 */
#ifndef PYOBMEM_INTERVALS_H
#define PYOBMEM_INTERVALS_H

#include <stddef.h>
#include <stdint.h>

struct interval {
    uint64_t start, end; /* [start, end) */
};

struct itable {
    char *v;        /* n elements of `size` bytes, sorted by start */
    size_t n, cap;
    size_t size;
};
#define ITABLE_OF(type) {NULL, 0, 0, sizeof(type)}

static inline void *itable_at(const struct itable *t, size_t i) { return t->v + i * t->size; }
static inline const struct interval *itable_iv(const struct itable *t, size_t i)
{
    return (const struct interval *)itable_at(t, i);
}
/* Index of the first element with start > addr (inline: the launch path looks up every
 * argument word). */
static inline size_t itable_upper(const struct itable *t, uint64_t addr)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (itable_iv(t, mid)->start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The element holding addr, or NULL. */
static inline void *itable_find(const struct itable *t, uint64_t addr)
{
    size_t i = itable_upper(t, addr);
    if (i == 0 || addr >= itable_iv(t, i - 1)->end)
        return NULL;
    return itable_at(t, i - 1);
}
/* [*i, *j): the elements overlapping [start, end) (start < end). */
void itable_overlapping(const struct itable *t, uint64_t start, uint64_t end, size_t *i, size_t *j);
/* Insert a copy of elem at its place (the caller removed what it overlaps). Returns the stored
 * element, or NULL when the table cannot grow (nothing inserted). */
void *itable_insert(struct itable *t, const void *elem);
/* Remove the elements [i, j). */
void itable_erase(struct itable *t, size_t i, size_t j);

#endif
