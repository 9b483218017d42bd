/* The adaptive purge policy (reclaim/policy.c), as pure unit tests on a
 * local lull_policy: no allocator, no threads, synthetic time.
 *
 *  - the reuse-interval buckets are monotonic, cover every interval and are
 *    a quarter of a power of two wide;
 *  - below LULL_POLICY_MIN_SAMPLES slices the delay stays at the default,
 *    and the policy recomputes at most once a period;
 *  - a steady cadence converges the delay to 2 x the bucket bound of the
 *    90th percentile, clamped to [LULL_POLICY_MIN_MS, LULL_POLICY_MAX_MS];
 *  - a cadence that changes (100 ms -> 30 ms -> 600 ms) is followed within a
 *    bounded number of periods (the samples decay);
 *  - a target within 10 % does not move the delay (hysteresis);
 *  - the mode: MADV_FREE while purges are wasted, MADV_DONTNEED otherwise
 *    and always while memory is short;
 *  - against the seed's rule (2 x trailing mean of the reuse intervals,
 *    20 samples, 10 % hysteresis: /work/shared/seeds/001_*.txt): on a
 *    bimodal workload (much small churn inside a burst, a large working set
 *    reused after a 200 ms gap) the trailing mean picks a delay far below the
 *    gap and would purge the working set every time, while lull's
 *    slice-weighted percentile covers the gap. */
#include "reclaim/policy.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

static lull_policy P;

static void fresh(void) {
    lull_policy_reset(&P);
}

/* The delay lull would compute for a bucket holding the 90th percentile. */
static long target_for(uint32_t ms) {
    long t = 2L * (long)lull_policy_bucket_max_ms(lull_policy_bucket(ms));
    if (t < LULL_POLICY_MIN_MS) t = LULL_POLICY_MIN_MS;
    if (t > LULL_POLICY_MAX_MS) t = LULL_POLICY_MAX_MS;
    return t;
}

/* ---- buckets ------------------------------------------------------------ */

/* The last bucket is open-ended: everything from its lower bound up. */
#define LAST (LULL_POLICY_BUCKETS - 1)

Test(policy_buckets, bucket_of_an_interval_is_monotonic_and_in_range) {
    unsigned prev = lull_policy_bucket(0);
    cr_assert_eq(prev, 0);
    for (uint32_t ms = 1; ms <= 600000; ms++) {
        unsigned b = lull_policy_bucket(ms);
        cr_assert_lt(b, LULL_POLICY_BUCKETS, "bucket(%u) = %u", ms, b);
        cr_assert_geq(b, prev, "bucket(%u) = %u < bucket(%u) = %u", ms, b, ms - 1, prev);
        prev = b;
    }
    cr_assert_eq(lull_policy_bucket(UINT32_MAX), LAST);
}

Test(policy_buckets, bounds_are_monotonic_and_cover_every_interval) {
    for (unsigned b = 1; b < LULL_POLICY_BUCKETS; b++)
        cr_assert_geq(lull_policy_bucket_max_ms(b), lull_policy_bucket_max_ms(b - 1),
                      "bucket_max(%u) < bucket_max(%u)", b, b - 1);
    uint32_t open_from = lull_policy_bucket_max_ms(LAST - 1);
    for (uint32_t ms = 0; ms < open_from; ms++) {
        unsigned b = lull_policy_bucket(ms);
        uint32_t hi = lull_policy_bucket_max_ms(b);
        /* an interval never exceeds its bucket's bound (so 2 x the bound
         * covers it), and from 4 ms on the bound is exclusive */
        cr_assert_leq(ms, hi, "%u ms in bucket %u whose bound is %u", ms, b, hi);
        if (ms >= 4) cr_assert_lt(ms, hi, "%u ms in bucket %u whose bound is %u", ms, b, hi);
        /* the granularity: a quarter of a power of two (plus rounding) */
        if (ms >= 4)
            cr_assert_leq(hi, ms + ms / 4 + 1, "bucket of %u ms is too coarse (%u)", ms, hi);
        /* and the interval is above the bound of the bucket before */
        if (b > 0 && ms >= 4)
            cr_assert_geq(ms, lull_policy_bucket_max_ms(b - 1), "%u ms below bucket %u", ms, b);
    }
    /* from 4 ms on the buckets tile the line with no gap: each one starts
     * exactly where the one before ends */
    for (unsigned b = lull_policy_bucket(4) + 1; b < LAST; b++) {
        uint32_t lo = lull_policy_bucket_max_ms(b - 1), hi = lull_policy_bucket_max_ms(b);
        cr_assert_lt(lo, hi, "bucket %u is empty", b);
        cr_assert_eq(lull_policy_bucket(lo), b, "bucket(%u) = %u, want %u", lo,
                     lull_policy_bucket(lo), b);
        cr_assert_eq(lull_policy_bucket(hi - 1), b);
    }
    /* everything above the last bound lands in the open last bucket */
    cr_assert_eq(lull_policy_bucket(open_from), LAST);
    cr_assert_eq(lull_policy_bucket(open_from * 4), LAST);
}

/* ---- sample threshold and period ---------------------------------------- */

Test(policy_delay, stays_at_the_default_below_the_sample_threshold, .init = fresh) {
    cr_assert_eq(P.delay_ms, LULL_POLICY_DEFAULT_MS);
    /* 300 ms reuses would give 2 x 320 = 640 ms: far from the default */
    cr_assert_neq(target_for(300), LULL_POLICY_DEFAULT_MS);
    lull_policy_record_reuse(&P, 300, LULL_POLICY_MIN_SAMPLES - 1, false, 0);
    cr_assert_eq(lull_policy_delay(&P, 1000), LULL_POLICY_DEFAULT_MS);
    cr_assert_eq(P.delay_ms, LULL_POLICY_DEFAULT_MS);

    /* one more slice (a fresh policy: no decay in between) crosses it */
    lull_policy_reset(&P);
    lull_policy_record_reuse(&P, 300, LULL_POLICY_MIN_SAMPLES, false, 0);
    cr_assert_eq(lull_policy_delay(&P, 1000), target_for(300));
}

Test(policy_delay, recomputes_at_most_once_a_period, .init = fresh) {
    uint32_t now = 5000;
    cr_assert_eq(lull_policy_delay(&P, now), LULL_POLICY_DEFAULT_MS); /* first call: empty */
    lull_policy_record_reuse(&P, 300, 100, false, 0);
    cr_assert_eq(lull_policy_delay(&P, now + 1), LULL_POLICY_DEFAULT_MS);
    cr_assert_eq(lull_policy_delay(&P, now + LULL_POLICY_PERIOD_MS - 1), LULL_POLICY_DEFAULT_MS);
    cr_assert_eq(lull_policy_delay(&P, now + LULL_POLICY_PERIOD_MS), target_for(300));
}

/* ---- convergence -------------------------------------------------------- */

/* One period of a cadence: `n` slices reused, with intervals spread evenly
 * over [ms - ms/10, ms + ms/10]; returns the delay at the period's end. */
static long feed_period(uint32_t *now, uint32_t ms, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        uint32_t spread = ms / 10;
        uint32_t iv = ms - spread + (uint32_t)((2u * spread * i) / (n > 1 ? n - 1 : 1));
        lull_policy_record_reuse(&P, iv, 1, false, 0);
    }
    *now += LULL_POLICY_PERIOD_MS;
    return lull_policy_delay(&P, *now);
}

/* The 90th percentile of one period's intervals as feed_period spreads them. */
static uint32_t p90_of(uint32_t ms, unsigned n) {
    unsigned i = n - n / 10 - 1; /* index of the 90th percentile, sorted ascending */
    uint32_t spread = ms / 10;
    return ms - spread + (uint32_t)((2u * spread * i) / (n > 1 ? n - 1 : 1));
}

static void assert_about_twice_p90(long delay, uint32_t ms, unsigned n) {
    uint32_t p90 = p90_of(ms, n);
    /* 2 x the bound of the p90's bucket: at least 2 x p90, at most one
     * bucket's granularity (a quarter of a power of two) above */
    cr_assert_geq(delay, 2L * p90, "cadence %u ms: delay %ld < 2 x p90 %u", ms, delay, p90);
    cr_assert_leq(delay, 2L * (p90 + p90 / 4 + 1), "cadence %u ms: delay %ld >> 2 x p90 %u", ms,
                  delay, p90);
    cr_assert_eq(delay, target_for(p90));
}

Test(policy_delay, converges_to_twice_the_p90_of_a_steady_cadence, .init = fresh) {
    uint32_t now = 1000;
    long d = 0;
    for (int period = 0; period < 8; period++)
        d = feed_period(&now, 100, 40);
    assert_about_twice_p90(d, 100, 40);
    cr_assert_eq(P.delay_ms, d);
    /* more periods of the same cadence keep it there */
    for (int period = 0; period < 20; period++)
        cr_assert_eq(feed_period(&now, 100, 40), d);
}

Test(policy_delay, is_clamped_to_min_and_max, .init = fresh) {
    uint32_t now = 1000;
    long d = 0;
    for (int period = 0; period < 4; period++) {
        for (int i = 0; i < 50; i++)
            lull_policy_record_reuse(&P, 1, 1, false, 0);
        now += LULL_POLICY_PERIOD_MS;
        d = lull_policy_delay(&P, now);
    }
    cr_assert_eq(d, LULL_POLICY_MIN_MS, "1 ms reuses: delay %ld", d);

    lull_policy_reset(&P);
    for (int period = 0; period < 4; period++) {
        for (int i = 0; i < 50; i++)
            lull_policy_record_reuse(&P, 60000, 1, false, 0);
        now += LULL_POLICY_PERIOD_MS;
        d = lull_policy_delay(&P, now);
    }
    cr_assert_eq(d, LULL_POLICY_MAX_MS, "60 s reuses: delay %ld", d);
}

/* How many periods until the delay equals the target of the new cadence. */
static int periods_to_follow(uint32_t *now, uint32_t ms, unsigned n, int limit) {
    long want = target_for(p90_of(ms, n));
    for (int k = 1; k <= limit; k++)
        if (feed_period(now, ms, n) == want) return k;
    return -1;
}

Test(policy_delay, follows_a_changing_cadence_within_bounded_periods, .init = fresh) {
    uint32_t now = 1000;
    /* a long history at 100 ms: the histogram is at its decayed steady state */
    for (int period = 0; period < 60; period++)
        feed_period(&now, 100, 40);
    assert_about_twice_p90(P.delay_ms, 100, 40);

    /* faster: the old samples must decay below 10 % of the total, about
     * log(0.1) / log(7/8) = 17 periods with 1/8 decay per period */
    int k = periods_to_follow(&now, 30, 40, 40);
    cr_log_info("100 ms -> 30 ms: followed after %d periods", k);
    cr_assert_gt(k, 0, "delay %ld never followed the 30 ms cadence", P.delay_ms);
    cr_assert_leq(k, 25);
    assert_about_twice_p90(P.delay_ms, 30, 40);
    for (int period = 0; period < 40; period++)
        feed_period(&now, 30, 40);

    /* slower: as soon as the new samples exceed 10 % of the total the
     * delay covers every new interval (no more purging of memory that is
     * reused after 600 ms)... */
    int covered = -1;
    for (int j = 1; j <= 10 && covered < 0; j++)
        if (feed_period(&now, 600, 40) > 600 + 60) covered = j;
    cr_log_info("30 ms -> 600 ms: covered after %d periods", covered);
    cr_assert_gt(covered, 0, "delay %ld never covered the 600 ms cadence", P.delay_ms);
    cr_assert_leq(covered, 3);
    /* ... and settles on the new cadence's own 90th percentile */
    k = periods_to_follow(&now, 600, 40, 40);
    cr_log_info("30 ms -> 600 ms: settled after %d more periods", k);
    cr_assert_gt(k, 0, "delay %ld never settled on the 600 ms cadence", P.delay_ms);
    cr_assert_leq(k, 25);
    assert_about_twice_p90(P.delay_ms, 600, 40);

    /* and it comes back down when the slow cadence stops mattering */
    k = periods_to_follow(&now, 100, 40, 40);
    cr_assert_gt(k, 0);
    cr_assert_leq(k, 25);
}

Test(policy_delay, samples_decay_when_reuse_stops, .init = fresh) {
    uint32_t now = 1000;
    for (int period = 0; period < 10; period++)
        feed_period(&now, 100, 40);
    /* no reuse at all: the histogram empties (1/8 a period, rounded up) */
    for (int period = 0; period < 100; period++) {
        now += LULL_POLICY_PERIOD_MS;
        lull_policy_delay(&P, now);
    }
    uint64_t left = 0;
    for (unsigned b = 0; b < LULL_POLICY_BUCKETS; b++)
        left += P.reuse[b];
    cr_assert_eq(left, 0, "%llu samples left after 100 idle periods", (unsigned long long)left);
    /* with no evidence the delay is left where it was */
    assert_about_twice_p90(P.delay_ms, 100, 40);
}

/* ---- hysteresis --------------------------------------------------------- */

Test(policy_delay, a_target_within_ten_percent_does_not_move_it, .init = fresh) {
    /* 80..95 ms reuses: target 2 x 96 = 192, 4 % below the default 200 */
    cr_assert_eq(target_for(88), 192);
    uint32_t now = 1000;
    for (int period = 0; period < 6; period++) {
        for (uint32_t ms = 80; ms < 96; ms++)
            lull_policy_record_reuse(&P, ms, 4, false, 0);
        now += LULL_POLICY_PERIOD_MS;
        cr_assert_eq(lull_policy_delay(&P, now), LULL_POLICY_DEFAULT_MS);
    }
    /* 224 is 12 % above 200: it moves */
    lull_policy_reset(&P);
    cr_assert_eq(target_for(100), 224);
    for (int i = 0; i < 40; i++)
        lull_policy_record_reuse(&P, 100, 1, false, 0);
    cr_assert_eq(lull_policy_delay(&P, now), 224);

    /* around a current delay set by hand: 230 -> 224 is 2.6 %: stays;
     * 260 -> 224 is 14 %: moves */
    lull_policy_reset(&P);
    P.delay_ms = 230;
    for (int i = 0; i < 40; i++)
        lull_policy_record_reuse(&P, 100, 1, false, 0);
    cr_assert_eq(lull_policy_delay(&P, now), 230);
    lull_policy_reset(&P);
    P.delay_ms = 260;
    for (int i = 0; i < 40; i++)
        lull_policy_record_reuse(&P, 100, 1, false, 0);
    cr_assert_eq(lull_policy_delay(&P, now), 224);
}

/* ---- mode --------------------------------------------------------------- */

static int mode_after(uint32_t *now, uint32_t purged, uint32_t refaulted) {
    lull_policy_record_purge(&P, purged);
    if (refaulted) lull_policy_record_reuse(&P, 50, refaulted, true, 40);
    *now += LULL_POLICY_PERIOD_MS;
    lull_policy_delay(&P, *now);
    return lull_policy_mode(&P);
}

Test(policy_mode, follows_the_wasted_purge_ratio, .init = fresh) {
    uint32_t now = 1000;
    cr_assert_eq(lull_policy_mode(&P), MADV_DONTNEED);
    /* half of the purged slices came back: wasted purges -> MADV_FREE */
    cr_assert_eq(mode_after(&now, 100, 50), MADV_FREE);
    /* a window with many purges and few refaults (10 %) -> DONTNEED */
    cr_assert_eq(mode_after(&now, 100, 10), MADV_DONTNEED);
    /* right at the boundary (1/4) is not "above" */
    cr_assert_eq(mode_after(&now, 100, 25), MADV_DONTNEED);
    cr_assert_eq(mode_after(&now, 100, 26), MADV_FREE);
    /* too few purges in a window to judge: the mode stays */
    cr_assert_eq(mode_after(&now, 10, 0), MADV_FREE);
    /* the refaults counted per window, not since the start: the earlier
     * wasted windows do not keep MADV_FREE once purges stop being wasted */
    cr_assert_eq(mode_after(&now, 400, 0), MADV_DONTNEED);
}

Test(policy_mode, memory_short_forces_dontneed, .init = fresh) {
    uint32_t now = 1000;
    cr_assert_eq(mode_after(&now, 100, 90), MADV_FREE);
    lull_policy_set_memory_short(&P, true);
    /* even with too few purges to judge a window */
    cr_assert_eq(mode_after(&now, 0, 0), MADV_DONTNEED);
    /* and with a fully wasted window */
    cr_assert_eq(mode_after(&now, 100, 100), MADV_DONTNEED);
    lull_policy_set_memory_short(&P, false);
    cr_assert_eq(mode_after(&now, 100, 100), MADV_FREE);
}

/* Refault distances (purge -> reuse) land in log2 buckets by slices. */
Test(policy_mode, refault_distance_is_recorded_by_slices, .init = fresh) {
    lull_policy_record_reuse(&P, 100, 7, true, 0);
    lull_policy_record_reuse(&P, 100, 3, true, 40);      /* [32, 64) */
    lull_policy_record_reuse(&P, 100, 5, true, 1000000); /* clamped to the last */
    lull_policy_record_reuse(&P, 100, 9, false, 0);      /* not a refault */
    cr_assert_eq(P.refault_distance_ms[0], 7);
    cr_assert_eq(P.refault_distance_ms[6], 3);
    cr_assert_eq(P.refault_distance_ms[15], 5);
    cr_assert_eq(P.refaulted_slices, 15);
    cr_assert_eq(P.reused_slices, 24);
}

/* ---- against the seed's rule -------------------------------------------- */

/* The seed's cadence discovery, as written there: delay = 2 x the trailing
 * mean of the reuse intervals (one sample per reuse event, whatever its
 * size), armed after 20 samples, moved only past 10 % hysteresis. `window`
 * 0: the mean of every sample so far; else of the last `window`. */
typedef struct {
    uint32_t ring[256];
    unsigned window, count;
    uint64_t sum; /* of every sample (window 0) */
    long delay;
} seed_tracker;

static void seed_feed(seed_tracker *s, uint32_t interval_ms) {
    s->ring[s->count % 256] = interval_ms;
    s->count++;
    s->sum += interval_ms;
    if (s->count < 20) return;
    double mean;
    if (s->window) {
        unsigned n = s->count < s->window ? s->count : s->window;
        uint64_t sum = 0;
        for (unsigned i = 0; i < n; i++)
            sum += s->ring[(s->count - 1 - i) % 256];
        mean = (double)sum / n;
    } else {
        mean = (double)s->sum / s->count;
    }
    long target = (long)(2.0 * mean + 0.5);
    long diff = labs(target - s->delay);
    if (s->delay == 0 || diff * 10 > s->delay) s->delay = target;
}

#define BURSTS 20
#define CHURN 200     /* small spans reused inside a burst, one slice each */
#define CHURN_MS 2    /* ... after 2 ms */
#define WS_EVENTS 4   /* the working set comes back in 4 large takes */
#define WS_SLICES 128 /* of 8 MiB each: 32 MiB */
#define GAP_MS 200    /* ... after the gap between bursts */

Test(policy_vs_seed, percentile_by_slices_covers_the_gap_the_trailing_mean_misses, .init = fresh) {
    seed_tracker mean_all = {.window = 0}, mean_32 = {.window = 32};
    uint32_t now = 1000;
    for (int burst = 0; burst < BURSTS; burst++) {
        /* the working set returns after the gap, then the burst churns */
        for (int e = 0; e < WS_EVENTS; e++) {
            lull_policy_record_reuse(&P, GAP_MS, WS_SLICES, false, 0);
            seed_feed(&mean_all, GAP_MS);
            seed_feed(&mean_32, GAP_MS);
        }
        for (int i = 0; i < CHURN; i++) {
            lull_policy_record_reuse(&P, CHURN_MS, 1, false, 0);
            seed_feed(&mean_all, CHURN_MS);
            seed_feed(&mean_32, CHURN_MS);
        }
        now += LULL_POLICY_PERIOD_MS;
        lull_policy_delay(&P, now);
    }
    long lull_delay = P.delay_ms;
    cr_log_info("gap %d ms: lull delay %ld ms; seed rule (all samples) %ld ms, (last 32) %ld ms",
                GAP_MS, lull_delay, mean_all.delay, mean_32.delay);
    /* the seed's rule is armed (plenty of samples) and far below the gap:
     * every burst's working set (32 MiB) would be purged and refault */
    cr_assert_gt(mean_all.count, 20);
    cr_assert_gt(mean_all.delay, 0);
    cr_assert_lt(mean_all.delay, GAP_MS / 4, "seed (all) %ld ms", mean_all.delay);
    cr_assert_lt(mean_32.delay, GAP_MS / 4, "seed (last 32) %ld ms", mean_32.delay);
    /* lull's delay covers the gap: the working set survives it */
    cr_assert_gt(lull_delay, GAP_MS, "lull delay %ld ms does not cover the %d ms gap", lull_delay,
                 GAP_MS);
    cr_assert_leq(lull_delay, 2L * (GAP_MS + GAP_MS / 4 + 1));
    cr_assert_eq(lull_delay, target_for(GAP_MS));
    /* and it is the slice weighting that does it: by events, the 90th
     * percentile of the same samples is the churn */
    unsigned events = WS_EVENTS + CHURN;
    cr_assert_lt((double)WS_EVENTS / events, 0.1);
    cr_assert_gt((double)(WS_EVENTS * WS_SLICES) / (WS_EVENTS * WS_SLICES + CHURN), 0.1);
}
