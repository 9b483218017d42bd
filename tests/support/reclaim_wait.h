/* Waits on the reclaim thread that end on what its counters say, never on
 * a fixed time (the deadline is only against a hang): everything freed
 * purged, and the refault monitor's scans settled. Header-only (static
 * inline), no Criterion: usable in re-executed children before Criterion
 * starts. */
#ifndef LULL_TEST_RECLAIM_WAIT_H
#define LULL_TEST_RECLAIM_WAIT_H

#include "lull.h"
#include "lull/counters.h"
#include "tests/support/timing.h"

#include <stdbool.h>
#include <stdint.h>

static inline struct lull_counters reclaim_wait_stats(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c;
}

/* Everything freed is purged: ticks until at most 2 MiB is dirty and
 * nothing is being purged; false without a reclaim thread or after 30 s. */
static inline bool purge_everything_freed(void) {
    uint64_t until = now_ms() + 30000;
    while (now_ms() < until) {
        if (!lull_reclaim_now()) return false;
        struct lull_counters c = reclaim_wait_stats();
        if (c.total.dirty <= ((uint64_t)2 << 20) && c.total.purging == 0) return true;
        sleep_ms(5);
    }
    return false;
}

/* Ticks until refault_pages has not moved for three scans (a scan runs on
 * a tick at most every 50 ms). */
static inline void settle_refault_scans(void) {
    uint64_t last = reclaim_wait_stats().refault_pages;
    int stable = 0;
    for (int i = 0; i < 200 && !(i >= 4 && stable >= 3); i++) {
        sleep_ms(60);
        lull_reclaim_now();
        uint64_t r = reclaim_wait_stats().refault_pages;
        stable = r == last ? stable + 1 : 0;
        last = r;
    }
}

#endif
