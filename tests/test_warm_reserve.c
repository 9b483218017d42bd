/* The warm reserve (reclaim/warm_reserve.c): when purged memory comes back
 * into use, the reclaim thread prefaults a bounded number of clean slices so
 * that the next burst finds them resident; when the refaults stop for
 * LULL_WARM_IDLE_MS the reserve is purged again.
 *
 * A bursty program (64 MiB of mixed sizes allocated and written, freed,
 * then 300 ms of quiet, six times; purge delay 50 ms) in a new process with
 * warm_reserve_mb=16:
 *  - the reserve fills between bursts (warm > 0 in the quiet periods);
 *  - a sampling thread reads lull_stats() every 2 ms: warm never exceeds
 *    warm_reserve_mb;
 *  - the reserve is used: the allocations of a burst take warm slices (the
 *    reclaim thread is held during them, so nothing else moves the warm
 *    term: it can only fall by allocation);
 *  - after the bursts stop, the reserve stays while refaults are recent and
 *    is purged once they are LULL_WARM_IDLE_MS old: warm returns to 0, the
 *    reserve's drained bytes grow and RSS falls by about the reserve.
 * The same program with warm_reserve_mb=0 never has warm memory.
 *
 * warm_reserve_mb is read at start (LULL_CONF): the program is this test
 * binary run again with LULL_TEST_WARM set; a constructor runs it before
 * Criterion starts and prints its figures as key=value lines. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/warm_reserve.h"
#include "tests/support/mem_check.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/reexec.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define BURSTS 6
#define BURST_BYTES (64 * MiB)
#define GAP_MS 300  /* quiet between bursts: > the purge delay */
#define DELAY_MS 50 /* purge_delay_ms of the scenario */
#define MAX_BLOCKS 4096

static uint64_t warm_now(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c.total.warm;
}

/* ---- the sampling thread ------------------------------------------------- */

static atomic_int sampling;
static atomic_int phase; /* 0 burst k, 1 quiet after burst k, 2 after the pattern */
static atomic_int phase_burst;
static _Atomic uint64_t max_warm, samples, gap_max[BURSTS + 1];

static void *sampler_main(void *arg) {
    (void)arg;
    while (atomic_load(&sampling)) {
        uint64_t w = warm_now();
        atomic_fetch_add(&samples, 1);
        if (w > atomic_load(&max_warm)) atomic_store(&max_warm, w);
        if (atomic_load(&phase) == 1) {
            int k = atomic_load(&phase_burst);
            if (w > atomic_load(&gap_max[k])) atomic_store(&gap_max[k], w);
        }
        sleep_ms(2);
    }
    return NULL;
}

/* ---- the scenario --------------------------------------------------------- */

static void *blocks[MAX_BLOCKS];

/* Mixed sizes, from 4 KiB spans of small blocks to 1 MiB large spans. */
static const size_t sizes[] = {1 * MiB,  64 * KiB, 4 * KiB, 256 * KiB, 24 * KiB, 512 * KiB,
                               16 * KiB, 96 * KiB, 1 * MiB, 40 * KiB,  200 * KiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static size_t burst_alloc(void) {
    size_t n = 0, bytes = 0;
    while (bytes < BURST_BYTES && n < MAX_BLOCKS) {
        size_t sz = sizes[n % NSIZES];
        blocks[n] = lull_malloc(sz);
        if (!blocks[n]) break;
        memset(blocks[n], (int)(n | 1), sz);
        bytes += sz;
        n++;
    }
    return n;
}

static void burst_free(size_t n) {
    for (size_t i = 0; i < n; i++)
        lull_free(blocks[i]);
}

typedef struct {
    uint64_t bound;    /* warm_reserve_mb in force, bytes */
    uint64_t max_warm; /* largest warm seen by the sampler */
    uint64_t samples;
    uint64_t gaps_with_warm;   /* quiet periods in which warm was > 0 */
    uint64_t used_bursts;      /* bursts that started with warm memory */
    uint64_t warm_before;      /* warm at the start of the best such burst */
    uint64_t warm_after;       /* ... after its allocations (reclaim thread held) */
    uint64_t used_total;       /* warm bytes taken by all bursts' allocations */
    uint64_t warm_end;         /* warm after the pattern, before the drain */
    uint64_t warm_early;       /* warm ~1.5 s after the pattern */
    uint64_t early_ms;         /* when that sample was taken (ms after the pattern) */
    uint64_t warm_drained;     /* warm at the end of the wait (must be 0) */
    uint64_t drain_ms;         /* ms after the pattern until warm was 0 */
    uint64_t drained_bytes;    /* growth of the reserve's drained bytes over the wait */
    uint64_t prefaulted_bytes; /* reserve's prefaulted bytes over the whole run */
    uint64_t rss_end;          /* RSS with the reserve full */
    uint64_t rss_drained;      /* RSS after the drain */
    uint64_t ok;
} warm_result;

static uint64_t config_warm_bound(void) {
    struct lull_counters c;
    lull_stats(&c);
    const char *k = strstr(c.config, "warm_reserve_mb=");
    return k ? strtoull(k + strlen("warm_reserve_mb="), NULL, 10) * MiB : UINT64_MAX;
}

static warm_result run_pattern(void) {
    warm_result r = {0};
    r.bound = config_warm_bound();
    if (!lull_reclaim_now()) return r;
    pthread_t t;
    atomic_store(&sampling, 1);
    if (pthread_create(&t, NULL, sampler_main, NULL) != 0) return r;

    for (int k = 1; k <= BURSTS; k++) {
        atomic_store(&phase_burst, k);
        atomic_store(&phase, 0);
        /* the allocations of the burst with the reclaim thread held: warm
         * slices can only leave the reserve by being handed out */
        if (!reclaim_hold()) break;
        uint64_t w0 = warm_now();
        size_t n = burst_alloc();
        uint64_t w1 = warm_now();
        if (!reclaim_release()) break;
        if (w0 > 0) {
            r.used_bursts++;
            r.used_total += w0 > w1 ? w0 - w1 : 0;
            if (w0 > r.warm_before) {
                r.warm_before = w0;
                r.warm_after = w1;
            }
        }
        burst_free(n);
        atomic_store(&phase, 1);
        sleep_ms(GAP_MS);
    }
    atomic_store(&phase, 2);

    /* after the pattern: the reserve is full (refaults are recent) */
    uint64_t end = now_ms();
    lull_reclaim_now();
    r.warm_end = warm_now();
    r.rss_end = rss_bytes();
    lull_warm_stats ws0;
    lull_warm_reserve_stats(&ws0);
    uint64_t early_at = end + LULL_WARM_IDLE_MS / 2;
    while (now_ms() < early_at)
        sleep_ms(20);
    r.early_ms = now_ms() - end;
    r.warm_early = warm_now();
    /* then it is drained: poll with generous time */
    uint64_t until = end + LULL_WARM_IDLE_MS + 20000;
    r.warm_drained = UINT64_MAX;
    while (now_ms() < until) {
        lull_reclaim_now();
        r.warm_drained = warm_now();
        if (r.warm_drained == 0 && now_ms() >= end + LULL_WARM_IDLE_MS) break;
        sleep_ms(100);
    }
    r.drain_ms = now_ms() - end;
    lull_reclaim_now();
    lull_reclaim_now();
    r.rss_drained = rss_bytes();
    lull_warm_stats ws1;
    lull_warm_reserve_stats(&ws1);
    r.drained_bytes = ws1.drained_bytes - ws0.drained_bytes;
    r.prefaulted_bytes = ws1.prefaulted_bytes;

    atomic_store(&sampling, 0);
    pthread_join(t, NULL);
    r.max_warm = atomic_load(&max_warm);
    r.samples = atomic_load(&samples);
    for (int k = 1; k <= BURSTS; k++)
        r.gaps_with_warm += atomic_load(&gap_max[k]) > 0;
    r.ok = 1;
    return r;
}

#define FIELDS(X)                                                                                  \
    X(bound)                                                                                       \
    X(max_warm)                                                                                    \
    X(samples)                                                                                     \
    X(gaps_with_warm)                                                                              \
    X(used_bursts)                                                                                 \
    X(warm_before)                                                                                 \
    X(warm_after)                                                                                  \
    X(used_total)                                                                                  \
    X(warm_end)                                                                                    \
    X(warm_early)                                                                                  \
    X(early_ms)                                                                                    \
    X(warm_drained)                                                                                \
    X(drain_ms)                                                                                    \
    X(drained_bytes)                                                                               \
    X(prefaulted_bytes)                                                                            \
    X(rss_end)                                                                                     \
    X(rss_drained)                                                                                 \
    X(ok)

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *sc = getenv("LULL_TEST_WARM");
    if (!sc) return;
    if (strcmp(sc, "pattern") != 0) {
        dprintf(1, "error=unknown scenario %s\n", sc);
        _exit(2);
    }
    warm_result r = run_pattern();
#define PRINT(f) dprintf(1, #f "=%llu\n", (unsigned long long)r.f);
    FIELDS(PRINT)
#undef PRINT
    _exit(0);
}

/* ---- the test side -------------------------------------------------------- */

/* Run this program again with `conf` as LULL_CONF (tests/support/reexec.h:
 * the parent's environment minus LULL_* variables). */
static void run_scenario(const char *conf, child_run *cr) {
    static char conf_var[256];
    snprintf(conf_var, sizeof conf_var, "LULL_CONF=%s", conf);
    const char *vars[] = {conf_var, "LULL_TEST_WARM=pattern", NULL};
    reexec_run("test_warm_reserve_scenario", vars, conf, 240000, cr);
    reexec_assert_exited_0(cr, conf);
}

static warm_result result_of(const child_run *cr) {
    warm_result r;
#define GET(f) r.f = reexec_field(cr, #f);
    FIELDS(GET)
#undef GET
    cr_assert_eq(r.ok, 1, "the scenario could not run (no reclaim thread?):\n%s", cr->out);
    return r;
}

#define MB(x) ((unsigned long long)(x) >> 20)

Test(warm_reserve, fills_between_bursts_stays_bounded_is_used_and_drains, .timeout = 240) {
    child_run cr;
    run_scenario("purge_delay_ms=50,purge_mode=dontneed,warm_reserve_mb=16", &cr);
    warm_result r = result_of(&cr);
    const uint64_t bound = 16 * MiB;
    cr_assert_eq(r.bound, bound, "warm_reserve_mb in force: %llu MiB", MB(r.bound));

    /* the sampler ran all along, and never saw more than the bound */
    cr_assert_geq(r.samples, 100, "only %llu samples", (unsigned long long)r.samples);
    cr_assert_leq(r.max_warm, bound, "warm reached %llu KiB, bound %llu KiB",
                  (unsigned long long)r.max_warm >> 10, (unsigned long long)bound >> 10);

    /* the reserve filled between bursts (refaults began with burst 2) */
    cr_assert_gt(r.max_warm, 0, "the reserve never filled");
    cr_assert_geq(r.gaps_with_warm, 1, "warm was 0 in every quiet period");
    cr_assert_gt(r.prefaulted_bytes, 0);

    /* and it was used: a burst that began with warm memory took it */
    cr_assert_geq(r.used_bursts, 1, "no burst began with warm memory");
    cr_assert_gt(r.warm_before, 0);
    cr_assert_leq(r.warm_after, r.warm_before / 2,
                  "a 64 MiB burst left %llu of %llu KiB warm: the reserve is not handed out",
                  (unsigned long long)r.warm_after >> 10, (unsigned long long)r.warm_before >> 10);
    cr_assert_gt(r.used_total, 0);

    /* after the pattern: full, kept while the refaults are recent */
    cr_assert_gt(r.warm_end, 0, "the reserve was empty right after the bursts");
    cr_assert_leq(r.warm_end, bound);
    if (r.early_ms < LULL_WARM_IDLE_MS * 3 / 4)
        cr_assert_gt(r.warm_early, 0, "drained %llu ms after the bursts, before the %d ms idle",
                     (unsigned long long)r.early_ms, LULL_WARM_IDLE_MS);

    /* then drained: warm back to 0, the bytes purged, RSS lower */
    cr_assert_eq(r.warm_drained, 0, "warm still %llu KiB %llu ms after the bursts",
                 (unsigned long long)r.warm_drained >> 10, (unsigned long long)r.drain_ms);
    cr_assert_geq(r.drain_ms, LULL_WARM_IDLE_MS);
    cr_assert_geq(r.drained_bytes, r.warm_end, "drained %llu KiB of a %llu KiB reserve",
                  (unsigned long long)r.drained_bytes >> 10, (unsigned long long)r.warm_end >> 10);
    /* a quarter of the reserve's bytes for the rest of the process's RSS
     * moving meanwhile; half under the sanitizers, whose shadow and
     * runtime grow on their own (TSan: 2.00 of 2.69 MiB in CI run ci27a) */
#ifdef LULL_SANITIZED
    uint64_t must_fall = r.warm_end / 2;
#else
    uint64_t must_fall = r.warm_end * 3 / 4;
#endif
    cr_assert_leq(r.rss_drained + must_fall, r.rss_end,
                  "RSS %llu MiB with the reserve (%llu MiB), %llu MiB after the drain",
                  MB(r.rss_end), MB(r.warm_end), MB(r.rss_drained));
}

/* The counter-test: the same program with no reserve never has warm memory
 * (and the bound is what keeps it at 0). */
Test(warm_reserve, a_zero_bound_keeps_nothing_warm, .timeout = 240) {
    child_run cr;
    run_scenario("purge_delay_ms=50,purge_mode=dontneed,warm_reserve_mb=0", &cr);
    warm_result r = result_of(&cr);
    cr_assert_eq(r.bound, 0);
    cr_assert_geq(r.samples, 100);
    cr_assert_eq(r.max_warm, 0, "warm reached %llu KiB with warm_reserve_mb=0",
                 (unsigned long long)r.max_warm >> 10);
    cr_assert_eq(r.prefaulted_bytes, 0);
    cr_assert_eq(r.used_bursts, 0);
}

/* A smaller bound is a bound too (and not just a coincidence of 16 MiB). */
Test(warm_reserve, a_small_bound_is_respected, .timeout = 240) {
    child_run cr;
    run_scenario("purge_delay_ms=50,purge_mode=dontneed,warm_reserve_mb=3", &cr);
    warm_result r = result_of(&cr);
    cr_assert_eq(r.bound, 3 * MiB);
    cr_assert_gt(r.max_warm, 0, "the reserve never filled");
    cr_assert_leq(r.max_warm, 3 * MiB, "warm reached %llu KiB, bound 3072 KiB",
                  (unsigned long long)r.max_warm >> 10);
    cr_assert_eq(r.warm_drained, 0);
}
