/* The warm reserve (reclaim/warm_reserve.c) measures its demand in pages
 * where the refault monitor counts them (refault_monitor=auto: the
 * PAGEMAP_SCAN present bit): purged slices taken again with one page of
 * each written are one page of demand each, not 16. The reserve counted
 * slices and prefaulted all 16 pages of a slice for each such reuse, so a
 * program of short threads whose new spans write a page or two of a
 * reused slice kept up to a few MiB prefaulted for nothing
 * (bench/footprint.c short_threads: peak RSS 2.8-4.2 MiB, 2.8-2.9 with
 * warm_reserve_mb=0).
 *
 * 16 MiB of 64 KiB blocks (a slice each) written, freed and purged, then
 * allocated again with nothing written but the free-list link lull puts in
 * each block's first page: the reserve ends up at most the pages that came
 * back, rounded up to slices (the old reserve: one slice for each block,
 * 16 MiB), and not empty (it still follows the refaults). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/types.h"
#include "tests/support/reclaim_wait.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define SLICE LULL_SLICE_SIZE
#define BLOCK SLICE
#define NBLOCKS 256

/* The refault scans settled, then a few ticks more for the reserve. */
static void settle(void) {
    settle_refault_scans();
    for (int i = 0; i < 8; i++)
        lull_reclaim_now();
}

static void *blocks[NBLOCKS];

Test(warm_sparse, a_page_back_in_a_purged_slice_is_a_page_of_demand, .timeout = 120) {
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    if (reclaim_wait_stats().refault_mechanism != LULL_COUNTERS_REFAULT_PAGEMAP_SCAN)
        cr_skip_test("refault monitor %s: no page counts on this kernel (PAGEMAP_SCAN is 6.7+)",
                     lull_counters_refault_name(reclaim_wait_stats().refault_mechanism));

    for (int i = 0; i < NBLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0x5a, BLOCK);
    }
    for (int i = 0; i < NBLOCKS; i++)
        lull_free(blocks[i]);
    cr_assert(purge_everything_freed(), "the freed blocks were not purged within 30 s");

    struct lull_counters s0 = reclaim_wait_stats();
    for (int i = 0; i < NBLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
    }
    settle();
    struct lull_counters s1 = reclaim_wait_stats();
    uint64_t back = s1.refault_pages - s0.refault_pages;
    uint64_t bound = (back + LULL_PAGES_PER_SLICE - 1) / LULL_PAGES_PER_SLICE * SLICE;
    cr_log_info("%llu pages back, reserve %llu KiB (bound %llu KiB)", (unsigned long long)back,
                (unsigned long long)s1.total.warm >> 10, (unsigned long long)bound >> 10);
    /* not vacuous: most blocks landed on purged slices, a page each */
    cr_assert_geq(back, NBLOCKS / 2, "only %llu pages came back", (unsigned long long)back);
    cr_assert_leq(back, 2 * NBLOCKS, "%llu pages came back, nothing was written",
                  (unsigned long long)back);
    cr_assert_leq(s1.total.warm, bound, "reserve %llu KiB for %llu pages back",
                  (unsigned long long)s1.total.warm >> 10, (unsigned long long)back);
    cr_assert_gt(s1.total.warm, 0, "the reserve no longer follows refaults");
    for (int i = 0; i < NBLOCKS; i++)
        lull_free(blocks[i]);
}
