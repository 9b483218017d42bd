/* Which span a refill makes current (src/alloc.c, lull_class_refill): the
 * front of the class's queue (the span a free made non-full last), unless
 * the class has many spans queued and the front has almost nothing free:
 * then the back (the span that came free longest ago). Front only, in a
 * large heap whose spans are nearly full, malloc took one block a refill
 * (bench_throughput st with 300,000 live blocks: 101 ns an operation
 * instead of 61). */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>

#define SIZE 1536 /* a class no other part of the process uses */
#define SPANS 12  /* more than lull_class_refill's "many" (8) */

static void init(void) {
    lull_set_purge_delay_ms(-1);
}

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

Test(span_order, a_refill_in_a_large_class_passes_over_a_front_span_with_one_free_block,
     .init = init) {
    unsigned c = lull_class_of(SIZE);
    uint32_t capacity = lull_classes[c].capacity;
    enum { MAX_BLOCKS = 4096 };
    cr_assert_lt(capacity * (SPANS + 2), (uint32_t)MAX_BLOCKS, "capacity %u", capacity);
    static void *blocks[MAX_BLOCKS];
    static bool live[MAX_BLOCKS];
    lull_heap *h = lull_tl_heap;
    /* fill spans until SPANS of them are wholly the test's and full (a
     * refill found each so: they are on the heap's full list), then take
     * what the current span has left (on its list and not carved yet), so
     * that it has no free block */
    size_t n = 0;
    while (n < (size_t)capacity * (SPANS + 1) || h->current[c]->free ||
           h->current[c]->carved < h->current[c]->capacity) {
        cr_assert_lt(n, (size_t)MAX_BLOCKS);
        blocks[n] = lull_malloc(SIZE);
        cr_assert_not_null(blocks[n]);
        live[n++] = true;
        h = lull_tl_heap;
    }
    lull_span *current = h->current[c];
    /* the full spans wholly the test's, in the order malloc filled them */
    lull_span *full[SPANS + 2];
    size_t first[SPANS + 2];
    int nfull = 0;
    for (size_t i = 0; i < n;) {
        lull_span *s = span_of(blocks[i]);
        size_t j = i;
        while (j < n && span_of(blocks[j]) == s)
            j++;
        if (j - i == capacity && s != current) {
            cr_assert(lull_span_in_full(s), "a full span is not on the full list");
            full[nfull] = s, first[nfull++] = i;
        }
        i = j;
    }
    cr_assert_geq(nfull, 10, "only %d full spans", nfull);
    /* a block of the current span freed, so that it stays current; six of
     * the first full span (to the front, then passed by the others); one
     * of each of nine others (each to the front, with one block free) */
    size_t own = n - 1;
    cr_assert_eq(span_of(blocks[own]), current);
    lull_free(blocks[own]);
    live[own] = false;
    for (size_t i = first[0]; i < first[0] + 6; i++) {
        lull_free(blocks[i]);
        live[i] = false;
    }
    for (int k = 1; k < 10; k++) {
        lull_free(blocks[first[k]]);
        live[first[k]] = false;
    }
    cr_assert_eq(h->current[c], current, "a free into a full span made it current");
    cr_assert_geq(h->queue[c].count, 8u, "only %u spans queued", h->queue[c].count);
    /* the current span's own block first, then a refill: the front span
     * has one block free, so the refill takes the span that gathered six */
    void *p = lull_malloc(SIZE);
    cr_assert_eq(p, blocks[own]);
    live[own] = true;
    void *q = lull_malloc(SIZE);
    cr_assert_eq(span_of(q), full[0],
                 "the refill took span %p, not the one with six blocks free (%p)",
                 (void *)span_of(q), (void *)full[0]);
    for (size_t i = first[0]; i < first[0] + 6; i++)
        if (blocks[i] == q) live[i] = true;
    for (size_t i = 0; i < n; i++)
        if (live[i]) lull_free(blocks[i]);
}
