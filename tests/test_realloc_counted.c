/* What malloc_count and free_count say of realloc (lull/counters.h): every
 * realloc that returns a block is one allocation and, when it had a block,
 * one free of it, whether the block moves or is kept, so malloc_count -
 * free_count stays the number of live blocks. A kept block (a small one
 * resized within its class, a large one shrunk by at most half, a huge one
 * grown in place) was in neither count while a moved one was in both: a
 * program whose reallocs grew in place showed no allocation calls. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUNDS 64

typedef struct {
    uint64_t mallocs, frees;
} counts;

static counts now(void) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    return (counts){c.malloc_count, c.free_count};
}

/* The first lull_stats() starts the reclaim thread, whose creation
 * allocates and frees on this thread: the last of those frees counts at
 * the next call. Counted before a test's first figures. */
static void settle(void) {
    now();
    now();
}

/* ROUNDS reallocs of p between two sizes its block holds: each keeps it. */
static void realloc_kept(void *(*re)(void *, size_t), void *p, size_t a, size_t b) {
    for (int i = 0; i < ROUNDS; i++) {
        void *q = re(p, i % 2 ? a : b);
        cr_assert_eq(q, p, "realloc to %zu moved the block: no test of a kept one", i % 2 ? a : b);
    }
}

static void expect_counted(counts before, counts after, const char *what) {
    cr_expect_geq(after.mallocs - before.mallocs, ROUNDS,
                  "%s: %d reallocs that kept their block added %llu to malloc_count", what, ROUNDS,
                  (unsigned long long)(after.mallocs - before.mallocs));
    cr_expect_eq(after.mallocs - before.mallocs, after.frees - before.frees,
                 "%s: malloc_count +%llu, free_count +%llu: the live blocks changed", what,
                 (unsigned long long)(after.mallocs - before.mallocs),
                 (unsigned long long)(after.frees - before.frees));
}

static void small_and_large(void *(*re)(void *, size_t), const char *how) {
    char what[64];
    void *p = lull_malloc(100);
    size_t usable = lull_usable_size(p);
    settle();
    counts c0 = now();
    realloc_kept(re, p, usable, usable - 8);
    counts c1 = now();
    snprintf(what, sizeof what, "%s, a small block", how);
    expect_counted(c0, c1, what);
    lull_free(p);

    size_t big = (size_t)1 << 20; /* a large block: shrunk by less than half, kept */
    p = lull_malloc(big);
    c0 = now();
    realloc_kept(re, p, big, big - 4096);
    c1 = now();
    snprintf(what, sizeof what, "%s, a large block", how);
    expect_counted(c0, c1, what);
    lull_free(p);
}

/* The reference: a realloc that moves its block counts an allocation and a
 * free (it always did). */
Test(realloc_counted, a_moving_realloc_counts_one_malloc_and_one_free) {
    void *p = lull_malloc(16);
    settle();
    counts c0 = now();
    p = lull_realloc(p, 4096); /* another class: it moves */
    counts c1 = now();
    cr_expect_eq(c1.mallocs - c0.mallocs, 1, "malloc_count +%llu",
                 (unsigned long long)(c1.mallocs - c0.mallocs));
    cr_expect_eq(c1.frees - c0.frees, 1, "free_count +%llu",
                 (unsigned long long)(c1.frees - c0.frees));
    lull_free(p);
}

Test(realloc_counted, a_kept_block_counts_as_a_moved_one) {
    small_and_large(lull_realloc, "lull_realloc");
}

#ifdef LULL_OVERRIDE
/* the same through the exported symbol (this program links liblull.a) */
Test(realloc_counted, the_realloc_symbol_counts_a_kept_block) {
    small_and_large(realloc, "realloc");
}
#endif

/* A thread that reallocs a block of another thread and has allocated
 * nothing itself (it may have no heap of its own to count on). */
static int go[2], done[2];
static void *given;

static void *realloc_on_a_new_thread(void *arg) {
    (void)arg;
    char c;
    if (read(go[0], &c, 1) != 1) return NULL;
    size_t usable = lull_usable_size(given);
    for (int i = 0; i < ROUNDS; i++)
        if (lull_realloc(given, i % 2 ? usable : usable - 8) != given) return NULL;
    if (write(done[1], "x", 1) != 1) return NULL;
    return given;
}

Test(realloc_counted, a_thread_with_no_allocation_of_its_own_counts_a_kept_block) {
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(done), 0);
    given = lull_malloc(200);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, realloc_on_a_new_thread, NULL), 0);
    settle();
    counts c0 = now();
    cr_assert_eq(write(go[1], "x", 1), 1);
    char c;
    cr_assert_eq(read(done[0], &c, 1), 1, "the thread's realloc moved the block");
    counts c1 = now();
    void *kept;
    pthread_join(t, &kept);
    cr_assert_eq(kept, given);
    expect_counted(c0, c1, "another thread");
    lull_free(given);
}
