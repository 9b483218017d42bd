/* The statistics' huge_unmapped_bytes count every byte of huge address
 * space lull gives back with munmap, whoever unmaps it: a freed block's
 * whole mapping (huge_unmapped counts those mappings), and the tail of a
 * block realloc shrank in place (numa/huge.h, lull_huge_shrink_in_place),
 * which the reclaim thread purges and unmaps at its next tick. That unmap
 * was counted nowhere: `mapped` went down by the tail while
 * huge_unmapped_bytes stayed where it was. Nor were the unmaps made on
 * the freeing thread when no reclaim thread runs (inline_purge=on): a
 * freed block and a tail, both gone from `mapped`, neither counted.
 *
 * Event-bounded: lull_reclaim_now() returns after a tick that started
 * after the call, and a tick gives every queued tail back first; an
 * inline unmap is done when its free or realloc returns. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define BIG (40 * MiB)
#define SMALL (10 * MiB + 100)

static struct lull_counters stats(void) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    return c;
}

static uint64_t purged_bytes(const struct lull_counters *c) {
    uint64_t sum = 0;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        sum += c->purge_bytes[k];
    return sum;
}

static void setup(void) {
    /* the cache keeps what is freed here until the test is done */
    cr_assert(lull_configure("huge_cache_idle_ms", "600000"));
    /* what the first huge malloc sets up, before any baseline */
    lull_free(lull_malloc(BIG));
    lull_purge_all();
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

Test(huge_unmapped_counted, a_shrunk_blocks_tail_counts_as_unmapped, .init = setup) {
    char *p = lull_malloc(BIG);
    cr_assert_not_null(p);
    for (size_t i = 0; i < BIG; i += 4096)
        p[i] = 1;
    size_t usable0 = lull_usable_size(p);
    struct lull_counters c0 = stats();
    char *q = lull_realloc(p, SMALL);
    cr_assert_eq(q, p, "the block moved");
    size_t given_up = usable0 - lull_usable_size(q); /* the block's pages in the tail */
    /* a tick that started after the realloc has given the tail back */
    cr_assert(lull_reclaim_now());
    struct lull_counters c1 = stats();
    uint64_t unmapped = c1.huge_unmapped_bytes - c0.huge_unmapped_bytes;
    uint64_t mapped_drop = c0.total.mapped - c1.total.mapped;
    uint64_t purged = purged_bytes(&c1) - purged_bytes(&c0);
    cr_log_info("tail: %llu bytes unmapped (mapped -%llu), %llu purged of %zu given up",
                (unsigned long long)unmapped, (unsigned long long)mapped_drop,
                (unsigned long long)purged, given_up);
    cr_assert_geq(mapped_drop, given_up, "the tail was not given back");
    cr_assert_eq(unmapped, mapped_drop, "huge_unmapped_bytes grew by %llu, mapped fell by %llu",
                 (unsigned long long)unmapped, (unsigned long long)mapped_drop);
    cr_assert_eq(c1.huge_unmapped, c0.huge_unmapped, "a tail is no mapping unmapped whole");
    /* the block's pages in it were purged before the unmap (all but the
     * stack node's page, which the unmap takes), and counted so */
    cr_assert_geq(purged, given_up - 4096, "purged %llu of the tail's %zu bytes",
                  (unsigned long long)purged, given_up);
    lull_free(q);
}

/* In a new process with no reclaim thread (its start fails) and
 * inline_purge=on: a huge block freed and another shrunk, each unmapped
 * on this thread. Prints what the statistics saw of it. */
static void inline_scenario(void) {
    if (lull_reclaim_now()) _exit(4); /* a reclaim thread runs after all */
    char *freed = lull_malloc(20 * MiB), *shrunk = lull_malloc(BIG);
    if (!freed || !shrunk) _exit(3);
    for (size_t i = 0; i < BIG; i += 4096)
        shrunk[i] = 1;
    struct lull_counters c0, c1;
    if (lull_stats(&c0) != 0) _exit(5);
    lull_free(freed);
    if (lull_realloc(shrunk, SMALL) != shrunk) _exit(6);
    if (lull_stats(&c1) != 0) _exit(5);
    printf("inline=%d\n", !!(c1.flags & LULL_COUNTERS_F_INLINE_PURGE));
    printf("mapped_drop=%llu\n", (unsigned long long)(c0.total.mapped - c1.total.mapped));
    printf("unmapped=%llu\n", (unsigned long long)(c1.huge_unmapped - c0.huge_unmapped));
    printf("unmapped_bytes=%llu\n",
           (unsigned long long)(c1.huge_unmapped_bytes - c0.huge_unmapped_bytes));
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor(200))) static void child(void) {
    if (getenv("LULL_TEST_INLINE_UNMAP")) inline_scenario();
}

Test(huge_unmapped_counted, an_unmap_on_the_freeing_thread_counts, .timeout = 120) {
    const char *vars[] = {"LULL_TEST_INLINE_UNMAP=1", "LULL_FAULT=thread_create",
                          "LULL_CONF=inline_purge=on,warm_reserve_mb=0,refault_monitor=off", NULL};
    child_run cr;
    reexec_run("test_huge_unmapped_counted", vars, "inline unmap", 60000, &cr);
    reexec_assert_exited_0(&cr, "inline unmap");
    cr_assert_eq(reexec_field(&cr, "inline"), 1, "not purging inline");
    uint64_t drop = reexec_field(&cr, "mapped_drop");
    uint64_t unmapped = reexec_field(&cr, "unmapped");
    uint64_t bytes = reexec_field(&cr, "unmapped_bytes");
    cr_log_info("mapped -%llu, %llu mappings and %llu bytes counted unmapped",
                (unsigned long long)drop, (unsigned long long)unmapped, (unsigned long long)bytes);
    cr_assert_geq(drop, 20 * MiB + (BIG - SMALL) - 4096, "the freeing thread unmapped too little");
    cr_assert_eq(unmapped, 1, "%llu mappings counted for the one freed",
                 (unsigned long long)unmapped);
    cr_assert_eq(bytes, drop, "huge_unmapped_bytes grew by %llu, mapped fell by %llu",
                 (unsigned long long)bytes, (unsigned long long)drop);
}
