/* Page parking at its edges (src/span_park.c, numa/page_park.c and their
 * callers): spans that empty, collect remote frees or meet a page being
 * purged while they park, and double frees of blocks on parked pages.
 * Each test drives one exact sequence; no timing: where a page must be
 * PURGING, the test claims and finishes it as the reclaim thread would,
 * with the purge delay at never so that the real thread claims nothing. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/types.h"
#include "numa/page_park.h"
#include "reclaim/reclaim.h"
#include "src/heap.h"
#include "src/span.h"
#include "src/size_class.h"
#include "tests/support/deferred_free.h"
#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* A fresh span of `size`'s class, filled: its capacity of blocks (at most
 * 64) in a[], every one in that span, and the span not one the heap kept
 * from before (whose pages would not start as the test expects). */
static lull_span *fill_a_span(void **a, size_t size) {
    a[0] = lull_malloc(size);
    lull_span *A = span_of(a[0]);
    cr_assert_eq(A->kept, 0, "a kept span: this class was used before");
    cr_assert_leq(A->capacity, 64);
    for (unsigned i = 1; i < A->capacity; i++) {
        a[i] = lull_malloc(size);
        cr_assert_eq(span_of(a[i]), A, "the blocks are not in one span");
    }
    return A;
}

/* ---- a thread that frees after lull's heap destructor ran ---------------- */

static pthread_key_t late_key;
static void **late_blocks;
static size_t late_count;

/* runs after lull's key destructor (a key created later): the thread has no
 * heap any more, so each free is a remote free onto the span's own list
 * (remote_free in src/alloc.c), not a message */
static void late_free_destructor(void *value) {
    (void)value;
    for (size_t i = 0; i < late_count; i++)
        lull_free(late_blocks[i]);
}

static void *late_thread(void *arg) {
    (void)arg;
    lull_free(lull_malloc(32)); /* a heap, which lull's destructor abandons */
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

/* A parking span, alone in its class's queue, whose last blocks come back
 * as remote frees on its own list: the owner's collection
 * (lull_heap_collect_remote) finds it empty. span_releasable() stops the
 * parking without threading the bitmap's blocks (thread = false), then
 * span_empty() keeps the span (it is the class's only one) and calls
 * lull_span_unpark(span, true), which returns at once for a span no longer
 * parking: a kept span with every block free and none on its list.
 * Returns that span, after the blocks were freed remotely (not collected
 * yet). */
#define SIZE ((size_t)3072) /* 21 to a one-slice span; a class the runner does not use */

static lull_span *parking_span_emptied_remotely(void) {
    cr_assert_eq(pthread_key_create(&late_key, late_free_destructor), 0);
    lull_heap *h = lull_tl_heap;
    static void *a[64];
    lull_span *A = fill_a_span(a, SIZE);
    const unsigned cap = A->capacity, park_start = lull_classes[A->size_class].park_start;
    cr_assert(park_start > 0);
    size_t n = cap;
    for (size_t i = 0; i < n; i++)
        memset(a[i], 0x5a, SIZE);
    /* the refill finds A full: A goes on the full list, armed */
    void *x = lull_malloc(SIZE);
    cr_assert_neq(span_of(x), A);
    cr_assert(lull_span_in_full(A));
    cr_assert_eq(A->park_at, park_start);
    /* frees from full down to park_start: A parks */
    size_t first_live = cap - park_start;
    for (size_t i = 0; i < first_live; i++)
        lull_free(a[i]);
    complete_last_free();
    cr_assert(A->parking, "A does not park (park_at %u, used %u)", A->park_at, lull_span_used(A));
    cr_assert(!lull_span_in_full(A));
    /* the other span empties, not alone in its queue: released */
    lull_free(x);
    complete_last_free();
    cr_assert_eq(h->queue[A->size_class].head, A);
    cr_assert_null(A->next, "A is not alone in its queue");

    /* A's other blocks come back as remote frees on A's own list */
    late_blocks = &a[first_live];
    late_count = n - first_live;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, late_thread, NULL), 0);
    pthread_join(t, NULL);
    cr_assert(atomic_load(&A->thread_free) & LULL_REMOTE_QUEUED,
              "the frees did not go onto A's remote list");
    return A;
}

Test(page_park_edges, an_empty_parking_span_collected_remotely_keeps_its_blocks, .init = setup) {
    lull_heap *h = lull_tl_heap;
    lull_span *A = parking_span_emptied_remotely();
    const unsigned cap = A->capacity;
    /* the next allocations collect them: A empties; every block of it is
     * free, so `cap` blocks need no new span */
    uint64_t taken0 = h->spans_taken;
    void *b[64];
    for (size_t i = 0; i < cap; i++) {
        b[i] = lull_malloc(SIZE);
        cr_assert_not_null(b[i]);
    }
    cr_assert_eq(h->spans_taken, taken0,
                 "%llu new span(s) for %u blocks; A (%p): used %u, free list %p, parking %u, "
                 "kept %u, on the full list %d: its %u free blocks are on no list",
                 (unsigned long long)(h->spans_taken - taken0), cap, (void *)A, lull_span_used(A),
                 (void *)A->free, A->parking, A->kept, lull_span_in_full(A),
                 A->carved - lull_span_used(A));
    for (size_t i = 0; i < cap; i++)
        lull_free(b[i]);
}

/* Every span on the heap's lists is a small span of this heap. */
static void check_lists(lull_heap *h, const char *when) {
    for (lull_span *s = h->full.head; s; s = s->next)
        cr_assert(atomic_load(&s->heap) == h && s->kind == LULL_SPAN_SMALL,
                  "%s: span %p on the full list is not this heap's small span (heap %p, kind %u)",
                  when, (void *)s, (void *)atomic_load(&s->heap), s->kind);
    for (unsigned c = 0; c < LULL_CLASSES; c++)
        for (lull_span *s = h->queue[c].head; s; s = s->next)
            cr_assert(atomic_load(&s->heap) == h && s->kind == LULL_SPAN_SMALL &&
                          s->size_class == c,
                      "%s: span %p in class %u's queue is not this heap's small span of the "
                      "class (heap %p, kind %u, class %u)",
                      when, (void *)s, c, (void *)atomic_load(&s->heap), s->kind, s->size_class);
}

/* The same span, kept while on the full list, is evicted from its slot
 * later (other classes' spans empty and are kept): evict() finds it
 * releasable, removes it from its class's queue (it is on the full list)
 * and releases it, and the full list still leads to it. */
Test(page_park_edges, an_evicted_kept_span_leaves_no_released_span_on_the_full_list,
     .init = setup) {
    lull_heap *h = lull_tl_heap;
    lull_span *A = parking_span_emptied_remotely();
    void *b = lull_malloc(SIZE); /* collects: A kept, listless, then on the full list */
    cr_assert_not_null(b);
    cr_log_info("A: kept %u, in full %d, used %u", A->kept, lull_span_in_full(A),
                lull_span_used(A));
    check_lists(h, "before the evictions");
    /* spans of other classes, each alone, empty and are kept until A's
     * slot comes round */
    static const size_t sizes[] = {2304,  2560,  2816,  3328,  3584,  3840,  4608,  5120,  5632,
                                   6144,  6656,  7168,  7680,  8192,  9216,  10240, 11264, 12288,
                                   13312, 14336, 15360, 16384, 18432, 20480, 22528, 24576};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && A->kept; i++) {
        void *p = lull_malloc(sizes[i]);
        cr_assert_not_null(p);
        lull_free(p);
        complete_last_free();
    }
    cr_assert_eq(A->kept, 0, "A was never evicted");
    /* (fixed: A, in use, just stops being kept) */
    check_lists(h, "after A's eviction");
    lull_free(b);
}

/* ---- a page the reclaim thread is purging ------------------------------- */

/* The reclaim thread's claim, done here (its own ticks claim nothing: the
 * purge delay is "never"): every PENDING page of the segment -> PURGING. */
static size_t claim_segment(lull_segment *seg, lull_page_run *runs, size_t max) {
    size_t n = lull_pages_claim_all(seg, NULL, runs, max);
    cr_assert_gt(n, 0, "nothing to claim");
    return n;
}

static void finish_runs(lull_page_run *runs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len;
        void *addr = lull_page_run_address(&runs[i], &len);
        cr_assert_eq(madvise(addr, len, MADV_DONTNEED), 0);
        lull_pages_finish(&runs[i], true);
    }
}

/* A parking span whose last block is freed while one of its pages is
 * PURGING stays in its queue, parking (span_empty: "until a later
 * refill"). The refill that comes while the page is still PURGING cannot
 * take it back either, and refill_from() moves the span to the full list:
 * empty, parking, and on a list that only a free into the span (none can
 * come: no block is in use) or the thread's exit looks at. After the
 * purge finished, the span's blocks are never used again and its slices
 * never go back. */
Test(page_park_edges, an_empty_span_met_purging_twice_is_not_lost_on_the_full_list, .init = setup) {
    lull_heap *h = lull_tl_heap;
    static void *a[64];
    lull_span *A = fill_a_span(a, SIZE);
    const unsigned cap = A->capacity, park_start = lull_classes[A->size_class].park_start;
    size_t n = cap;
    void *x = lull_malloc(SIZE); /* A on the full list, armed */
    cr_assert(lull_span_in_full(A));
    /* every block but the last: A parks on the way */
    for (size_t i = 0; i + 1 < n; i++)
        lull_free(a[i]);
    complete_last_free();
    cr_assert(A->parking && A->parked_pages > 0, "A: parking %u, %u pages parked (park_start %u)",
              A->parking, A->parked_pages, park_start);
    lull_page_run runs[256];
    size_t nruns = claim_segment(lull_segment_of(a[0]), runs, 256);
    /* the last block: A empties while a page is PURGING */
    lull_free(a[n - 1]);
    complete_last_free();
    cr_assert_eq(lull_span_used(A), 0);
    cr_assert(A->parking, "A was released or unparked with a PURGING page");
    /* x's span fills; the refill after it meets A, still PURGING */
    static void *b[128];
    size_t nb = 0;
    lull_span *X = span_of(x);
    while (X->free || X->carved < X->capacity) {
        b[nb++] = lull_malloc(SIZE);
        cr_assert_eq(span_of(b[nb - 1]), X);
    }
    void *y = lull_malloc(SIZE); /* the refill: A cannot be taken back */
    cr_assert_neq(span_of(y), A);
    /* the purge finishes */
    finish_runs(runs, nruns);
    cr_log_info("A after the purge: parking %u, in full %d, used %u, parked pages %u", A->parking,
                lull_span_in_full(A), lull_span_used(A), A->parked_pages);
    /* y's span fills; the next refill can take A back now: A's blocks, no
     * new span */
    lull_span *Y = span_of(y);
    while (Y->free || Y->carved < Y->capacity) {
        b[nb++] = lull_malloc(SIZE);
        cr_assert_eq(span_of(b[nb - 1]), Y);
    }
    uint64_t taken0 = h->spans_taken;
    void *z = lull_malloc(SIZE);
    cr_assert_eq(h->spans_taken, taken0,
                 "a new span while A (%p), empty, holds %u free blocks: parking %u, on the full "
                 "list %d, %u pages parked",
                 (void *)A, cap, A->parking, lull_span_in_full(A), A->parked_pages);
    cr_assert_eq(span_of(z), A);
    lull_free(z);
    lull_free(y);
    lull_free(x);
    for (size_t i = 0; i < nb; i++)
        lull_free(b[i]);
}

/* ---- remote frees that land exactly on park_at --------------------------- */

/* An armed span (on the full list, park_at = park_start) whose remote
 * frees, collected at once (span_merge_remote -> lull_span_unuse), bring
 * its count in use to exactly park_at: unuse moves park_at only when it is
 * above the new count, so `used` (counted down to park_at) is left at 0 and
 * no park starts. The owner's next free decrements it past zero: 0 ->
 * 0xffffffff, the slow-free bit set by the borrow and the count in its
 * other 31 bits. lull_span_used() reads about 2^31 from then on, the span
 * never reads empty and never goes back. */
Test(page_park_edges, remote_frees_down_to_exactly_park_at_keep_the_count_right, .init = setup) {
    cr_assert_eq(pthread_key_create(&late_key, late_free_destructor), 0);
    const size_t size = 2816; /* 23 to a one-slice span */
    static void *a[64];
    lull_span *A = fill_a_span(a, size);
    const unsigned cap = A->capacity, park_start = lull_classes[A->size_class].park_start;
    cr_assert(park_start > 0 && park_start < cap);
    size_t n = cap;
    for (size_t i = 0; i < n; i++)
        memset(a[i], 0x5a, size);
    void *x = lull_malloc(size); /* A on the full list, armed */
    cr_assert(lull_span_in_full(A));
    cr_assert_eq(A->park_at, park_start);
    /* cap - park_start blocks freed by a thread without a heap: onto A's
     * own remote list */
    late_blocks = a;
    late_count = cap - park_start;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, late_thread, NULL), 0);
    pthread_join(t, NULL);
    /* collected by the owner (lull_thread_collect: its heap's remote
     * frees, as any collection) */
    lull_thread_collect();
    cr_assert_eq(atomic_load(&A->thread_free), 0, "A's remote frees were not collected");
    cr_log_info("after the collection: used word %#x, park_at %u, in use %u, parking %u", A->used,
                A->park_at, lull_span_used(A), A->parking);
    /* every other block of A, freed by its owner: A empties */
    for (size_t i = cap - park_start; i < n; i++) {
        lull_free(a[i]);
        complete_last_free();
        cr_assert_leq(lull_span_used(A), cap,
                      "after the free of block %zu: A's count in use reads %u (used word %#x, "
                      "park_at %u), capacity %u",
                      i, lull_span_used(A), A->used, A->park_at, cap);
    }
    cr_assert(atomic_load(&A->heap) == NULL || lull_span_used(A) == 0,
              "A never reads empty: in use %u (used word %#x, park_at %u)", lull_span_used(A),
              A->used, A->park_at);
    lull_free(x);
}

/* ---- thread exit with a page being purged --------------------------------- */

static pthread_barrier_t phase;
static lull_span *exit_span;
static void *exit_blocks[64];
static size_t exit_n;

static void *park_then_exit(void *arg) {
    (void)arg;
    lull_span *A = fill_a_span(exit_blocks, SIZE);
    exit_n = A->capacity;
    void *x = lull_malloc(SIZE); /* A on the full list, armed */
    cr_assert(lull_span_in_full(A));
    for (size_t i = 0; i + 1 < exit_n; i++)
        lull_free(exit_blocks[i]);
    lull_free(x);
    complete_last_free();
    cr_assert(A->parking && A->parked_pages);
    exit_span = A;
    pthread_barrier_wait(&phase); /* the main thread claims A's pages */
    pthread_barrier_wait(&phase);
    lull_free(exit_blocks[exit_n - 1]); /* A empties: a page PURGING */
    complete_last_free();
    return NULL; /* the heap is collected and abandoned with A in it */
}

/* A thread's span empties while a page of it is PURGING, and the thread
 * exits before the purge ends: span_empty() and the exit's collection
 * (lull_heap_collect(h, true)) both leave it, parking, in the heap's queue
 * ("until a later refill or collection"). The heap is abandoned: nobody
 * refills from it, and the reclaim thread collects an abandoned heap only
 * when remote frees wait for it. After the purge ends, the span, empty,
 * never goes back to its arena. */
Test(page_park_edges, an_exited_threads_span_emptied_while_purging_goes_back, .init = setup) {
    pthread_barrier_init(&phase, NULL, 2);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, park_then_exit, NULL), 0);
    pthread_barrier_wait(&phase);
    lull_span *A = exit_span;
    lull_page_run runs[256];
    size_t nruns = claim_segment(lull_segment_of(exit_blocks[0]), runs, 256);
    pthread_barrier_wait(&phase);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(lull_span_used(A), 0);
    cr_log_info("after the exit: A heap %p, parking %u, %u pages parked",
                (void *)atomic_load(&A->heap), A->parking, A->parked_pages);
    finish_runs(runs, nruns);
    lull_set_purge_delay_ms(0);
    unsigned ticks = 0;
    for (; ticks < 50 && atomic_load(&A->heap) != NULL; ticks++)
        cr_assert(lull_reclaim_now());
    cr_assert_null(atomic_load(&A->heap),
                   "after %u ticks the exited thread's empty span %p is still in use "
                   "(parking %u, %u pages parked, used %u)",
                   ticks, (void *)A, A->parking, A->parked_pages, lull_span_used(A));
}

/* ---- a take-back that fails half way --------------------------------------- */

static unsigned page_state_at(const lull_span *s, size_t page) {
    uint8_t *start = lull_span_start(s);
    const void *p = start + page * LULL_PAGE_SIZE;
    unsigned slice = (unsigned)(((uintptr_t)p & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT);
    return lull_pages_word(lull_segment_of(p), slice) >> (2 * (page % LULL_PAGES_PER_SLICE)) & 3;
}

/* A refill meets a parking span with some pages PURGING and others
 * PENDING. lull_span_unpark() takes the PENDING ones back (NONE) before it
 * finds the PURGING ones, and the span goes on parking: the pages taken
 * back hold no live block, but their live count is already 0, so no free
 * parks them again. They stay resident (and, when they were PURGED, counted
 * resident again by the take-back) until the span is taken back whole. */
Test(page_park_edges, pages_taken_back_by_a_failed_unpark_are_parked_again, .init = setup) {
    static void *a[64];
    lull_span *A = fill_a_span(a, SIZE);
    cr_assert_eq(A->capacity, 21);
    size_t n = A->capacity;
    void *x = lull_malloc(SIZE); /* A on the full list, armed */
    /* blocks 0-9 (bytes 0-30719): pages 0-6 park */
    for (size_t i = 0; i < 10; i++)
        lull_free(a[i]);
    complete_last_free();
    cr_assert(A->parking);
    lull_page_run runs[256];
    size_t nruns = claim_segment(lull_segment_of(a[0]), runs, 256); /* pages 0-6 PURGING */
    /* blocks 10-13 (bytes 30720-43007): pages 7-9 park, PENDING */
    for (size_t i = 10; i < 14; i++)
        lull_free(a[i]);
    complete_last_free();
    for (size_t p = 7; p <= 9; p++)
        cr_assert_eq(page_state_at(A, p), LULL_PAGE_PENDING, "page %zu", p);
    /* a refill meets A: x's span fills first */
    lull_span *X = span_of(x);
    static void *b[128];
    size_t nb = 0;
    while (X->free || X->carved < X->capacity)
        b[nb++] = lull_malloc(SIZE);
    void *y = lull_malloc(SIZE);
    cr_assert(A->parking, "A was taken back with a page PURGING");
    finish_runs(runs, nruns);
    lull_set_purge_delay_ms(0);
    for (int t = 0; t < 3; t++)
        cr_assert(lull_reclaim_now());
    for (size_t p = 7; p <= 9; p++)
        cr_assert_neq(page_state_at(A, p), LULL_PAGE_NONE,
                      "page %zu of A holds no live block, A parks (%u pages parked), and the "
                      "page is resident: taken back by the failed unpark, never parked again",
                      p, A->parked_pages);
    lull_free(y);
    lull_free(x);
    for (size_t i = 0; i < nb; i++)
        lull_free(b[i]);
    for (size_t i = 14; i < n; i++)
        lull_free(a[i]);
}

/* ---- a remote double free of a purged block ------------------------------- */

static void *remote_q;
static atomic_bool remote_done;

static void *remote_double_free(void *p) {
    lull_free(lull_malloc(32)); /* a heap of its own: its frees of others' blocks are kept */
    lull_free(p);               /* the second free of p */
    remote_q = lull_malloc(SIZE);
    atomic_store(&remote_done, true);
    while (true) /* the child exits under it */
        pause();
    return NULL;
}

/* The thread is not joined: under ThreadSanitizer the parent's threads stay
 * in its registry after fork, a thread created here may get one of their
 * pthread_t, and the join makes TSan die ("dup thread with used id"; as in
 * test_free_errors). The child waits for its flag instead. */
static void double_free_in_child(void *p) {
    pthread_t t;
    if (pthread_create(&t, NULL, remote_double_free, p) != 0) _exit(5);
    while (!atomic_load(&remote_done))
        sched_yield();
    /* the owner's allocations: its span is taken back, and p with it */
    for (int i = 0; i < 64; i++) {
        void *q = lull_malloc(SIZE);
        if (q == remote_q) {
            fprintf(stderr, "block %p handed out twice: to the other thread, then to its owner\n",
                    q);
            _exit(3);
        }
    }
    fprintf(stderr, "not detected (the other thread got %p)\n", remote_q);
    _exit(2);
}

/* A span of SIZE's class filled, its first 10 blocks freed: it parks, and
 * its first page holds only free blocks. Returns the first block. */
static void *a_parking_span(lull_span **span) {
    static void *a[64];
    lull_span *A = fill_a_span(a, SIZE);
    size_t n = A->capacity;
    for (size_t i = 0; i < n; i++)
        memset(a[i], 0x5a, SIZE);
    void *x = lull_malloc(SIZE);
    (void)x;
    for (size_t i = 0; i < 10; i++)
        lull_free(a[i]);
    complete_last_free();
    cr_assert(A->parking);
    *span = A;
    return a[0];
}

/* A second free of p, a block on a page given back, by another thread (in
 * a child): it must abort. */
static void expect_remote_double_free_caught(void *p) {
    child_result r;
    run_in_child(double_free_in_child, p, &r);
    cr_assert(WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGABRT,
              "the second free of %p by another thread was not caught (exit %d): %s", p,
              WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1, r.err);
}

/* Another thread frees, a second time, a block of a parking span whose
 * page was purged. Its first word is zero, not a link: lull_free_other's
 * fast path (lull_block_looks_free false) kept it on the thread's reuse
 * list, and the thread's next malloc handed it out, while the block was
 * still in its span's free bitmap. On a PENDING page (a stale link) or an
 * unparked span (a listed link) the same double free aborted already. */
Test(page_park_edges, a_remote_double_free_of_a_purged_block_aborts, .init = setup) {
    lull_span *A;
    void *p = a_parking_span(&A);
    lull_set_purge_delay_ms(0);
    for (int t = 0; t < 100 && page_state_at(A, 0) != LULL_PAGE_PURGED; t++)
        cr_assert(lull_reclaim_now());
    cr_assert_eq(page_state_at(A, 0), LULL_PAGE_PURGED);
    lull_set_purge_delay_ms(-1);
    cr_assert(lull_reclaim_now());
    expect_remote_double_free_caught(p);
}

/* The same double free on a PENDING page. */
Test(page_park_edges, a_remote_double_free_of_a_pending_block_aborts, .init = setup) {
    lull_span *A;
    void *p = a_parking_span(&A);
    cr_assert_eq(page_state_at(A, 0), LULL_PAGE_PENDING);
    expect_remote_double_free_caught(p);
}
