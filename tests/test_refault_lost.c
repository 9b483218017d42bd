/* The refault monitor losing its kernel call at run time: the open proved
 * PAGEMAP_SCAN, then every scan fails (the PAGEMAP_SCAN fault point stands
 * for a seccomp filter installed later with TSYNC that denies the ioctl,
 * seen with a real filter: refault_pages stood still for good while the
 * counter page still said "pagemap_scan"). The monitor must give the
 * mechanism up for the allocator's accounting, which the counter page then
 * reports, and refault_pages must count the purged slices taken again.
 *
 * Waits end on what the counters say; the deadline is only against a hang. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/fault.h"
#include "tests/support/reclaim_wait.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define BLOCK ((size_t)64 << 10) /* one slice */
#define NBLOCKS 256              /* 16 MiB */

static void *blocks[NBLOCKS];

/* Touch, free and purge NBLOCKS slices, then take them again: the reuse of
 * purged slices is what the monitor scans. */
static void purge_then_reuse(void) {
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0x5a, BLOCK);
    }
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(blocks[i]);
    cr_assert(purge_everything_freed(), "the freed memory was not purged");
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0xa5, BLOCK);
    }
}

Test(refault_lost, a_scan_that_fails_at_run_time_falls_back_to_accounting, .timeout = 120) {
    lull_configure("purge_mode", "dontneed");
    lull_configure("warm_reserve_mb", "0");
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    struct lull_counters c0 = reclaim_wait_stats();
    if (c0.refault_mechanism != LULL_COUNTERS_REFAULT_PAGEMAP_SCAN)
        cr_skip_test("refault monitor is %s here (PAGEMAP_SCAN needs 6.7+)",
                     lull_counters_refault_name(c0.refault_mechanism));

    lull_fault_arm(LULL_FAULT_PAGEMAP_SCAN, -1); /* every scan from now on fails */
    purge_then_reuse();

    /* a scan runs on a tick at most every 50 ms: tick until the monitor
     * has given up (the deadline is only against a hang) */
    struct lull_counters c1 = reclaim_wait_stats();
    for (uint64_t until = now_ms() + 20000;
         c1.refault_mechanism == LULL_COUNTERS_REFAULT_PAGEMAP_SCAN && now_ms() < until;
         c1 = reclaim_wait_stats()) {
        sleep_ms(20);
        lull_reclaim_now();
    }
    lull_fault_arm(LULL_FAULT_PAGEMAP_SCAN, 0);
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(blocks[i]);

    cr_assert_eq(c1.refault_mechanism, LULL_COUNTERS_REFAULT_ACCOUNTING,
                 "every PAGEMAP_SCAN failed, yet the counter page says %s "
                 "(refault_pages %llu -> %llu)",
                 lull_counters_refault_name(c1.refault_mechanism),
                 (unsigned long long)c0.refault_pages, (unsigned long long)c1.refault_pages);
    /* accounting: 16 pages for each purged slice taken again */
    cr_assert_gt(c1.refault_pages, c0.refault_pages, "refault_pages stood still: %llu",
                 (unsigned long long)c1.refault_pages);
}
