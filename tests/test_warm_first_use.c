/* The warm reserve (reclaim/warm_reserve.c) follows refaults only: memory
 * touched for the first time is no sign that purged memory comes back, and
 * a working set that grew once (a start-up, a bulk load) made the reclaim
 * thread prefault up to warm_reserve_mb ahead of it and keep that for
 * LULL_WARM_IDLE_MS: after bench/demo.sh's bulk free 38-67 MiB stayed
 * resident for nothing, and every fork of such a process copied those
 * pages' tables (a fork+exec of /bin/true took 1.7x glibc's time). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/warm_reserve.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define BLOCK ((size_t)256 << 10)
#define BLOCKS 160 /* 40 MiB */

static uint64_t warm_now(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c.total.warm;
}

static uint64_t prefaulted(void) {
    lull_warm_stats s;
    lull_warm_reserve_stats(&s);
    return s.prefaulted_bytes;
}

Test(warm_first_use, first_use_alone_prefaults_nothing, .timeout = 60) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    uint64_t before = prefaulted();
    static void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0x5a, BLOCK);
    }
    /* ticks enough for the old reserve, which filled within a few */
    for (int t = 0; t < 20; t++) {
        lull_reclaim_now();
        cr_assert_eq(warm_now(), 0, "tick %d: %llu bytes warm after 40 MiB of first use", t,
                     (unsigned long long)warm_now());
    }
    for (int i = 0; i < BLOCKS; i++)
        for (size_t k = 0; k < BLOCK; k += 4096)
            cr_assert_eq(((unsigned char *)blocks[i])[k], 0x5a, "block %d changed at %zu", i, k);
    /* and the bulk free after it leaves no reserve behind either */
    for (int i = 0; i < BLOCKS; i++)
        lull_free(blocks[i]);
    for (int t = 0; t < 20; t++) {
        lull_reclaim_now();
        cr_assert_eq(warm_now(), 0, "tick %d after the free: %llu bytes warm", t,
                     (unsigned long long)warm_now());
    }
    cr_assert_eq(prefaulted(), before, "%llu bytes prefaulted",
                 (unsigned long long)(prefaulted() - before));
}
