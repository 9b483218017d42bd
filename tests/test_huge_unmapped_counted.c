/* The statistics' huge_unmapped_bytes count every byte of huge address
 * space lull gives back with munmap, whoever unmaps it: a freed block's
 * whole mapping (huge_unmapped counts those mappings), and the tail of a
 * block realloc shrank in place (numa/huge.h, lull_huge_shrink_in_place),
 * which the reclaim thread purges and unmaps at its next tick. That unmap
 * was counted nowhere: `mapped` went down by the tail while
 * huge_unmapped_bytes stayed where it was.
 *
 * Event-bounded: lull_reclaim_now() returns after a tick that started
 * after the call, and a tick gives every queued tail back first. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"

#include <criterion/criterion.h>
#include <stdint.h>

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
