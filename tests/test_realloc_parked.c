/* realloc() of a block its owner freed into a parking span
 * (src/span_park.h): the block is in the span's free bitmap, on no list,
 * so lull_check_live_block's walks of the lists did not find it, and a
 * size that fits kept it: realloc returned the freed block, which the
 * span's next refill handed out again. On a page still resident the
 * block's first word is a stale link; on a purged page it is 0, which does
 * not even look free. Each realloc runs in a forked child, which must die
 * of SIGABRT naming realloc() and the block. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/page_park.h"
#include "reclaim/reclaim.h"
#include "src/heap.h"
#include "src/span.h"
#include "src/size_class.h"
#include "src/span_park.h"
#include "tests/support/deferred_free.h"
#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIZE ((size_t)3072) /* 21 to a one-slice span; as test_page_park_edges */

static void setup(void) {
    lull_set_purge_delay_ms(-1); /* parked pages stay PENDING */
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static unsigned first_page_state(const lull_span *s) {
    const uint8_t *start = lull_span_start(s);
    unsigned slice = (unsigned)(((uintptr_t)start & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT);
    return lull_pages_word(lull_segment_of(start), slice) & 3;
}

static void *a[64];

/* A fresh span of SIZE's class filled, then its first 10 blocks freed: it
 * parks, and its first page (which holds only freed blocks) is parked.
 * Returns the first block. */
static void *freed_block_of_a_parking_span(lull_span **span) {
    a[0] = lull_malloc(SIZE);
    lull_span *A = span_of(a[0]);
    cr_assert_eq(A->kept, 0, "a kept span: this class was used before");
    for (unsigned i = 1; i < A->capacity; i++) {
        a[i] = lull_malloc(SIZE);
        cr_assert_eq(span_of(a[i]), A, "the blocks are not in one span");
    }
    for (unsigned i = 0; i < A->capacity; i++)
        memset(a[i], 0x5a, SIZE);
    void *x = lull_malloc(SIZE); /* A on the full list, armed */
    cr_assert_neq(span_of(x), A);
    for (size_t i = 0; i < 10; i++)
        lull_free(a[i]);
    complete_last_free();
    cr_assert(A->parking, "A does not park");
    cr_assert(lull_span_parking_has(A, a[0]));
    *span = A;
    return a[0];
}

/* Exit 3: the block realloc kept was handed out again; 5: realloc returned. */
static void realloc_freed(void *p) {
    void *q = lull_realloc(p, SIZE);
    for (int i = 0; q == p && i < 64; i++)
        if (lull_malloc(SIZE) == p) _exit(3);
    _exit(5);
}

static void expect_realloc_abort(void *p, void (*child)(void *)) {
    child_result r;
    run_in_child(child, p, &r);
    cr_assert_not(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 3,
                  "realloc(%p) kept the freed block, and malloc handed it out again", p);
    expect_abort(&r, p, "was freed");
    cr_assert_not_null(strstr(r.err, "realloc()"), "stderr: '%s'", r.err);
}

static void *realloc_freed_on_a_thread(void *p) {
    realloc_freed(p);
    return NULL;
}

/* The same realloc by another thread, which may not read the bitmap. Not
 * joined: the child exits under it (as test_page_park_edges, for TSan). */
static void realloc_freed_by_another_thread(void *p) {
    pthread_t t;
    if (pthread_create(&t, NULL, realloc_freed_on_a_thread, p) != 0) _exit(6);
    for (;;)
        pause();
}

Test(realloc_parked, realloc_of_a_freed_block_on_a_pending_page_aborts, .init = setup) {
    lull_span *A;
    void *p = freed_block_of_a_parking_span(&A);
    cr_assert_eq(first_page_state(A), LULL_PAGE_PENDING);
    expect_realloc_abort(p, realloc_freed);
}

Test(realloc_parked, realloc_of_a_freed_block_on_a_purged_page_aborts, .init = setup) {
    lull_span *A;
    void *p = freed_block_of_a_parking_span(&A);
    lull_set_purge_delay_ms(0);
    for (int t = 0; t < 100 && first_page_state(A) != LULL_PAGE_PURGED; t++)
        cr_assert(lull_reclaim_now());
    cr_assert_eq(first_page_state(A), LULL_PAGE_PURGED);
    lull_set_purge_delay_ms(-1);
    cr_assert(lull_reclaim_now());
    expect_realloc_abort(p, realloc_freed);
    expect_realloc_abort(p, realloc_freed_by_another_thread);
}

/* a live block of the same span is still reallocated in place */
Test(realloc_parked, realloc_of_a_live_block_of_a_parking_span_keeps_it, .init = setup) {
    lull_span *A;
    freed_block_of_a_parking_span(&A);
    cr_assert_eq(lull_realloc(a[10], SIZE), a[10]);
    cr_assert_eq(lull_realloc(a[A->capacity - 1], SIZE - 16), a[A->capacity - 1]);
}
