/* The sorted interval table (intervals.h). */
#include <stdlib.h>
#include <string.h>

#include "intervals.h"

void itable_overlapping(const struct itable *t, uint64_t start, uint64_t end, size_t *i_out, size_t *j_out)
{
    size_t j = itable_upper(t, end - 1); /* first with start > end-1, i.e. start >= end */
    size_t i = itable_upper(t, start);
    if (i > 0 && itable_iv(t, i - 1)->end > start)
        i--;
    *i_out = i;
    *j_out = j < i ? i : j;
}

void *itable_insert(struct itable *t, const void *elem)
{
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 256;
        char *v = realloc(t->v, cap * t->size);
        if (!v)
            return NULL;
        t->v = v;
        t->cap = cap;
    }
    size_t i = itable_upper(t, ((const struct interval *)elem)->start);
    memmove(itable_at(t, i + 1), itable_at(t, i), (t->n - i) * t->size);
    memcpy(itable_at(t, i), elem, t->size);
    t->n++;
    return itable_at(t, i);
}

void itable_erase(struct itable *t, size_t i, size_t j)
{
    memmove(itable_at(t, i), itable_at(t, j), (t->n - j) * t->size);
    t->n -= j - i;
}
