/* heap_limit_mb and huge blocks with a large alignment: the gap an alignment
 * leaves between the header and the block is never touched, and not counted. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/resident.h"
#include "lull/counters.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return res * (size_t)sysconf(_SC_PAGESIZE);
}

/* How many 20 MiB blocks at `align` fit under a limit 128 MiB above now. */
static size_t fit(size_t align, size_t *estimate, size_t *rss_grew) {
    static void *b[64];
    unsigned mb = (unsigned)(lull_resident_bytes() >> 20) + 128;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    size_t before = lull_resident_bytes(), rss0 = rss_bytes(), n = 0;
    for (; n < 64; n++) {
        b[n] = lull_aligned_alloc(align, 20 * MiB);
        if (!b[n]) break;
        memset(b[n], 1, 20 * MiB);
    }
    *estimate = lull_resident_bytes() - before;
    *rss_grew = rss_bytes() - rss0;
    for (size_t i = 0; i < n; i++)
        lull_free(b[i]);
    lull_purge_all();
    return n;
}

Test(limits_aligned_huge, an_aligned_huge_block_is_counted_as_what_it_keeps_resident,
     .init = setup) {
    size_t est1, rss1, est2, rss2;
    size_t plain = fit(64 * 1024, &est1, &rss1);
    size_t aligned = fit(32 * MiB, &est2, &rss2);
    cr_log_info("64 KiB alignment: %zu blocks (estimate +%zu MiB, rss +%zu MiB); 32 MiB "
                "alignment: %zu blocks (estimate +%zu MiB, rss +%zu MiB)",
                plain, est1 >> 20, rss1 >> 20, aligned, est2 >> 20, rss2 >> 20);
    cr_expect_geq(plain, 5);
    cr_expect_eq(aligned, plain,
                 "under a 128 MiB limit %zu blocks of 20 MiB fit at 64 KiB alignment, %zu at "
                 "32 MiB (estimate +%zu MiB for rss +%zu MiB)",
                 plain, aligned, est2 >> 20, rss2 >> 20);
}

/* The identity holds and the estimate is the statistics' resident bound
 * (no reclaim step runs: the delay is "never"). */
static uint64_t checked_estimate(const char *phase, size_t align) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    cr_assert_eq(lull_counters_accounting_sum(&c.total), c.total.mapped,
                 "%s at %zu KiB alignment: identity", phase, align >> 10);
    uint64_t est = lull_resident_bytes(), bound = lull_counters_resident_bound(&c.total);
    cr_assert_eq(est, bound,
                 "%s at %zu KiB alignment: estimate %llu KiB, statistics' resident bound %llu KiB",
                 phase, align >> 10, (unsigned long long)est >> 10,
                 (unsigned long long)bound >> 10);
    return est;
}

Test(limits_aligned_huge, each_alignment_counts_the_header_slice_and_the_block, .init = setup) {
    /* 64 KiB: the block one slice after the header; 128 KiB-32 MiB: the
     * alignment after it; 64 MiB: a segment after it, in a mapping with
     * slack to find the boundary in */
    static const size_t aligns[] = {64 * 1024, 128 * 1024, 4 * MiB, 32 * MiB, 64 * MiB};
    uint64_t first = 0;
    for (unsigned i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        lull_purge_all(); /* no cached mapping to take back: each is mapped anew */
        uint64_t before = checked_estimate("before", aligns[i]);
        char *p = lull_aligned_alloc(aligns[i], 20 * MiB);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % aligns[i], 0);
        memset(p, 1, 20 * MiB);
        uint64_t grew = checked_estimate("live", aligns[i]) - before;
        if (!i) first = grew;
        cr_expect_eq(
            grew, first, "a 20 MiB block at %zu KiB alignment counts %llu KiB, at 64 KiB %llu KiB",
            aligns[i] >> 10, (unsigned long long)grew >> 10, (unsigned long long)first >> 10);
        lull_free(p);
        cr_assert(lull_reclaim_now());
        checked_estimate("freed", aligns[i]);
        lull_purge_all();
        cr_expect_eq(checked_estimate("unmapped", aligns[i]), before,
                     "at %zu KiB alignment: the estimate is not back where it was",
                     aligns[i] >> 10);
    }
    cr_expect_geq(first, 20 * MiB);
}
