/* The warm reserve (reclaim/warm_reserve.c) also follows first use: a
 * working set that grows over fresh slices makes the reclaim thread prefault
 * some ahead of it (so the request thread takes fewer first-touch faults),
 * within warm_reserve_mb, and the reserve drains once the growth stops. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/warm_reserve.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define MiB ((size_t)1 << 20)
#define BLOCK ((size_t)256 << 10)
#define BLOCKS 160 /* 40 MiB */

static uint64_t warm_now(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c.total.warm;
}

static uint64_t warm_bound(void) {
    struct lull_counters c;
    lull_stats(&c);
    const char *k = strstr(c.config, "warm_reserve_mb=");
    cr_assert_not_null(k, "no warm_reserve_mb in the configuration: %s", c.config);
    return strtoull(k + strlen("warm_reserve_mb="), NULL, 10) * MiB;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

Test(warm_first_use, growth_over_fresh_slices_fills_the_reserve_then_it_drains, .timeout = 60) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    uint64_t bound = warm_bound();
    cr_assert_gt(bound, 0);
    lull_warm_stats s0;
    lull_warm_reserve_stats(&s0);
    static void *blocks[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0x5a, BLOCK);
    }
    /* a few ticks: the reserve follows the demand it saw */
    uint64_t most = 0;
    for (int t = 0; t < 20 && most == 0; t++) {
        lull_reclaim_now();
        uint64_t w = warm_now();
        if (w > most) most = w;
    }
    lull_warm_stats s1;
    lull_warm_reserve_stats(&s1);
    cr_assert_gt(s1.prefaulted_bytes, s0.prefaulted_bytes,
                 "40 MiB of first use and nothing prefaulted");
    cr_assert_gt(most, 0, "no warm memory after 40 MiB of first use");
    cr_assert_leq(most, bound, "warm %llu bytes over the bound %llu", (unsigned long long)most,
                  (unsigned long long)bound);
    cr_assert_leq(s1.target_bytes, bound);
    for (int i = 0; i < BLOCKS; i++)
        for (size_t k = 0; k < BLOCK; k += 4096)
            cr_assert_eq(((unsigned char *)blocks[i])[k], 0x5a, "block %d changed at %zu", i, k);
    for (int i = 0; i < BLOCKS; i++)
        lull_free(blocks[i]);
    /* no more growth: drained after LULL_WARM_IDLE_MS */
    uint64_t w = UINT64_MAX;
    for (int t = 0; t < (LULL_WARM_IDLE_MS + 10000) / 100 && w != 0; t++) {
        sleep_ms(100);
        lull_reclaim_now();
        w = warm_now();
    }
    cr_assert_eq(w, 0, "warm still %llu bytes after the growth stopped", (unsigned long long)w);
}
