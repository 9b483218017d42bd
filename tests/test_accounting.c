/* Invariant 3 of design.md: every byte lull has mapped is in exactly one
 * term (live, rounding, span_free, dirty, purging, purged, warm, metadata),
 * and the terms sum to mapped, per node and overall, after every phase of a
 * mixed workload: small, large and huge blocks, remote frees, purges. The
 * terms must also move the way the phase says (live up after allocating,
 * dirty up after freeing, purged up after a purge), so a walker that put
 * everything into one term would fail. */
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/stats_check.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)

typedef struct {
    void **blocks;
    int n;
} batch;

static void *free_batch(void *arg) {
    batch *b = arg;
    for (int i = 0; i < b->n; i++)
        lull_free(b->blocks[i]);
    return NULL;
}

Test(accounting, identity_holds_after_every_phase) {
    lull_set_purge_delay_ms(-1); /* phases decide when purges happen */
    lull_thread_collect();
    struct lull_counters c0 = stats_checked("start");

    /* small blocks */
    enum { N = 20000 };
    static void *small[N];
    for (int i = 0; i < N; i++) {
        small[i] = lull_malloc((size_t)(i % 700) + 1);
        memset(small[i], 1, (size_t)(i % 700) + 1);
    }
    struct lull_counters c1 = stats_checked("small");
    cr_assert_geq(c1.total.live, c0.total.live + 6 * MiB, "live did not grow with 7 MB of blocks");

    /* large and huge */
    void *large[8], *huge[2];
    for (int i = 0; i < 8; i++)
        large[i] = lull_malloc((size_t)(600 + 100 * i) << 10);
    for (int i = 0; i < 2; i++)
        huge[i] = lull_malloc((size_t)(20 + i) << 20);
    struct lull_counters c2 = stats_checked("large+huge");
    cr_assert_geq(c2.total.live, c1.total.live + 45 * MiB);

    /* remote frees: another thread frees half of the small blocks */
    batch b = {small, N / 2};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_batch, &b), 0);
    pthread_join(t, NULL);
    stats_checked("remote frees");

    /* local frees of everything else, then the owner collects */
    for (int i = N / 2; i < N; i++)
        lull_free(small[i]);
    for (int i = 0; i < 8; i++)
        lull_free(large[i]);
    lull_thread_collect();
    struct lull_counters c3 = stats_checked("freed");
    cr_assert_lt(c3.total.live, c2.total.live - 10 * MiB, "live did not fall after the frees");
    cr_assert_geq(c3.total.dirty, 8 * MiB, "freed slices are not counted dirty");

    /* purge everything */
    lull_set_purge_delay_ms(0);
    for (int i = 0; i < 2; i++)
        lull_free(huge[i]);
    lull_reclaim_now();
    lull_reclaim_now();
    struct lull_counters c4 = stats_checked("purged");
    cr_assert_leq(c4.total.dirty + c4.total.purging, c3.total.dirty / 4,
                  "dirty %llu KiB left after purging", (unsigned long long)c4.total.dirty >> 10);
    /* (the purged term itself may fall: unmapped huge blocks take their
     * untouched alignment slack with them) */
    cr_assert_geq((c4.purged_pages - c3.purged_pages) * 4096, c3.total.dirty / 2,
                  "only %llu KiB purged of %llu KiB dirty",
                  (unsigned long long)(c4.purged_pages - c3.purged_pages) * 4,
                  (unsigned long long)c3.total.dirty >> 10);
    /* the freed huge blocks stay mapped in the reclaim thread's cache,
     * purged: counted there, not gone */
    cr_assert_geq(c4.total.purged, c3.total.purged + 40 * MiB,
                  "the cached huge blocks are not counted purged");
    /* a cache bound of 0: the reclaim thread unmaps them */
    cr_assert(lull_configure("huge_cache_mb", "0"));
    lull_reclaim_now();
    struct lull_counters c5 = stats_checked("unmapped");
    cr_assert_lt(c5.total.mapped, c4.total.mapped - 40 * MiB, "huge blocks were not unmapped");
    cr_assert(lull_configure("huge_cache_mb", "1024"));
    lull_set_purge_delay_ms(-2);
}
