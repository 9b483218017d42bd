/* Empty spans a heap keeps (src/heap.c): a thread that mallocs and frees one
 * block in a loop keeps its span instead of trading slices with the arena,
 * but what a heap keeps while empty is bounded, since the reclaim thread
 * cannot reach it and an idle thread never gives it back. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/size_class.h"

#include <criterion/criterion.h>
#include <stdint.h>

static void init(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    /* started now: an allocation starts a wanted reclaim thread, and
     * pthread_create's own allocations would count in a loop below */
    cr_assert(lull_reclaim_now());
}

Test(heap_kept, a_malloc_free_loop_keeps_its_span, .init = init) {
    static const size_t sizes[] = {32, 4000, 100000, 300000};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        lull_heap *h = lull_tl_heap;
        char *p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        lull_free(p);
        uint64_t taken = h->spans_taken;
        for (int i = 0; i < 1000; i++) {
            p = lull_malloc(sizes[k]);
            cr_assert_not_null(p);
            p[0] = 1;
            lull_free(p);
        }
        cr_assert_eq(h->spans_taken, taken, "%zu-byte loop took %llu spans from the arena",
                     sizes[k], (unsigned long long)(h->spans_taken - taken));
    }
}

/* Blocks of every size class, all freed: the empty spans the heap still
 * holds stay within LULL_KEPT_EMPTY_MAX, and the others went to the arena. */
Test(heap_kept, empty_spans_kept_are_bounded, .init = init) {
    enum { PER_CLASS = 3 };
    static void *blocks[LULL_CLASSES][PER_CLASS];
    size_t span_bytes = 0;
    for (unsigned c = 1; c < lull_class_count; c++) {
        span_bytes += (size_t)lull_classes[c].span_slices * (64 << 10);
        for (int i = 0; i < PER_CLASS; i++) {
            blocks[c][i] = lull_malloc(lull_classes[c].block_size);
            cr_assert_not_null(blocks[c][i]);
        }
    }
    cr_assert_gt(span_bytes, 4 * LULL_KEPT_EMPTY_MAX, "the test needs more than the bound");
    for (unsigned c = 1; c < lull_class_count; c++)
        for (int i = 0; i < PER_CLASS; i++)
            lull_free(blocks[c][i]);
    lull_heap *h = lull_tl_heap;
    cr_assert_leq(h->kept_bytes, LULL_KEPT_EMPTY_MAX);
    /* count what is really held: spans of the heap's queues with no block in use */
    size_t held = 0;
    for (unsigned c = 1; c < lull_class_count; c++)
        for (lull_span *s = h->queue[c].head; s; s = s->next)
            if (s->used == 0) held += (size_t)s->slice_count << LULL_SLICE_SHIFT;
    cr_assert_leq(held, LULL_KEPT_EMPTY_MAX, "the heap holds %zu bytes of empty spans", held);
    size_t kept = 0;
    for (unsigned i = 0; i < LULL_KEPT_SLOTS; i++)
        if (h->kept[i]) {
            cr_assert_eq(h->kept[i]->kept, i + 1, "slot %u and its span disagree", i);
            kept += (size_t)h->kept[i]->slice_count << LULL_SLICE_SHIFT;
        }
    cr_assert_eq(kept, h->kept_bytes);
    cr_assert_leq(held, kept, "empty spans held that are not in the kept ring");
}
