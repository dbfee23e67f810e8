/* The sorted interval table (intervals.h). */
#include <stdlib.h>
#include <string.h>

#include "intervals.h"

void itable_overlapping(const struct itable *t, uint64_t start, uint64_t end, size_t *i_out, size_t *j_out)
{
    size_t j = itable_upper(t, end - 1); /* first with start > end-1, i.e. start >= end */
    size_t i = itable_upper(t, start);
    if (i > 0 && ((const struct interval *)itable_at(t, i - 1))->end > start)
        i--;
    *i_out = i;
    *j_out = j < i ? i : j;
}

/* Double the array; the old one is kept for lock-free readers. */
static int grow(struct itable *t)
{
    size_t cap = t->cap ? t->cap * 2 : 256;
    char *v = malloc(cap * t->size);
    if (!v)
        return 0;
    if (t->n)
        memcpy(v, t->v, t->n * t->size);
    if (t->v) {
        *(void **)t->v = t->retired; /* elements are larger than a pointer */
        t->retired = t->v;
    }
    __atomic_store_n(&t->v, v, __ATOMIC_RELEASE);
    t->cap = cap;
    return 1;
}

void *itable_insert(struct itable *t, const void *elem)
{
    if (t->n == t->cap && !grow(t))
        return NULL;
    size_t i = itable_upper(t, ((const struct interval *)elem)->start);
    memmove(itable_at(t, i + 1), itable_at(t, i), (t->n - i) * t->size);
    memcpy(itable_at(t, i), elem, t->size);
    __atomic_store_n(&t->n, t->n + 1, __ATOMIC_RELEASE);
    return itable_at(t, i);
}

void itable_erase(struct itable *t, size_t i, size_t j)
{
    memmove(itable_at(t, i), itable_at(t, j), (t->n - j) * t->size);
    __atomic_store_n(&t->n, t->n - (j - i), __ATOMIC_RELEASE);
}
