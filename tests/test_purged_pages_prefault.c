/* The warm reserve prefaults clean slices with MADV_POPULATE_WRITE through
 * the purge backend (reclaim/warm_reserve.c). Those pages are made
 * resident, not purged: the counter page's purged_pages (the denominator
 * of the wasted-purge ratio) and the per-backend purge_bytes[] must not
 * count them, nor purge_syscalls[], the system calls that carried purges
 * (it counted each prefault's madvise, io_uring_enter or process_madvise,
 * and grew every tick the reserve filled with nothing purged). With a day's purge delay nothing is
 * purged; refault demand, faked as tests/test_limits.c does, makes the reserve fill, and the purge
 * figures must stay where they were. */
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/policy.h"
#include "reclaim/refault.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

static struct lull_counters snap(void) {
    struct lull_counters c;
    memset(&c, 0, sizeof c);
    cr_assert_eq(lull_stats(&c), 0);
    return c;
}

static uint64_t purge_bytes(const struct lull_counters *c) {
    uint64_t t = 0;
    for (int k = 0; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        t += c->purge_bytes[k];
    return t;
}

static uint64_t purge_syscalls(const struct lull_counters *c) {
    uint64_t t = 0;
    for (int k = 0; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        t += c->purge_syscalls[k];
    return t;
}

Test(purged_pages, a_prefault_of_the_warm_reserve_is_not_a_purge, .timeout = 60) {
    cr_assert(lull_configure("warm_reserve_mb", "16"));
    lull_set_purge_delay_ms(86400000); /* a day: nothing is purged */
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert(lull_reclaim_now());
    struct lull_counters c0 = snap();
    /* 64 slices of demand, as the monitor or the accounting counts it */
    atomic_fetch_add(&lull_the_policy.refaulted_slices, 64);
    atomic_fetch_add(&lull_refault_pages_seen, 64 * 16);
    struct lull_counters c1 = c0;
    /* a tick or two fills it (bounded by ticks, not time) */
    for (int i = 0; i < 20 && c1.total.warm == 0; i++) {
        cr_assert(lull_reclaim_now());
        c1 = snap();
    }
    cr_assert_gt(c1.total.warm, 0, "the warm reserve never filled");
    cr_log_info("warm %llu KiB, purged_pages %llu -> %llu, purge bytes %llu -> %llu",
                (unsigned long long)c1.total.warm >> 10, (unsigned long long)c0.purged_pages,
                (unsigned long long)c1.purged_pages, (unsigned long long)purge_bytes(&c0),
                (unsigned long long)purge_bytes(&c1));
    cr_assert_eq(c1.purged_pages, c0.purged_pages,
                 "%llu KiB prefaulted, and purged_pages grew by %llu pages with nothing purged",
                 (unsigned long long)c1.total.warm >> 10,
                 (unsigned long long)(c1.purged_pages - c0.purged_pages));
    cr_assert_eq(purge_bytes(&c1), purge_bytes(&c0), "purge_bytes[] counted the prefault");
    cr_assert_eq(purge_syscalls(&c1), purge_syscalls(&c0),
                 "purge_syscalls[] grew by %llu with nothing purged: it counted the prefault",
                 (unsigned long long)(purge_syscalls(&c1) - purge_syscalls(&c0)));
}
