/* Transparent huge pages (thp=auto, numa/thp.h), each scenario in a new
 * process (thp is a start-up key): 64 MiB of small blocks become huge
 * pages (the reclaim thread collapses the dense regions); holes of whole
 * spans in every region split none of them (the free slices wait); freeing
 * everything gives the regions back, most whole; lull_purge_all() splits
 * what it must; thp=never forms none; a failing MADV_COLLAPSE is counted and
 * harmless; the warm reserve makes regions huge pages before spans take
 * them (the request thread then takes a few faults where it would take
 * one a 4 KiB page), and goes back when the heap is freed; and the thread
 * that does all this makes no purge call (the
 * seccomp watch, tests/support/syscall_watch.h). Waits are bounded by events: reclaim ticks
 * (lull_reclaim_now) until a counter stops moving, with a timeout only as a backstop. On a system
 * whose THP is "never", lull must say thp is unavailable, and the coverage checks are skipped with
 * a message. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/policy.h"
#include "tests/support/reexec.h"
#include "tests/support/syscall_watch.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define HEAP (64 * MiB)
#define MAX_BLOCKS (1u << 20)

static void *blocks[MAX_BLOCKS];
static unsigned nblocks;

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static long rollup_kb(const char *key) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    size_t k = strlen(key);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, k) == 0) v = atol(line + k);
    fclose(f);
    return v;
}

static struct lull_counters_thp thp(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c.thp;
}

/* Reclaim ticks until `field` of the thp counters has not moved for 5
 * ticks in a row (or 20 s, a backstop). */
static void settle(size_t offset) {
    uint64_t last = UINT64_MAX, until = now_ms() + 20000;
    for (int same = 0; same < 5 && now_ms() < until;) {
        lull_reclaim_now();
        struct lull_counters_thp t = thp();
        uint64_t v;
        memcpy(&v, (const char *)&t + offset, sizeof v);
        same = v == last ? same + 1 : 0;
        last = v;
        usleep(2000);
    }
}
#define SETTLE(field) settle(offsetof(struct lull_counters_thp, field))

#define SEED 88172645463325252ULL

/* The blocks' sizes, 64-4096 B: the same sequence from SEED each time. */
static size_t next_size(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return 64 + *x % 4033;
}

/* HEAP of blocks, each filled with `byte`; with tick_every, a reclaim tick
 * (waited for) each time that much more was allocated. */
static void fill_with(unsigned char byte, size_t tick_every) {
    size_t total = 0, ticked = 0;
    uint64_t x = SEED;
    for (nblocks = 0; total < HEAP && nblocks < MAX_BLOCKS; nblocks++) {
        size_t n = next_size(&x);
        blocks[nblocks] = lull_malloc(n);
        memset(blocks[nblocks], byte, n);
        total += n;
        if (tick_every && total - ticked >= tick_every) {
            ticked = total;
            lull_reclaim_now();
        }
    }
}

static void fill(void) {
    fill_with(1, 0);
}

static void print(const char *what) {
    struct lull_counters c;
    lull_stats(&c);
    printf("%s_lull_resident_kb=%llu\n", what,
           (unsigned long long)(lull_counters_resident_bound(&c.total) >> 10));
    struct lull_counters_thp t = c.thp;
    printf("%s_anon_kb=%ld\n%s_huge_kb=%ld\n%s_state=%llu\n%s_collapses=%llu\n%s_failures=%llu\n"
           "%s_splits=%llu\n%s_whole=%llu\n%s_held_regions=%llu\n%s_lull_huge_mb=%llu\n",
           what, rollup_kb("Anonymous:"), what, rollup_kb("AnonHugePages:"), what,
           (unsigned long long)t.state, what, (unsigned long long)t.collapses, what,
           (unsigned long long)t.collapse_failures, what, (unsigned long long)t.splits, what,
           (unsigned long long)t.whole_purges, what, (unsigned long long)t.held_regions, what,
           (unsigned long long)(t.huge_bytes >> 20));
    printf("%s_prefaulted=%llu\n", what, (unsigned long long)t.prefaulted_regions);
}

static long thread_minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_minflt;
}

/* The warm reserve with thp on: the heap grows 4 MiB between reclaim
 * ticks (each waited for: the test is bound by ticks, not by time), so
 * that each tick sees the growth and makes regions ready ahead of it. The
 * coverage is taken at once after the fill, before any settling: what the
 * reserve made ready, not what the collapses form afterwards; and the
 * request thread's own page faults are counted (a prefaulted huge page
 * takes none). Then everything is freed: the reserve goes back. */
static void reserve_scenario(void) {
    long faults = thread_minor_faults();
    fill_with(0x5a, 4 * MiB);
    faults = thread_minor_faults() - faults;
    print("filled");
    printf("filled_request_faults=%ld\nheap_pages=%zu\n", faults, HEAP / 4096);
    bool intact = true;
    uint64_t x = SEED;
    for (unsigned i = 0; i < nblocks; i++) {
        size_t n = next_size(&x);
        const unsigned char *b = blocks[i];
        intact &= b[0] == 0x5a && b[n - 1] == 0x5a;
        lull_free(blocks[i]);
    }
    printf("intact=%d\n", intact);
    /* ticks until the reserve is back and the huge bytes stop moving
     * (the empty spans a heap keeps pin a few regions), or 20 s */
    uint64_t until = now_ms() + 20000, last = UINT64_MAX;
    struct lull_counters c;
    for (int same = 0; same < 5 && now_ms() < until;) {
        lull_reclaim_now();
        usleep(2000);
        lull_stats(&c);
        same = !c.total.warm && c.thp.huge_bytes == last ? same + 1 : 0;
        last = c.thp.huge_bytes;
    }
    print("empty");
    printf("empty_warm_kb=%llu\n", (unsigned long long)(c.total.warm >> 10));
    /* the heap again, on regions purged and made huge again: the spans
     * that take them fault nothing, so the purge policy must not count
     * them as purged memory coming back (wasted purges: it chose MADV_FREE
     * for them, and bench_stall kept 518 MiB after its bulk free) */
    uint64_t refaulted = atomic_load(&lull_the_policy.refaulted_slices);
    fill_with(0x5a, 4 * MiB);
    print("refilled");
    printf("refilled_refaulted_slices=%llu\nheap_slices=%zu\n",
           (unsigned long long)(atomic_load(&lull_the_policy.refaulted_slices) - refaulted),
           HEAP / (64 * 1024));
}

/* The scenario, on a thread whose purge calls the watch records: with
 * thp on too, no request thread may make one (collapses are the reclaim
 * thread's). */
static void *run_scenario(void *arg) {
    const char *sc = arg;
    if (syscall_watch_install_on_this_thread() != 0) {
        printf("watch_installed=0\n");
        return NULL;
    }
    if (strcmp(sc, "reserve") == 0) {
        reserve_scenario();
        syscall_watch_thread_done();
        printf("watch_installed=1\n");
        return NULL;
    }
    fill();
    SETTLE(collapses);
    print("filled");
    /* the first 128 KiB of every 2 MiB: whole spans there empty, their
     * slices free inside regions that keep live blocks (about 6 % of the
     * heap, within what thp=auto keeps: an eighth of the huge bytes) */
    for (unsigned i = 0; i < nblocks; i++)
        if (((uintptr_t)blocks[i] & (2 * MiB - 1)) < 128 * 1024) {
            lull_free(blocks[i]);
            blocks[i] = NULL;
        }
    SETTLE(held_bytes);
    print("sparse");
    if (strcmp(sc, "churn") == 0) {
        /* the frees all within one purge delay, as a server's burst of
         * frees is: with the delay at 0, the reclaim thread purged regions
         * the loop had half emptied, as often as the loop was slow (the
         * TSan build: most regions split, in 4 of 6 runs) */
        lull_set_purge_delay_ms(3600 * 1000);
        for (unsigned i = 0; i < nblocks; i++)
            lull_free(blocks[i]);
        lull_set_purge_delay_ms(0);
        SETTLE(huge_bytes);
        print("empty");
    } else if (strcmp(sc, "purge_all") == 0) {
        lull_purge_all();
        print("purged");
    }
    syscall_watch_thread_done();
    printf("watch_installed=1\n");
    return NULL;
}

__attribute__((constructor(200))) static void scenario(void) {
    const char *sc = getenv("LULL_TEST_THP");
    if (!sc) return;
    if (strcmp(sc, "unprompted") == 0) {
        /* no call of lull's API: the reclaim thread must start by itself
         * (thp on wants it from the start) and collapse the heap */
        fill();
        uint64_t until = now_ms() + 20000;
        long anon, huge;
        do {
            usleep(20000);
            anon = rollup_kb("Anonymous:");
            huge = rollup_kb("AnonHugePages:");
        } while (huge < (long)(HEAP / 2 / 1024) && now_ms() < until);
        printf("unprompted_anon_kb=%ld\nunprompted_huge_kb=%ld\nwatch_installed=1\n"
               "request_thread_purges=0\n",
               anon, huge);
        fflush(stdout);
        _exit(0);
    }
    lull_set_purge_delay_ms(0);
    if (!lull_reclaim_now() || syscall_watch_start() != 0) _exit(3);
    pthread_t t;
    if (pthread_create(&t, NULL, run_scenario, (void *)sc) != 0) _exit(2);
    pthread_join(t, NULL);
    printf("request_thread_purges=%zu\n", syscall_watch_count());
    fflush(stdout);
    _exit(0);
}

/* ---- the parent ------------------------------------------------------------ */

static bool system_thp_off(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return true;
    char buf[128] = {0};
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    fclose(f);
    return strstr(buf, "[never]") != NULL;
}

static child_run run(const char *scenario, const char *conf, const char *fault) {
    char sc[64], cf[64], ft[64];
    snprintf(sc, sizeof sc, "LULL_TEST_THP=%s", scenario);
    snprintf(cf, sizeof cf, "LULL_CONF=warm_reserve_mb=0,%s", conf);
    snprintf(ft, sizeof ft, "LULL_FAULT=%s", fault ? fault : "");
    const char *vars[] = {sc, cf, fault ? ft : NULL, NULL};
    child_run cr;
    reexec_run("test_thp_scenario", vars, scenario, 120000, &cr);
    reexec_assert_exited_0(&cr, scenario);
    cr_assert_eq(reexec_field(&cr, "watch_installed"), 1, "no seccomp watch:\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "request_thread_purges"), 0,
                 "a request thread made a purge call:\n%s\n%s", cr.out, cr.err);
    return cr;
}

#define F(cr, k) reexec_field(&(cr), k)

/* coverage of what lull may hold resident (the process's anonymous memory
 * is mostly the heap, but a sanitizer's shadow would dwarf it) */
static double coverage(const child_run *cr, const char *when) {
    char a[64], h[64];
    snprintf(a, sizeof a, "%s_lull_resident_kb", when);
    snprintf(h, sizeof h, "%s_huge_kb", when);
    return (double)reexec_field(cr, h) / (double)reexec_field(cr, a);
}

/* true when the checks of huge pages apply: lull's state matches the
 * system's setting either way */
static bool thp_works(const child_run *cr) {
    if (system_thp_off()) {
        cr_assert_eq(reexec_field(cr, "filled_state"), LULL_COUNTERS_THP_UNAVAILABLE,
                     "THP is off in the system: lull must say thp is unavailable");
        cr_log_warn("THP is \"never\" on this system: coverage not checked");
        return false;
    }
    cr_assert_eq(reexec_field(cr, "filled_state"), LULL_COUNTERS_THP_ON);
    return true;
}

Test(thp, dense_regions_become_huge_and_live_ones_are_never_split, .timeout = 180) {
    child_run cr = run("churn", "thp=auto", NULL);
    if (!thp_works(&cr)) return;
    double filled = coverage(&cr, "filled"), half = coverage(&cr, "sparse");
    cr_log_info("coverage: %.1f %% filled, %.1f %% with holes", 100 * filled, 100 * half);
    cr_expect_geq(filled, 0.9, "%.1f %% of the heap in huge pages after the collapses:\n%s",
                  100 * filled, cr.out);
    cr_expect_gt(F(cr, "filled_collapses"), 24, "%s", cr.out);
    /* every region keeps live blocks: no purge may split one */
    cr_expect_eq(F(cr, "sparse_splits"), 0, "%s", cr.out);
    cr_expect_gt(F(cr, "sparse_held_regions"), 0, "no purge was put off:\n%s", cr.out);
    cr_expect_geq(half, 0.9 * filled, "coverage fell from %.1f to %.1f %%:\n%s", 100 * filled,
                  100 * half, cr.out);
    /* all free: the regions go back, most of them whole (the heap's kept
     * empty spans pin a few, split past the bound), and the memory too */
    cr_expect_gt(F(cr, "empty_whole"), F(cr, "empty_splits"), "%s", cr.out);
    cr_expect_lt(F(cr, "empty_lull_resident_kb"), F(cr, "filled_lull_resident_kb") / 4,
                 "the freed heap stayed resident:\n%s", cr.out);
#ifndef LULL_SANITIZED
    cr_expect_lt(F(cr, "empty_anon_kb"), F(cr, "filled_anon_kb") / 4,
                 "the kernel still counts the freed heap:\n%s", cr.out);
#endif
}

Test(thp, purge_all_splits_what_it_must, .timeout = 180) {
    child_run cr = run("purge_all", "thp=auto", NULL);
    if (!thp_works(&cr)) return;
    /* the holes kept by thp=auto go back, splitting their regions */
    cr_expect_gt(F(cr, "purged_splits"), 0, "%s", cr.out);
    cr_expect_lt(F(cr, "purged_lull_resident_kb") + 2048, F(cr, "sparse_lull_resident_kb"),
                 "lull_purge_all gave back less than 2 MiB:\n%s", cr.out);
}

Test(thp, never_forms_no_huge_page, .timeout = 180) {
    child_run cr = run("churn", "thp=never", NULL);
    cr_expect_eq(F(cr, "filled_state"), LULL_COUNTERS_THP_OFF);
    cr_expect_eq(F(cr, "filled_collapses"), 0);
    cr_expect_eq(F(cr, "filled_lull_huge_mb"), 0);
}

Test(thp, a_failing_collapse_is_counted_and_harmless, .timeout = 180) {
    child_run cr = run("churn", "thp=auto", "collapse");
    if (!thp_works(&cr)) return;
    cr_expect_gt(F(cr, "filled_failures"), 0, "%s", cr.out);
    cr_expect_eq(F(cr, "filled_collapses"), 0, "%s", cr.out);
    cr_expect_eq(F(cr, "filled_lull_huge_mb"), 0, "%s", cr.out);
    /* and with the reserve on: no region is prefaulted, its slices go
     * back clean, the heap is right */
    child_run rr = run("reserve", "thp=auto,warm_reserve_mb=64", "collapse");
    cr_expect_eq(F(rr, "filled_prefaulted"), 0, "%s", rr.out);
    cr_expect_gt(F(rr, "filled_failures"), 0, "%s", rr.out);
    cr_expect_eq(F(rr, "intact"), 1, "%s", rr.out);
    cr_expect_eq(F(rr, "empty_warm_kb"), 0, "%s", rr.out);
}

Test(thp, the_reclaim_thread_forms_huge_pages_unprompted, .timeout = 180) {
    child_run cr = run("unprompted", "thp=auto", NULL);
    if (system_thp_off()) return;
    /* half of the heap at least (against the heap: a sanitizer's shadow
     * would dwarf it in Anonymous) */
    cr_expect_geq(F(cr, "unprompted_huge_kb"), HEAP / 2 / 1024,
                  "no reclaim thread formed huge pages:\n%s", cr.out);
}

/* The warm reserve in 2 MiB units (reclaim/warm_reserve.c): new spans land
 * on regions the reclaim thread made huge pages before they were used, so
 * the request thread neither faults (a 4 KiB page heap would take
 * HEAP/4096 faults) nor waits for a collapse; and the reserve goes back
 * when the heap is freed. */
Test(thp, the_reserve_prefaults_huge_pages_ahead_of_the_heap, .timeout = 180) {
    child_run cr = run("reserve", "thp=auto,warm_reserve_mb=64", NULL);
    if (!thp_works(&cr)) return;
    double filled = coverage(&cr, "filled");
    cr_log_info("coverage right after the fill: %.1f %%, %lld request-thread faults", 100 * filled,
                (long long)F(cr, "filled_request_faults"));
    cr_expect_eq(F(cr, "intact"), 1, "a block changed:\n%s", cr.out);
    /* most of 32 regions a 64 MiB heap takes (the first of each segment
     * holds its header, and is collapsed, not prefaulted) */
    cr_expect_geq(F(cr, "filled_prefaulted"), 20, "%s", cr.out);
    cr_expect_geq(filled, 0.8, "%.1f %% in huge pages right after the fill:\n%s", 100 * filled,
                  cr.out);
#ifndef LULL_SANITIZED
    /* (a sanitizer's shadow faults on the request thread too) */
    cr_expect_lt(F(cr, "filled_request_faults"), F(cr, "heap_pages") / 4,
                 "the request thread faulted the heap in itself:\n%s", cr.out);
#endif
    cr_expect_eq(F(cr, "empty_warm_kb"), 0, "the reserve stayed:\n%s", cr.out);
    cr_expect_gt(F(cr, "refilled_prefaulted"), F(cr, "filled_prefaulted"), "%s", cr.out);
    cr_expect_lt(F(cr, "refilled_refaulted_slices"), F(cr, "heap_slices") / 4,
                 "prefaulted regions counted as refaults:\n%s", cr.out);
    cr_expect_lt(F(cr, "empty_lull_resident_kb"), F(cr, "filled_lull_resident_kb") / 4,
                 "the freed heap stayed resident:\n%s", cr.out);
}

/* Without the reserve (warm_reserve_mb=0) the same fill faults the heap in
 * on the request thread: the check above can fail. */
Test(thp, without_the_reserve_the_request_thread_faults, .timeout = 180) {
    child_run cr = run("reserve", "thp=auto,warm_reserve_mb=0", NULL);
    if (!thp_works(&cr)) return;
    cr_log_info("without the reserve: %.1f %% right after the fill, %lld request-thread faults",
                100 * coverage(&cr, "filled"), (long long)F(cr, "filled_request_faults"));
    cr_expect_eq(F(cr, "filled_prefaulted"), 0, "%s", cr.out);
    cr_expect_gt(F(cr, "filled_request_faults"), F(cr, "heap_pages") / 2, "%s", cr.out);
}
