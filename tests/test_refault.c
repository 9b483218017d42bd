/* The refault monitor as the whole library drives it (reclaim/refault.c on
 * the reclaim thread's tick), seen through lull_stats():
 *
 *  - default configuration (refault_monitor=auto: PAGEMAP_SCAN present bit
 *    on this kernel): 64 MiB of 64 KiB blocks touched, freed and purged,
 *    then allocated again with every other page written: refault_pages
 *    grows by about the pages written into purged slices (bounds from the
 *    block addresses: only blocks that land on a slice that was purged
 *    count), every refault has a distance of at least the pause the test
 *    made after the purge; the control (allocated again, not touched) grows
 *    by at most the one page lull itself writes per block;
 *  - in new processes (the configuration is read at start): refault_monitor=
 *    off -> "off"; LULL_FAULT=pagemap_scan -> "accounting", where
 *    refault_pages counts 16 pages per purged slice reused, touched or not;
 *    refault_monitor=on -> "uffd_wp", counting written pages; LULL_FAULT=uffd
 *    with refault_monitor=on -> back to "pagemap_scan", still counting;
 *  - with userfaultfd armed over purged ranges, a request thread writes into
 *    the reused memory while the reclaim thread is held inside its tick (a
 *    tick hook that waits): the writes complete (a watchdog fails the test
 *    otherwise), the reclaim thread did not tick meanwhile, and once
 *    released it counts the writes: the pages were protected;
 *  - uffd_wp: every purge path re-arms what it purged (checked directly:
 *    no page of a purged free slice reads as written, and end to end: only
 *    the written pages count): memory freed in a segment mapped since the
 *    last tick (purged before the tick registers the segment), slices
 *    purged with MADV_FREE and again with MADV_DONTNEED LAZY_MAX_MS later,
 *    and slices the warm reserve prefaulted and drained;
 *  - the present scan gives the same count after MADV_FREE + MADV_DONTNEED.
 *
 * The scenario in a new process is this very program run again with
 * LULL_TEST_REFAULT set: a constructor runs it before Criterion starts and
 * prints its figures as key=value lines; the test asserts on them. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "numa/arena.h"
#include "numa/slice_history.h"
#include "numa/slice_state.h"
#include "base/linux_compat.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/reclaim_wait.h"
#include "tests/support/reexec.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define PAGE ((size_t)4096)
#define BLOCK (64 * KiB) /* one slice: a block per slice, slice aligned */
#define PAGES_PER_BLOCK (BLOCK / PAGE)
#define TOTAL (64 * MiB)
#define NBLOCKS (TOTAL / BLOCK)

/* ---- helpers shared by the in-process test and the scenarios ------------ */

static struct lull_counters stats(void) {
    return reclaim_wait_stats();
}

static void *blocks_a[NBLOCKS], *blocks_b[NBLOCKS];
/* Every 64 KiB block address the test was handed (sorted and unique after
 * each purge), and those of them that are purged now. */
#define HISTORY (8 * NBLOCKS)
static uintptr_t history[HISTORY], purged_a[HISTORY];
static size_t nhistory, npurged_a;

static void remember(const void *p) {
    if (nhistory < HISTORY) history[nhistory++] = (uintptr_t)p;
}

static int cmp_uptr(const void *x, const void *y) {
    uintptr_t a = *(const uintptr_t *)x, b = *(const uintptr_t *)y;
    return a < b ? -1 : a > b;
}

static bool was_purged(const void *p) {
    uintptr_t key = (uintptr_t)p;
    return bsearch(&key, purged_a, npurged_a, sizeof key, cmp_uptr) != NULL;
}

static size_t resident_pages(const void *p, size_t len) {
    unsigned char vec[BLOCK / PAGE];
    if (mincore((void *)p, len, vec) != 0) return len / PAGE;
    size_t n = 0;
    for (size_t i = 0; i < len / PAGE; i++)
        n += vec[i] & 1;
    return n;
}

typedef enum { TOUCH_NONE, TOUCH_HALF, TOUCH_ALL_EVEN_BLOCKS } touch_kind;

/* Pages of block i the pattern writes (lull writes page 0 of each block
 * itself when it carves the block: a free-list link). */
static size_t pattern_pages(touch_kind k, size_t i) {
    switch (k) {
    case TOUCH_HALF:
        return PAGES_PER_BLOCK / 2;
    case TOUCH_ALL_EVEN_BLOCKS:
        return i % 2 == 0 ? PAGES_PER_BLOCK : 1;
    default:
        return 1;
    }
}

static void write_pattern(void *p, touch_kind k, size_t i) {
    volatile unsigned char *b = p;
    switch (k) {
    case TOUCH_HALF:
        for (size_t pg = 0; pg < PAGES_PER_BLOCK; pg += 2)
            b[pg * PAGE + 8] = (unsigned char)i;
        break;
    case TOUCH_ALL_EVEN_BLOCKS:
        if (i % 2 == 0)
            for (size_t pg = 0; pg < PAGES_PER_BLOCK; pg++)
                b[pg * PAGE + 8] = (unsigned char)i;
        break;
    default:
        break;
    }
}

typedef struct {
    uint64_t mechanism;
    uint64_t purged_pages;    /* growth while phase A was purged */
    uint64_t purged_blocks;   /* blocks the test ever had, not resident after phase A */
    uint64_t purged_free;     /* ... whose slice is free now (not in a span again) */
    uint64_t overlap;         /* phase B blocks on one of those (purged memory) */
    uint64_t expect_written;  /* pages the pattern wrote into those (incl. lull's page 0) */
    uint64_t refault;         /* refault_pages growth over phase B */
    uint64_t dist_total;      /* growth of the refault_distance[] entries */
    uint64_t dist_min_bucket; /* lowest bucket that grew (16 if none) */
    uint64_t dist_max_bucket;
    uint64_t dist_sum_ms;   /* refault_distance_ms_sum growth */
    uint64_t pause_ms;      /* pause between purge and reuse */
    uint64_t elapsed_ms;    /* from the start of phase A to the end of the scans */
    uint64_t armed_slices;  /* uffd_wp: purged free slices checked after phase A */
    uint64_t unarmed_pages; /* ... of their pages that were not write-protected */
    uint64_t ok;            /* the setup worked (reclaim thread, purge) */
} cycle_result;

#define PAUSE_MS 40

/* How phase A purges its memory. */
typedef enum {
    PURGE_PLAIN,          /* MADV_DONTNEED once the memory is free */
    PURGE_FRESH_SEGMENTS, /* the same, the segments purged on the tick after they were mapped */
    PURGE_LAZY,           /* MADV_FREE, then MADV_DONTNEED once LAZY_MAX_MS old */
} purge_kind;

#define LAZY_MAX_MS 3000 /* LULL_POLICY_LAZY_MAX_MS */

static void setup_reclaim(purge_kind how) {
    /* the RSS-visible mode (a MADV_FREE'd page stays present), and no warm
     * reserve (it prefaults purged slices on purpose): both would blur the
     * count of pages the program brought back */
    lull_configure("purge_mode", how == PURGE_LAZY ? "free" : "dontneed");
    lull_configure("warm_reserve_mb", "0");
    lull_set_purge_delay_ms(0);
}

/* uffd_wp: every purged slice that is free (FREE_CLEAN with a purge time,
 * so watched when it is taken again) must be write-protected, or all its
 * pages read as written. Counts the pages that are not, with the reclaim
 * thread held (nothing moves); 0 slices checked in other mechanisms. */
static void check_armed(uint64_t *slices, uint64_t *unarmed) {
    *slices = *unarmed = 0;
    if (stats().refault_mechanism != LULL_COUNTERS_REFAULT_UFFD_WP) return;
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || !reclaim_hold()) {
        *unarmed = UINT64_MAX;
        if (fd >= 0) close(fd);
        return;
    }
    for (int a = 0; a < lull_arena_count; a++)
        for (lull_segment *sg = atomic_load(&lull_arenas[a].segments); sg; sg = sg->next)
            for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++) {
                bool clean = atomic_load(&lull_slice_maps_of(sg)->clean[i / 64]) >> (i % 64) & 1;
                if (!clean || atomic_load(&lull_slice_history_of(sg)->purged_ms[i]) == 0) continue;
                struct page_region v[PAGES_PER_BLOCK];
                struct pm_scan_arg arg;
                memset(&arg, 0, sizeof arg);
                arg.size = sizeof arg;
                arg.start = (uintptr_t)lull_slice_address(sg, i);
                arg.end = arg.start + LULL_SLICE_SIZE;
                arg.vec = (uintptr_t)v;
                arg.vec_len = PAGES_PER_BLOCK;
                arg.category_mask = PAGE_IS_WRITTEN;
                arg.return_mask = PAGE_IS_WRITTEN;
                long n = ioctl(fd, PAGEMAP_SCAN, &arg);
                if (n < 0) {
                    *unarmed = UINT64_MAX;
                    continue;
                }
                (*slices)++;
                for (long k = 0; k < n; k++)
                    *unarmed += (v[k].end - v[k].start) / PAGE;
            }
    reclaim_release();
    close(fd);
}

/* Is the slice at p free (in one of its segment's free maps)? A purged
 * block's slice may be in a span again, carved for another allocation and
 * not touched yet: not resident, but not a purged free slice either. */
static bool slice_free(uintptr_t p) {
    lull_segment *sg = (lull_segment *)(p & ~(uintptr_t)(LULL_SEGMENT_SIZE - 1));
    unsigned i = (unsigned)((p - (uintptr_t)sg) >> LULL_SLICE_SHIFT);
    uint64_t bit = (uint64_t)1 << (i % 64);
    return (atomic_load(&lull_slice_maps_of(sg)->clean[i / 64]) |
            atomic_load(&lull_slice_maps_of(sg)->dirty[i / 64]) |
            atomic_load(&lull_slice_maps_of(sg)->purging[i / 64])) &
           bit;
}

/* The end of phase A: what was purged, and which blocks the test ever had
 * are purged now. */
static bool finish_phase_a(cycle_result *r, uint64_t p0) {
    r->purged_pages = stats().purged_pages - p0;
    qsort(history, nhistory, sizeof history[0], cmp_uptr);
    size_t u = 0;
    for (size_t i = 0; i < nhistory; i++)
        if (u == 0 || history[i] != history[u - 1]) history[u++] = history[i];
    nhistory = u;
    npurged_a = 0;
    for (size_t i = 0; i < nhistory; i++)
        if (resident_pages((void *)history[i], BLOCK) == 0) purged_a[npurged_a++] = history[i];
    r->purged_blocks = npurged_a;
    r->purged_free = 0;
    for (size_t i = 0; i < npurged_a; i++)
        r->purged_free += slice_free(purged_a[i]);
    check_armed(&r->armed_slices, &r->unarmed_pages);
    return true;
}

/* Phase A: 64 MiB of 64 KiB blocks touched, freed and purged; returns false
 * if the purge did not happen. Fills purged_a with the blocks the test ever
 * had (this phase's and earlier cycles') that are no longer resident: every
 * one was written, so they are purged (not kept by a heap). */
static bool phase_a(cycle_result *r, uint64_t *started_at, purge_kind how) {
    /* the start, not the end of the purge: slices freed before (and dirty)
     * are purged as soon as the delay is 0, before this phase's own */
    *started_at = now_ms();
    setup_reclaim(how);
    /* fresh segments: the reclaim thread sees the new segments only once
     * their memory is free, so its next tick purges them before anything
     * else happens to them (e.g. userfaultfd registration) */
    bool hold_until_freed = how == PURGE_FRESH_SEGMENTS;
    if (hold_until_freed && !reclaim_hold()) return false;
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks_a[i] = lull_malloc(BLOCK);
        if (!blocks_a[i]) return false;
        memset(blocks_a[i], 0x5a, BLOCK);
        remember(blocks_a[i]);
    }
    uint64_t p0 = stats().purged_pages;
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(blocks_a[i]);
    if (hold_until_freed && !reclaim_release()) return false;
    if (!purge_everything_freed()) return false;
    uint64_t purged_at = now_ms();
    if (how == PURGE_LAZY) {
        /* MADV_FREE'd slices stay resident until they are purged again
         * with MADV_DONTNEED, LAZY_MAX_MS after the first purge; a few
         * blocks stay resident for good (spans a heap keeps) */
        uint64_t until = purged_at + LAZY_MAX_MS + 20000;
        size_t left = NBLOCKS, before = NBLOCKS + 1;
        int same = 0;
        while (now_ms() < until &&
               (now_ms() < purged_at + LAZY_MAX_MS || same < 3 || left > NBLOCKS / 10)) {
            sleep_ms(100);
            lull_reclaim_now();
            left = 0;
            for (size_t i = 0; i < NBLOCKS; i++)
                left += resident_pages(blocks_a[i], BLOCK) > 0;
            same = left == before ? same + 1 : 0;
            before = left;
        }
    }
    return finish_phase_a(r, p0);
}

/* Phase B: the same blocks again, written as the pattern says; counts the
 * blocks that landed on purged memory and the pages expected back. */
static void phase_b_alloc(cycle_result *r, touch_kind k) {
    r->overlap = r->expect_written = 0;
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks_b[i] = lull_malloc(BLOCK);
        if (!blocks_b[i]) continue;
        write_pattern(blocks_b[i], k, i);
        remember(blocks_b[i]);
        if (was_purged(blocks_b[i])) {
            r->overlap++;
            r->expect_written += pattern_pages(k, i);
        }
    }
}

static void phase_b_free(void) {
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(blocks_b[i]);
}

static void measure(cycle_result *r, const struct lull_counters *s0, const struct lull_counters *s1,
                    uint64_t started_at) {
    r->mechanism = s1->refault_mechanism;
    r->refault = s1->refault_pages - s0->refault_pages;
    r->dist_total = 0;
    r->dist_min_bucket = LULL_COUNTERS_REFAULT_BUCKETS;
    r->dist_max_bucket = 0;
    for (unsigned b = 0; b < LULL_COUNTERS_REFAULT_BUCKETS; b++) {
        uint64_t d = s1->refault_distance[b] - s0->refault_distance[b];
        r->dist_total += d;
        if (d && b < r->dist_min_bucket) r->dist_min_bucket = b;
        if (d) r->dist_max_bucket = b;
    }
    r->dist_sum_ms = s1->refault_distance_ms_sum - s0->refault_distance_ms_sum;
    r->elapsed_ms = now_ms() - started_at;
}

/* One whole cycle: purge, pause, reuse with the pattern, let the scans run. */
static cycle_result run_cycle(touch_kind k, purge_kind how) {
    cycle_result r = {0};
    uint64_t started_at;
    if (!phase_a(&r, &started_at, how)) return r;
    sleep_ms(PAUSE_MS);
    r.pause_ms = PAUSE_MS;
    struct lull_counters s0 = stats();
    phase_b_alloc(&r, k);
    settle_refault_scans();
    struct lull_counters s1 = stats();
    measure(&r, &s0, &s1, started_at);
    phase_b_free();
    r.ok = 1;
    return r;
}

static atomic_int writer_done;

static void *writer_main(void *arg) {
    cycle_result *r = arg;
    phase_b_alloc(r, TOUCH_ALL_EVEN_BLOCKS);
    atomic_store(&writer_done, 1);
    return NULL;
}

typedef struct {
    cycle_result c;
    uint64_t held_ok;      /* the reclaim thread was held before the writer started */
    uint64_t writer_ok;    /* the writer finished within the watchdog's time */
    uint64_t ticks_during; /* reclaim ticks while the writer ran (must be 0) */
    uint64_t still_held;   /* the reclaim thread was still held when it finished */
} noblock_result;

#define WATCHDOG_MS 60000

static noblock_result run_noblock(void) {
    noblock_result n = {0};
    uint64_t started_at;
    /* segments are registered with userfaultfd on the tick after they are
     * mapped: map them (and let ticks pass) before the purge, so that this
     * scenario tests arming and writing, not registration order */
    lull_set_purge_delay_ms(-1);
    for (size_t i = 0; i < NBLOCKS; i++) {
        blocks_a[i] = lull_malloc(BLOCK);
        remember(blocks_a[i]);
    }
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(blocks_a[i]);
    lull_reclaim_now();
    lull_reclaim_now();
    if (!phase_a(&n.c, &started_at, PURGE_PLAIN)) return n;
    sleep_ms(PAUSE_MS);
    n.c.pause_ms = PAUSE_MS;
    struct lull_counters s0 = stats();

    /* hold the reclaim thread: no scan, no purge, no arming from here */
    n.held_ok = reclaim_hold();
    if (!n.held_ok) return n;
    uint64_t ticks0 = stats().reclaim_ticks;

    pthread_t t;
    if (pthread_create(&t, NULL, writer_main, &n.c) != 0) return n;
    uint64_t until = now_ms() + WATCHDOG_MS;
    while (!atomic_load(&writer_done) && now_ms() < until)
        sleep_ms(5);
    n.writer_ok = (uint64_t)atomic_load(&writer_done);
    if (!n.writer_ok) return n; /* the writer is stuck: report, do not join */
    pthread_join(t, NULL);
    n.ticks_during = stats().reclaim_ticks - ticks0;
    n.still_held = (uint64_t)reclaim_held();

    if (!reclaim_release()) return n;
    settle_refault_scans();
    struct lull_counters s1 = stats();
    measure(&n.c, &s0, &s1, started_at);
    phase_b_free();
    n.c.ok = 1;
    return n;
}

/* uffd_wp and the warm reserve: purged slices come back (refaults), the
 * reserve prefaults clean slices, then drains them with MADV_DONTNEED once
 * the refaults are LULL_WARM_IDLE_MS old. Those purged slices must be armed
 * again like any other. */
typedef struct {
    uint64_t warm_seen, warm_left, armed_slices, unarmed_pages, ok;
} drain_result;

static drain_result run_warm_drain(void) {
    drain_result d = {0};
    cycle_result r = {0};
    uint64_t started_at;
    if (!phase_a(&r, &started_at, PURGE_PLAIN)) return d;
    lull_configure("warm_reserve_mb", "16");
    phase_b_alloc(&r, TOUCH_HALF); /* purged slices taken again: refaults */
    /* the reserve answers demand for LULL_WARM_IDLE_MS after the refaults
     * were counted: watch for it right away, with the blocks still live.
     * Watched only after the frees were purged, a slow build (ASan on a
     * loaded machine) spent that window in the purge and never saw it */
    uint64_t until = now_ms() + 20000;
    while (now_ms() < until && d.warm_seen == 0) {
        lull_reclaim_now();
        d.warm_seen = stats().total.warm;
        sleep_ms(20);
    }
    phase_b_free();
    if (!purge_everything_freed()) return d;
    until = now_ms() + 3000 + 20000;
    do {
        sleep_ms(100);
        lull_reclaim_now();
        d.warm_left = stats().total.warm;
    } while (now_ms() < until && d.warm_left > 0);
    check_armed(&d.armed_slices, &d.unarmed_pages);
    d.ok = 1;
    return d;
}

/* ---- scenarios in a new process ----------------------------------------- */

#define PRINT(fd, s, f) dprintf(fd, #f "=%llu\n", (unsigned long long)(s).f)

static void print_cycle(const cycle_result *r) {
    PRINT(1, *r, mechanism);
    PRINT(1, *r, purged_pages);
    PRINT(1, *r, purged_blocks);
    PRINT(1, *r, purged_free);
    PRINT(1, *r, overlap);
    PRINT(1, *r, expect_written);
    PRINT(1, *r, refault);
    PRINT(1, *r, dist_total);
    PRINT(1, *r, dist_min_bucket);
    PRINT(1, *r, dist_max_bucket);
    PRINT(1, *r, dist_sum_ms);
    PRINT(1, *r, pause_ms);
    PRINT(1, *r, elapsed_ms);
    PRINT(1, *r, armed_slices);
    PRINT(1, *r, unarmed_pages);
    PRINT(1, *r, ok);
}

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *sc = getenv("LULL_TEST_REFAULT");
    if (!sc) return;
    if (!lull_reclaim_now()) {
        dprintf(1, "error=no reclaim thread\n");
        _exit(2);
    }
    if (strcmp(sc, "mechanism") == 0) {
        dprintf(1, "mechanism=%llu\n", (unsigned long long)stats().refault_mechanism);
    } else if (strcmp(sc, "cycle_half") == 0) {
        cycle_result r = run_cycle(TOUCH_HALF, PURGE_PLAIN);
        print_cycle(&r);
    } else if (strcmp(sc, "cycle_half_fresh_segments") == 0) {
        cycle_result r = run_cycle(TOUCH_HALF, PURGE_FRESH_SEGMENTS);
        print_cycle(&r);
    } else if (strcmp(sc, "cycle_half_lazy") == 0) {
        cycle_result r = run_cycle(TOUCH_HALF, PURGE_LAZY);
        print_cycle(&r);
    } else if (strcmp(sc, "warm_drain") == 0) {
        drain_result d = run_warm_drain();
        PRINT(1, d, warm_seen);
        PRINT(1, d, warm_left);
        PRINT(1, d, armed_slices);
        PRINT(1, d, unarmed_pages);
        PRINT(1, d, ok);
    } else if (strcmp(sc, "cycle_none") == 0) {
        cycle_result r = run_cycle(TOUCH_NONE, PURGE_PLAIN);
        print_cycle(&r);
    } else if (strcmp(sc, "noblock") == 0) {
        noblock_result n = run_noblock();
        print_cycle(&n.c);
        PRINT(1, n, held_ok);
        PRINT(1, n, writer_ok);
        PRINT(1, n, ticks_during);
        PRINT(1, n, still_held);
        if (!n.writer_ok) _exit(3); /* a thread is stuck: exit without joining it */
    } else {
        dprintf(1, "error=unknown scenario %s\n", sc);
        _exit(2);
    }
    _exit(0);
}

/* Run this program again with the scenario and extra environment `vars`
 * (tests/support/reexec.h: the parent's environment minus LULL_* variables). */
static void run_scenario(const char *scenario, const char *const *vars, child_run *cr) {
    static char scen[128];
    const char *all[4];
    size_t n = 0;
    snprintf(scen, sizeof scen, "LULL_TEST_REFAULT=%s", scenario);
    all[n++] = scen;
    for (size_t i = 0; vars && vars[i]; i++) {
        cr_assert_lt(n, 3);
        all[n++] = vars[i];
    }
    all[n] = NULL;
    reexec_run("test_refault_scenario", all, scenario, 180000, cr);
}

static cycle_result cycle_of(const child_run *cr) {
    reexec_assert_exited_0(cr, "refault scenario");
    cycle_result r;
#define GET(f) r.f = reexec_field(cr, #f)
    GET(mechanism);
    GET(purged_pages);
    GET(purged_blocks);
    GET(purged_free);
    GET(overlap);
    GET(expect_written);
    GET(refault);
    GET(dist_total);
    GET(dist_min_bucket);
    GET(dist_max_bucket);
    GET(dist_sum_ms);
    GET(pause_ms);
    GET(elapsed_ms);
    GET(armed_slices);
    GET(unarmed_pages);
    GET(ok);
#undef GET
    return r;
}

/* ---- assertions ----------------------------------------------------------- */

static bool thp_always(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char buf[128] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strstr(buf, "[always]") != NULL;
}

static void log_cycle(const char *what, const cycle_result *r) {
    cr_log_info("%s: mechanism %s, purged %llu pages (%llu blocks), overlap %llu blocks, expect "
                "%llu pages, refault %llu pages, distances %llu in buckets %llu..%llu (sum %llu "
                "ms), pause %llu ms, elapsed %llu ms",
                what, lull_counters_refault_name(r->mechanism), (unsigned long long)r->purged_pages,
                (unsigned long long)r->purged_blocks, (unsigned long long)r->overlap,
                (unsigned long long)r->expect_written, (unsigned long long)r->refault,
                (unsigned long long)r->dist_total, (unsigned long long)r->dist_min_bucket,
                (unsigned long long)r->dist_max_bucket, (unsigned long long)r->dist_sum_ms,
                (unsigned long long)r->pause_ms, (unsigned long long)r->elapsed_ms);
}

/* The purge happened and phase B reused enough purged memory to judge. */
static void assert_setup(const char *what, const cycle_result *r) {
    log_cycle(what, r);
    cr_assert(r->ok, "%s: no reclaim thread, or the purge never finished", what);
    cr_assert_geq(r->purged_pages, (TOTAL / PAGE) * 8 / 10, "%s: only %llu pages purged", what,
                  (unsigned long long)r->purged_pages);
    cr_assert_geq(r->purged_blocks, NBLOCKS * 8 / 10, "%s: only %llu blocks purged", what,
                  (unsigned long long)r->purged_blocks);
    cr_assert_geq(r->overlap, NBLOCKS / 4, "%s: only %llu blocks reused purged memory", what,
                  (unsigned long long)r->overlap);
    if (r->mechanism == LULL_COUNTERS_REFAULT_UFFD_WP) {
        cr_assert_geq(r->purged_free, NBLOCKS * 8 / 10,
                      "%s: only %llu purged blocks on free slices", what,
                      (unsigned long long)r->purged_free);
        cr_assert_geq(r->armed_slices, r->purged_free,
                      "%s: %llu purged slices checked, %llu blocks purged on free slices", what,
                      (unsigned long long)r->armed_slices, (unsigned long long)r->purged_free);
        cr_assert_eq(r->unarmed_pages, 0, "%s: %llu pages of purged free slices not armed", what,
                     (unsigned long long)r->unarmed_pages);
    }
}

/* The distances: one entry per refaulted page, none shorter than the pause
 * after the purge nor longer than the whole cycle. */
static void assert_distances(const char *what, const cycle_result *r) {
    cr_assert_eq(r->dist_total, r->refault, "%s: %llu distance entries for %llu refaults", what,
                 (unsigned long long)r->dist_total, (unsigned long long)r->refault);
    cr_assert_geq(
        r->dist_min_bucket, lull_counters_refault_bucket(r->pause_ms - 8),
        "%s: a refault %llu+ ms after its purge, but the test paused %llu ms", what,
        (unsigned long long)lull_counters_refault_bucket_min_ms((unsigned)r->dist_min_bucket),
        (unsigned long long)r->pause_ms);
    cr_assert_leq(r->dist_max_bucket, lull_counters_refault_bucket(r->elapsed_ms + 8),
                  "%s: a distance in bucket %llu, the cycle took %llu ms", what,
                  (unsigned long long)r->dist_max_bucket, (unsigned long long)r->elapsed_ms);
}

/* Page-level mechanisms: about the pages written into purged slices. */
static void assert_page_level(const char *what, const cycle_result *r) {
    assert_setup(what, r);
    cr_assert_geq(r->refault, r->expect_written * 3 / 4, "%s: %llu refaults, %llu pages written",
                  what, (unsigned long long)r->refault, (unsigned long long)r->expect_written);
    uint64_t hi = thp_always() ? r->overlap * PAGES_PER_BLOCK + 512
                               : r->expect_written + r->expect_written / 10 + 64;
    cr_assert_leq(r->refault, hi, "%s: %llu refaults, only %llu pages written", what,
                  (unsigned long long)r->refault, (unsigned long long)r->expect_written);
    assert_distances(what, r);
}

/* ---- tests ---------------------------------------------------------------- */

Test(refault, pagemap_scan_counts_the_pages_that_come_back, .timeout = 180) {
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert_eq(stats().refault_mechanism, LULL_COUNTERS_REFAULT_PAGEMAP_SCAN,
                 "refault_monitor=auto chose %s on this kernel (PAGEMAP_SCAN expected, 6.7+)",
                 lull_counters_refault_name(stats().refault_mechanism));

    cycle_result r = run_cycle(TOUCH_HALF, PURGE_PLAIN);
    assert_page_level("every other page written", &r);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_PAGEMAP_SCAN);
    cr_assert_eq(r.expect_written, r.overlap * PAGES_PER_BLOCK / 2);

    /* the control: the same reuse, nothing written but the free-list link
     * lull puts in each block's first page */
    cycle_result c = run_cycle(TOUCH_NONE, PURGE_PLAIN);
    log_cycle("nothing written", &c);
    assert_setup("nothing written", &c);
    cr_assert_leq(c.refault, c.overlap + 64, "%llu refaults with nothing written (%llu blocks)",
                  (unsigned long long)c.refault, (unsigned long long)c.overlap);
    cr_assert_leq(c.refault * 4, r.refault, "control %llu vs written %llu",
                  (unsigned long long)c.refault, (unsigned long long)r.refault);
    cr_assert_eq(c.dist_total, c.refault);
}

Test(refault, monitor_off_reports_off, .timeout = 120) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=off", NULL};
    run_scenario("mechanism", vars, &cr);
    cr_assert(WIFEXITED(cr.status) && WEXITSTATUS(cr.status) == 0, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "mechanism"), LULL_COUNTERS_REFAULT_OFF);
    /* and the default in a new process is the present scan */
    run_scenario("mechanism", NULL, &cr);
    cr_assert_eq(reexec_field(&cr, "mechanism"), LULL_COUNTERS_REFAULT_PAGEMAP_SCAN);
}

Test(refault, without_pagemap_scan_counts_purged_slices_reused, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_FAULT=pagemap_scan", NULL};
    run_scenario("cycle_none", vars, &cr);
    cycle_result r = cycle_of(&cr);
    assert_setup("accounting, nothing written", &r);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_ACCOUNTING, "mechanism %s",
                 lull_counters_refault_name(r.mechanism));
    /* slice level: every purged slice taken again is 16 pages, written or
     * not (the allocator cannot tell) */
    cr_assert_geq(r.refault, r.overlap * PAGES_PER_BLOCK, "%llu refault pages for %llu slices",
                  (unsigned long long)r.refault, (unsigned long long)r.overlap);
    cr_assert_leq(r.refault, (r.overlap + 64) * PAGES_PER_BLOCK);
    assert_distances("accounting", &r);
}

Test(refault, uffd_wp_when_switched_on_counts_written_pages, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", NULL};
    run_scenario("cycle_half", vars, &cr);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_UFFD_WP, "mechanism %s",
                 lull_counters_refault_name(r.mechanism));
    assert_page_level("uffd_wp, every other page written", &r);
}

/* Segments are registered with userfaultfd on the reclaim tick after they
 * are mapped; memory freed before that tick is purged by it first. Those
 * purged ranges must be armed too, or every page of them reads as written
 * when it is reused. */
Test(refault, uffd_wp_arms_memory_purged_before_its_segment_was_registered, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", NULL};
    run_scenario("cycle_half_fresh_segments", vars, &cr);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_UFFD_WP, "mechanism %s",
                 lull_counters_refault_name(r.mechanism));
    assert_page_level("uffd_wp, segments purged before registration", &r);
}

/* purge_mode=free: MADV_FREE first (pages stay resident), then
 * MADV_DONTNEED for the slices still free LAZY_MAX_MS later, which drops the
 * write-protect markers again: that second purge must re-arm too. */
Test(refault, uffd_wp_arms_memory_purged_again_after_madv_free, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", NULL};
    run_scenario("cycle_half_lazy", vars, &cr);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_UFFD_WP, "mechanism %s",
                 lull_counters_refault_name(r.mechanism));
    assert_page_level("uffd_wp, MADV_FREE then MADV_DONTNEED", &r);
}

Test(refault, uffd_wp_arms_memory_the_warm_reserve_drained, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", NULL};
    run_scenario("warm_drain", vars, &cr);
    cr_assert(WIFEXITED(cr.status) && WEXITSTATUS(cr.status) == 0, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "ok"), 1, "%s", cr.out);
    cr_assert_gt(reexec_field(&cr, "warm_seen"), 0, "the warm reserve never filled");
    cr_assert_eq(reexec_field(&cr, "warm_left"), 0, "the warm reserve never drained");
    cr_assert_gt(reexec_field(&cr, "armed_slices"), 0);
    cr_assert_eq(reexec_field(&cr, "unarmed_pages"), 0,
                 "%llu pages of purged free slices are not write-protected",
                 (unsigned long long)reexec_field(&cr, "unarmed_pages"));
}

/* The same with the default present scan. */
Test(refault, pagemap_scan_after_madv_free_then_dontneed, .timeout = 180) {
    child_run cr;
    run_scenario("cycle_half_lazy", NULL, &cr);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_PAGEMAP_SCAN);
    assert_page_level("pagemap_scan, MADV_FREE then MADV_DONTNEED", &r);
}

Test(refault, uffd_denied_falls_back_to_pagemap_scan, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", "LULL_FAULT=uffd", NULL};
    run_scenario("cycle_half", vars, &cr);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_PAGEMAP_SCAN, "mechanism %s",
                 lull_counters_refault_name(r.mechanism));
    assert_page_level("uffd denied, every other page written", &r);
}

Test(refault, a_writer_never_waits_for_the_monitor, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=refault_monitor=on", NULL};
    run_scenario("noblock", vars, &cr);
    cr_assert(!(WIFEXITED(cr.status) && WEXITSTATUS(cr.status) == 3),
              "the writer did not finish within %d s while the reclaim thread was held:\n%s",
              WATCHDOG_MS / 1000, cr.out);
    cr_assert_eq(reexec_field(&cr, "held_ok"), 1, "the reclaim thread was never held:\n%s", cr.out);
    cycle_result r = cycle_of(&cr);
    cr_assert_eq(r.mechanism, LULL_COUNTERS_REFAULT_UFFD_WP);
    cr_assert_eq(reexec_field(&cr, "writer_ok"), 1);
    cr_assert_eq(reexec_field(&cr, "ticks_during"), 0, "the reclaim thread ticked while held");
    cr_assert_eq(reexec_field(&cr, "still_held"), 1);
    /* the writes hit armed (write-protected) pages: once released, the
     * scan reports exactly those, not every page of the reused slices */
    assert_page_level("uffd_wp, written while the reclaim thread was held", &r);
}
