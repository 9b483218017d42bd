/* The statistics' huge cache counts (lull_stats(), huge_cache_hits and
 * huge_cache_misses): a miss is a huge allocation that found no freed
 * mapping and mapped anew, once. An aligned block (which took no freed
 * mapping then) mapped anew was not counted at all, and an allocation
 * refused at the heap limit counted two misses (before and after the
 * reclaim thread's purge) though it mapped nothing. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/resident.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#define MiB ((size_t)1 << 20)

static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("huge_cache_idle_ms", "600000"));
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static void counts(uint64_t *hits, uint64_t *misses) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    *hits = *misses = 0;
    for (uint64_t n = 0; n < c.node_count; n++) {
        *hits += c.nodes[n].huge_cache_hits;
        *misses += c.nodes[n].huge_cache_misses;
    }
}

Test(huge_cache_counts, each_huge_block_mapped_anew_is_one_miss, .init = setup) {
    uint64_t h0, m0, h, m;
    counts(&h0, &m0);
    void *p = lull_malloc(20 * MiB);
    cr_assert_not_null(p);
    counts(&h, &m);
    cr_assert_eq(m, m0 + 1, "plain: %llu misses more", (unsigned long long)(m - m0));
    static const size_t aligns[] = {128 << 10, 16 * MiB, 32 * MiB, 64 * MiB};
    void *q[sizeof aligns / sizeof aligns[0]];
    /* each kept until the end: a freed one aligned far enough would serve
     * the next (a hit: tests/test_huge_aligned_reuse.c) */
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        q[i] = lull_aligned_alloc(aligns[i], 20 * MiB);
        cr_assert_not_null(q[i]);
        uint64_t m1 = m;
        counts(&h, &m);
        cr_assert_eq(m, m1 + 1, "aligned at %zu KiB: %llu misses more", aligns[i] >> 10,
                     (unsigned long long)(m - m1));
    }
    cr_assert_eq(h, h0);
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
        lull_free(q[i]);
    lull_free(p);
}

Test(huge_cache_counts, a_block_refused_at_the_limit_is_no_miss, .init = setup) {
    unsigned mb = (unsigned)(lull_resident_bytes() >> 20) + 17;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    uint64_t h0, m0, h, m;
    counts(&h0, &m0);
    errno = 0;
    cr_assert_null(lull_malloc(64 * MiB));
    cr_assert_eq(errno, ENOMEM);
    counts(&h, &m);
    cr_assert_eq(m, m0, "%llu misses for a block that was never mapped",
                 (unsigned long long)(m - m0));
    cr_assert_eq(h, h0);
}
