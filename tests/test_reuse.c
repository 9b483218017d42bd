/* Reuse lists (src/reuse.h): a thread that frees blocks of another heap's
 * spans hands them out again itself, still counted in use in their spans;
 * the lists are bounded, go home at a collect, and every block on them is
 * marked, so that a second free aborts (tests/test_free_errors.c has the
 * aborts). The main thread owns the blocks; one thread at a time frees. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/reuse.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define SIZE 256
#define N 8

/* the bound's tests allocate up to LULL_REUSE_MAX_BLOCKS + 8 */
#define OWNED_MAX (LULL_REUSE_MAX_BLOCKS + 8)
static void *owned[OWNED_MAX];
static void *got[OWNED_MAX];
static unsigned n_owned;

static void run_thread(void *(*fn)(void *)) {
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, NULL), 0);
    pthread_join(t, NULL);
}

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static void allocate_owned(unsigned n, size_t size) {
    cr_assert_leq(n, OWNED_MAX);
    n_owned = n;
    for (unsigned i = 0; i < n; i++) {
        owned[i] = lull_malloc(size);
        cr_assert_not_null(owned[i]);
        memset(owned[i], 0xab, size);
    }
}

/* ---- the freeing thread hands the blocks out again ------------------------ */

static uint32_t used_after_frees;

static void *free_then_malloc(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8)); /* a heap of its own */
    for (unsigned i = 0; i < n_owned; i++)
        lull_free(owned[i]);
    used_after_frees = lull_span_used(span_of(owned[0]));
    for (unsigned i = 0; i < n_owned; i++)
        got[i] = lull_malloc(SIZE);
    for (unsigned i = 0; i < n_owned; i++)
        lull_free(got[i]); /* its owner's blocks again: kept, then sent home at exit */
    return NULL;
}

Test(reuse, blocks_freed_by_another_thread_are_handed_out_again_by_it) {
    allocate_owned(N, SIZE);
    /* this thread's last free waits in its heap (the deferred free,
     * src/alloc.h), counted in its span: done now, before the count */
    lull_thread_collect();
    uint32_t used = lull_span_used(span_of(owned[0]));
    run_thread(free_then_malloc);
    /* still counted in use in the owner's span while the freer held them */
    cr_assert_eq(used_after_frees, used);
    /* last freed, first handed out */
    for (unsigned i = 0; i < N; i++)
        cr_assert_eq(got[i], owned[N - 1 - i], "malloc %u: %p, not the block freed %u-th (%p)", i,
                     got[i], N - i, owned[N - 1 - i]);
    /* the freer's exit sent them home: the owner's collect applies them */
    lull_thread_collect();
    cr_assert_eq(lull_span_used(span_of(owned[0])), used - N);
}

/* ---- calloc of a reused block is zeroed ----------------------------------- */

static void *free_then_calloc(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8));
    for (unsigned i = 0; i < n_owned; i++)
        lull_free(owned[i]);
    for (unsigned i = 0; i < n_owned; i++)
        got[i] = lull_calloc(1, SIZE);
    return NULL;
}

Test(reuse, calloc_of_a_reused_block_is_zeroed) {
    allocate_owned(N, SIZE);
    run_thread(free_then_calloc);
    for (unsigned i = 0; i < N; i++) {
        cr_assert_eq(got[i], owned[N - 1 - i]);
        const uint8_t *p = got[i];
        for (unsigned k = 0; k < SIZE; k++)
            cr_assert_eq(p[k], 0, "block %u, byte %u: %#x", i, k, p[k]);
        lull_free(got[i]);
    }
}

/* ---- bounds --------------------------------------------------------------- */

static unsigned kept_count, kept_bytes;
static unsigned class_of_size;

static void *free_all_and_look(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8));
    for (unsigned i = 0; i < n_owned; i++)
        lull_free(owned[i]);
    lull_heap *h = lull_tl_heap;
    kept_count = lull_reuse_count(h, class_of_size);
    kept_bytes = h->reuse_bytes;
    return NULL;
}

Test(reuse, a_class_keeps_at_most_its_block_bound) {
    allocate_owned(LULL_REUSE_MAX_BLOCKS + 8, SIZE);
    class_of_size = lull_class_of(SIZE);
    run_thread(free_all_and_look);
    cr_assert_eq(kept_count, LULL_REUSE_MAX_BLOCKS);
    cr_assert_eq(kept_bytes, LULL_REUSE_MAX_BLOCKS * lull_classes[class_of_size].block_size);
    lull_thread_collect();
}

Test(reuse, a_heap_keeps_at_most_its_byte_bound) {
    enum { BIG = 16384 }; /* LULL_REUSE_MAX_BLOCKS of them pass the byte bound */
    allocate_owned(LULL_REUSE_MAX_BLOCKS, BIG);
    class_of_size = lull_class_of(BIG);
    run_thread(free_all_and_look);
    uint32_t bs = lull_classes[class_of_size].block_size;
    cr_assert_lt(LULL_REUSE_MAX_BYTES / bs, LULL_REUSE_MAX_BLOCKS,
                 "the byte bound is not the one tested");
    cr_assert_eq(kept_count, LULL_REUSE_MAX_BYTES / bs);
    cr_assert_leq(kept_bytes, LULL_REUSE_MAX_BYTES);
    lull_thread_collect();
}

/* ---- a collect sends them home -------------------------------------------- */

static void *free_then_collect(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8));
    for (unsigned i = 0; i < n_owned; i++)
        lull_free(owned[i]);
    used_after_frees = lull_span_used(span_of(owned[0]));
    lull_thread_collect();
    kept_bytes = lull_tl_heap->reuse_bytes;
    return NULL;
}

Test(reuse, a_collect_sends_the_kept_blocks_to_their_owner) {
    allocate_owned(N, SIZE);
    uint32_t used = lull_span_used(span_of(owned[0]));
    run_thread(free_then_collect);
    cr_assert_eq(used_after_frees, used, "the frees came back before the freer sent them");
    cr_assert_eq(kept_bytes, 0);
    lull_thread_collect(); /* the owner applies its inbox */
    cr_assert_eq(lull_span_used(span_of(owned[0])), used - N);
}

/* ---- the direct table ----------------------------------------------------- */

static bool direct_before_batch, direct_waiting, direct_dry, direct_back;
static void *after_dry;

static void *look_at_direct(void *arg) {
    (void)arg;
    lull_free(lull_malloc(SIZE));
    lull_heap *h = lull_tl_heap;
    unsigned c = lull_class_of(SIZE), w = (SIZE + 7) >> 3;
    for (unsigned i = 0; i < LULL_REUSE_BATCH - 1; i++)
        lull_free(owned[i]);
    direct_before_batch = h->direct[w] == h->current[c];
    lull_free(owned[LULL_REUSE_BATCH - 1]);
    direct_waiting = h->direct[w] == &h->reuse[c];
    for (unsigned i = 0; i < LULL_REUSE_BATCH; i++)
        got[i] = lull_malloc(SIZE); /* malloc's fast path pops them */
    direct_dry = h->direct[w] == &h->reuse[c] && !h->reuse[c].free;
    after_dry = lull_malloc(SIZE); /* the slow path: back to the span */
    direct_back = h->direct[w] == h->current[c];
    lull_free(after_dry);
    for (unsigned i = 0; i < LULL_REUSE_BATCH; i++)
        lull_free(got[i]);
    lull_thread_collect();
    return NULL;
}

/* direct[] leads to the current span until a batch waits, then to the
 * class's list (malloc's fast path pops it), and back to the span at the
 * first malloc after the last */
Test(reuse, malloc_pops_the_list_once_a_batch_waits) {
    allocate_owned(LULL_REUSE_BATCH, SIZE);
    run_thread(look_at_direct);
    cr_assert(direct_before_batch, "direct[] pointed away before a batch waited");
    cr_assert(direct_waiting, "direct[] did not lead to the list with a batch kept");
    cr_assert(direct_dry, "direct[] left the list before a malloc found it dry");
    cr_assert(direct_back, "direct[] did not lead to the current span again");
    for (unsigned i = 0; i < LULL_REUSE_BATCH; i++)
        cr_assert_eq(got[i], owned[LULL_REUSE_BATCH - 1 - i]);
    for (unsigned i = 0; i < LULL_REUSE_BATCH; i++)
        cr_assert_neq(after_dry, owned[i], "a block handed out twice");
}

/* ---- fewer than a batch wait for the class's span to run dry --------------- */

static unsigned taken_before_dry;

static void *drain_own_span(void *arg) {
    (void)arg;
    lull_free(lull_malloc(SIZE)); /* a span of the class of its own, with free blocks */
    lull_free(owned[0]);
    /* its own span's blocks come first; the kept one once the span has none */
    taken_before_dry = 0;
    for (unsigned i = 0; i < 64; i++) {
        got[i] = lull_malloc(SIZE);
        if (got[i] == owned[0]) break;
        taken_before_dry++;
    }
    for (unsigned i = 0; i <= taken_before_dry && i < 64; i++)
        lull_free(got[i]);
    return NULL;
}

Test(reuse, a_single_kept_block_is_taken_when_the_span_runs_dry) {
    allocate_owned(1, SIZE);
    run_thread(drain_own_span);
    cr_log_info("%u blocks of its own span first", taken_before_dry);
    cr_assert_lt(taken_before_dry, 64, "the kept block was never handed out");
    cr_assert_gt(taken_before_dry, 0, "the kept block came before the span's own");
}

/* ---- a block of another segment goes on the class's second list ----------- */

#define BIG_BLOCK 16384
#define BIG_MAX 4096 /* 64 MiB: two segments' worth at the most */

static void *big[BIG_MAX];
static unsigned n_big;
static void *two_segments[2];
static unsigned kept_first, kept_other;
static void *got_two[2];

/* Blocks of BIG_BLOCK until one lies in another segment than the first. */
static void allocate_in_two_segments(void) {
    n_big = 0;
    two_segments[1] = NULL;
    while (n_big < BIG_MAX && !two_segments[1]) {
        big[n_big] = lull_malloc(BIG_BLOCK);
        cr_assert_not_null(big[n_big]);
        if (lull_segment_of(big[n_big]) != lull_segment_of(big[0])) two_segments[1] = big[n_big];
        n_big++;
    }
    two_segments[0] = big[0];
    cr_assert_not_null(two_segments[1], "no second segment after %u blocks", n_big);
}

static void *keep_two_segments(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8));
    unsigned c = lull_class_of(BIG_BLOCK);
    lull_free(two_segments[0]);
    lull_free(two_segments[1]);
    kept_first = lull_reuse_count(lull_tl_heap, c);
    kept_other = lull_tl_heap->reuse_other_count[c];
    got_two[0] = lull_malloc(BIG_BLOCK);
    got_two[1] = lull_malloc(BIG_BLOCK);
    lull_free(got_two[0]);
    lull_free(got_two[1]);
    return NULL;
}

Test(reuse, a_block_of_another_segment_is_kept_on_the_second_list) {
    allocate_in_two_segments();
    run_thread(keep_two_segments);
    cr_assert_eq(kept_first, 1);
    cr_assert_eq(kept_other, 1, "the other segment's block was not kept");
    cr_assert_eq(got_two[0], two_segments[0]);
    cr_assert_eq(got_two[1], two_segments[1]);
    lull_thread_collect();
    for (unsigned i = 1; i < n_big; i++)
        if (big[i] != two_segments[1]) lull_free(big[i]);
}
