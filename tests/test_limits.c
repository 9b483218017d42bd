/* The heap limit (heap_limit_mb, base/resident.h) and lull_purge_all()
 * (reclaim/purge_now.h).
 *
 * Checked here: the resident estimate the limit is on equals the
 * statistics' resident bound (mapped - purged) whenever no reclaim step is
 * under way, through small, large, huge, grown, cached and parked memory;
 * an allocation past the limit fails with ENOMEM, is counted, never takes
 * the estimate past the limit, and lull keeps working (a free makes room
 * again); what the reclaim thread purges makes room for an allocation that
 * was over the limit (freed slices for a huge block, a cached huge mapping
 * for spans), with the purge delay "never"; a limit of 1 MiB serves small
 * blocks and refuses a 1 MiB one; bad values are reported once and leave
 * the default (or the value in force); lull_purge_all purges dirty, lazy
 * and warm slices, parked pages and cached huge mappings whatever the delay,
 * and the statistics right after the call show it; from several threads at
 * once; without a reclaim thread (on the caller); and a request thread
 * that calls it, or runs into the limit, makes no purge system call.
 *
 * Every wait is on an event: lull_reclaim_now() and lull_purge_all() return
 * when their tick is done; a refused allocation waits for the reclaim
 * thread's purge (its 100 ms bound is never what a test counts on). The
 * scenarios that need a configuration from the start run in a new process
 * of this program (tests/support/reexec.h). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/config.h"
#include "base/resident.h"
#include "base/types.h"
#include "numa/arena.h"
#include "numa/page_park.h"
#include "reclaim/huge_cache.h"
#include "reclaim/policy.h"
#include "reclaim/reclaim.h"
#include "reclaim/refault.h"
#include "src/span.h"
#include "tests/support/mem_check.h"
#include "tests/support/reexec.h"
#include "tests/support/syscall_watch.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define PAGE LULL_PAGE_SIZE
#define HUGE_SIZE (40 * MiB)
#define MAX_BLOCKS 4096

/* ---- helpers ------------------------------------------------------------- */

/* Each test runs in its own process, with the reclaim thread running and
 * purging nothing until the test says so. */
static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("huge_cache_idle_ms", "600000"));
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static lull_reclaim_stats reclaim_stats(void) {
    lull_reclaim_stats s;
    lull_reclaim_get_stats(&s);
    return s;
}

static uint64_t cache_bytes(const struct lull_counters *c) {
    uint64_t b = 0;
    for (uint64_t n = 0; n < c->node_count; n++)
        b += c->nodes[n].huge_cache_bytes;
    return b;
}

/* A snapshot whose identity holds, and whose resident bound is the
 * estimate the limit is on (no reclaim step runs: the delay is "never"
 * and the huge mappings are younger than their idle time). */
static struct lull_counters snap(const char *phase) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    cr_assert_eq(lull_counters_accounting_sum(&c.total), c.total.mapped, "%s: identity", phase);
    uint64_t bound = lull_counters_resident_bound(&c.total), est = lull_resident_bytes();
    cr_assert_eq(
        est, bound,
        "%s: resident estimate %llu KiB, statistics' resident bound %llu KiB (live "
        "%llu, span_free %llu, dirty %llu, purging %llu, warm %llu, metadata %llu KiB)",
        phase, (unsigned long long)est >> 10, (unsigned long long)bound >> 10,
        (unsigned long long)c.total.live >> 10, (unsigned long long)c.total.span_free >> 10,
        (unsigned long long)c.total.dirty >> 10, (unsigned long long)c.total.purging >> 10,
        (unsigned long long)c.total.warm >> 10, (unsigned long long)c.total.metadata >> 10);
    return c;
}

/* A limit `extra_mb` above what lull keeps resident now; returns it. */
static uint64_t limit_above_now(unsigned extra_mb) {
    unsigned mb = (unsigned)(lull_resident_bytes() >> 20) + 1 + extra_mb;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    cr_assert_eq(lull_resident_limit(), (uint64_t)mb << 20);
    return (uint64_t)mb << 20;
}

/* 1 MiB blocks (large spans: 16 clean slices each) until malloc refuses
 * one (or `max`); the number taken. The one refused says ENOMEM. */
static size_t fill_large(void **blocks, size_t max) {
    size_t n = 0;
    for (; n < max; n++) {
        errno = 0;
        blocks[n] = lull_malloc(MiB);
        if (!blocks[n]) {
            cr_assert_eq(errno, ENOMEM, "malloc(1 MiB) failed with errno %d", errno);
            break;
        }
        memset(blocks[n], (int)n, 4096);
    }
    return n;
}

/* ---- the estimate -------------------------------------------------------- */

/* Four 4 KiB blocks a page: a span that filled and lost 3 in 4 parks the
 * freed blocks' pages (src/span_park.c). */
#define NBIG 1024
static void *big[NBIG];
static bool big_live[NBIG];

static void park_pages(void) {
    for (size_t i = 0; i < NBIG; i++) {
        big[i] = lull_malloc(4096);
        cr_assert_not_null(big[i]);
        memset(big[i], 0x5a, 4096);
        big_live[i] = true;
    }
    for (size_t i = 0; i < NBIG; i++)
        if (i % 4) {
            lull_free(big[i]);
            big_live[i] = false;
        }
}

/* Pages of freed 4 KiB blocks in each state (numa/page_park.h). */
static void freed_page_states(size_t count[4]) {
    memset(count, 0, 4 * sizeof count[0]);
    for (size_t i = 0; i < NBIG; i++) {
        if (big_live[i]) continue;
        const lull_segment *seg = lull_segment_of(big[i]);
        unsigned slice = (unsigned)(((uintptr_t)big[i] & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT);
        unsigned page = (unsigned)(((uintptr_t)big[i] & (LULL_SLICE_SIZE - 1)) / PAGE);
        count[lull_pages_word(seg, slice) >> (2 * page) & 3]++;
    }
}

Test(limits, the_estimate_is_the_statistics_resident_bound, .init = setup) {
    snap("start");
    void *small[256], *large[8];
    for (int i = 0; i < 256; i++)
        small[i] = lull_malloc(16 + (size_t)i * 24);
    for (int i = 0; i < 8; i++)
        large[i] = lull_malloc(600 * KiB + (size_t)i * 100 * KiB);
    snap("small and large");
    char *h = lull_malloc(HUGE_SIZE);
    cr_assert_not_null(h);
    h = lull_realloc(h, HUGE_SIZE + 8 * MiB); /* grown in place, or moved */
    cr_assert_not_null(h);
    void *aligned = lull_aligned_alloc(4 * MiB, 20 * MiB); /* its header 4 MiB below */
    cr_assert_not_null(aligned);
    snap("huge");
    park_pages();
    snap("parked");
    for (int i = 0; i < 8; i += 2)
        lull_free(large[i]);
    for (int i = 0; i < 256; i += 3)
        lull_free(small[i]);
    lull_free(h); /* into the cache, dirty */
    lull_free(aligned);
    cr_assert(lull_reclaim_now());
    snap("freed");
    lull_purge_all(); /* pages and slices purged, the cache unmapped */
    snap("purged");
    for (size_t i = 0; i < NBIG; i++)
        if (big_live[i]) lull_free(big[i]);
    for (int i = 0; i < 256; i++)
        if (i % 3) lull_free(small[i]);
    for (int i = 1; i < 8; i += 2)
        lull_free(large[i]);
    lull_thread_collect(); /* parked pages taken back whole, spans released */
    snap("all freed");
    /* cached mappings purged (CLEAN, then LAZY) count their header only,
     * and their block again once a malloc takes them back */
    lull_set_purge_delay_ms(0);
    /* taken back and freed again, a mapping would be held from its purge
     * (lull_huge_hold_ms) within huge_cache_mb / 16: a bound whose
     * sixteenth is smaller than the mapping holds none */
    cr_assert(lull_configure("huge_cache_mb", "512"));
    for (int lazy = 0; lazy < 2; lazy++) {
        cr_assert(lull_configure("purge_mode", lazy ? "free" : "dontneed"));
        h = lull_malloc(HUGE_SIZE);
        memset(h, 4, HUGE_SIZE);
        lull_free(h);
        cr_assert(lull_reclaim_now());
        cr_assert(lull_reclaim_now());
        lull_set_purge_delay_ms(-1);
        cr_assert(lull_reclaim_now()); /* no step runs from here on */
        struct lull_counters c = snap(lazy ? "cached, MADV_FREE'd" : "cached, purged");
        cr_assert_geq(c.total.purged, HUGE_SIZE, "the cached mapping was not purged");
        char *again = lull_malloc(HUGE_SIZE);
        cr_assert_eq(again, h, "the purged mapping was not taken back");
        snap("taken back");
        lull_free(again);
        lull_set_purge_delay_ms(0);
    }
    cr_assert(lull_configure("huge_cache_mb", "1024"));
}

/* ---- the limit ------------------------------------------------------------ */

static void *blocks[MAX_BLOCKS];

Test(limits, an_allocation_past_the_limit_fails_with_enomem_and_lull_keeps_working, .init = setup) {
    uint64_t limit = limit_above_now(16);
    uint64_t refused0 = lull_resident_refusals();
    lull_reclaim_stats r0 = reclaim_stats();

    errno = 0;
    void *p = lull_malloc(64 * MiB);
    cr_assert_null(p, "a 64 MiB block under a limit 16 MiB above use");
    cr_assert_eq(errno, ENOMEM);
    cr_assert_eq(lull_resident_refusals(), refused0 + 1);
    /* it asked the reclaim thread for a purge first, and waited for it */
    cr_assert_geq(reclaim_stats().limit_waits, r0.limit_waits + 1);
    cr_assert_geq(reclaim_stats().forced_ticks, r0.forced_ticks + 1);

    size_t n = fill_large(blocks, MAX_BLOCKS);
    cr_assert_geq(n, 8, "only %zu blocks of 1 MiB under a limit 16 MiB above use", n);
    cr_assert_leq(n, 17);
    cr_assert_leq(lull_resident_bytes(), limit, "the estimate passed the limit");
    cr_assert_eq(lull_resident_refusals(), refused0 + 2);
    /* every other way to ask fails the same way, and takes nothing */
    errno = 0;
    cr_assert_null(lull_calloc(1, 2 * MiB));
    cr_assert_eq(errno, ENOMEM);
    void *q = NULL;
    cr_assert_eq(lull_posix_memalign(&q, 4096, 2 * MiB), ENOMEM);
    errno = 0;
    cr_assert_null(lull_realloc(blocks[0], 32 * MiB), "realloc past the limit");
    cr_assert_eq(errno, ENOMEM);
    cr_assert_eq(((unsigned char *)blocks[0])[100], 0, "realloc's failure changed the block");
    cr_assert_leq(lull_resident_bytes(), limit);

    /* a free makes room: the next block takes its slices (dirty, no purge) */
    lull_free(blocks[n - 1]);
    blocks[n - 1] = lull_malloc(MiB);
    cr_assert_not_null(blocks[n - 1], "malloc after a free of the same size");
    for (size_t i = 0; i < n; i++)
        lull_free(blocks[i]);
    for (int i = 0; i < 1000; i++) {
        void *s = lull_malloc(100);
        cr_assert_not_null(s);
        lull_free(s);
    }
    snap("after");
    /* no limit: everything goes again */
    cr_assert(lull_configure("heap_limit_mb", "0"));
    p = lull_malloc(64 * MiB);
    cr_assert_not_null(p);
    lull_free(p);
}

Test(limits, what_the_reclaim_thread_purges_makes_room, .init = setup) {
    limit_above_now(48);
    size_t n = fill_large(blocks, MAX_BLOCKS);
    cr_assert_geq(n, 40, "only %zu blocks of 1 MiB under a limit 48 MiB above use", n);
    for (size_t i = 0; i < n; i++)
        lull_free(blocks[i]);
    /* the delay is "never": nothing goes back unless the limit asks */
    struct lull_counters c = snap("freed");
    cr_assert_geq(c.total.dirty, (uint64_t)(n - 1) * MiB);
    uint64_t refused0 = lull_resident_refusals();
    lull_reclaim_stats r0 = reclaim_stats();

    /* a huge block needs fresh memory: the freed slices are purged for it */
    char *h = lull_malloc(HUGE_SIZE);
    cr_assert_not_null(h, "no room made for a 40 MiB block (%zu MiB freed)", n);
    memset(h, 1, HUGE_SIZE);
    lull_reclaim_stats r1 = reclaim_stats();
    cr_assert_eq(lull_resident_refusals(), refused0);
    cr_assert_geq(r1.forced_ticks, r0.forced_ticks + 1);
    cr_assert_geq(r1.purged_bytes - r0.purged_bytes, (uint64_t)(n - 1) * MiB,
                  "%llu KiB purged for it",
                  (unsigned long long)(r1.purged_bytes - r0.purged_bytes) >> 10);

    /* and the other way: spans need fresh memory, a cached mapping goes */
    lull_free(h);
    cr_assert(lull_reclaim_now());
    c = snap("cached");
    cr_assert_geq(cache_bytes(&c), HUGE_SIZE, "the freed huge block is not cached");
    size_t m = 0;
    for (; m < 40; m++) {
        blocks[m] = lull_malloc(MiB);
        cr_assert_not_null(blocks[m], "block %zu of 1 MiB refused with a 40 MiB mapping cached", m);
    }
    c = snap("spans");
    cr_assert_eq(cache_bytes(&c), 0, "the cached mapping stayed");
    cr_assert_eq(lull_resident_refusals(), refused0);
    for (size_t i = 0; i < m; i++)
        lull_free(blocks[i]);
}

/* ---- start-up configurations, in a new process ---------------------------- */

/* LULL_TEST_LIMITS=tiny (with heap_limit_mb=1): small blocks until the
 * limit, then a 1 MiB one. */
static void scenario_tiny(void) {
    static void *p[65536];
    cr_assert(lull_reclaim_now()); /* the thread first: its creation allocates */
    size_t n = 0;
    while (n < 65536 && (p[n] = lull_malloc(64)) != NULL)
        n++;
    int small_errno = errno;
    uint64_t at_small = lull_resident_bytes();
    errno = 0;
    void *one = lull_malloc(MiB);
    int big_errno = errno;
    for (size_t i = 0; i < n; i++)
        lull_free(p[i]);
    void *again = lull_malloc(64);
    dprintf(1,
            "limit=%llu\nsmall=%zu\nsmall_errno=%d\nat_small=%llu\nbig=%d\nbig_errno=%d\n"
            "again=%d\nrefusals=%llu\n",
            (unsigned long long)lull_resident_limit(), n, small_errno, (unsigned long long)at_small,
            one != NULL, big_errno, again != NULL, (unsigned long long)lull_resident_refusals());
}

/* LULL_TEST_LIMITS=probe: the limit in force. */
static void scenario_probe(void) {
    void *p = lull_malloc(16);
    lull_free(p);
    dprintf(1, "limit=%llu\n", (unsigned long long)lull_resident_limit());
}

/* LULL_TEST_LIMITS=nothread (with LULL_FAULT=thread_create): lull_purge_all
 * on the caller, and a refusal without waiting. */
static void scenario_nothread(void) {
    lull_set_purge_delay_ms(-1);
    static void *p[32];
    for (int i = 0; i < 32; i++) {
        p[i] = lull_malloc(MiB);
        memset(p[i], 1, MiB);
    }
    char *h = lull_malloc(HUGE_SIZE);
    memset(h, 1, HUGE_SIZE);
    for (int i = 0; i < 32; i++)
        lull_free(p[i]);
    lull_free(h); /* no cache without the thread: queued */
    struct lull_counters c0, c1;
    lull_stats(&c0);
    lull_purge_all();
    lull_stats(&c1);
    bool estimate_ok = lull_resident_bytes() == lull_counters_resident_bound(&c1.total);
    lull_reclaim_stats r = reclaim_stats();
    /* the limit: no thread to wait for, refused at once */
    unsigned mb = (unsigned)(lull_resident_bytes() >> 20) + 2;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    lull_configure("heap_limit_mb", v);
    errno = 0;
    void *big = lull_malloc(32 * MiB);
    int big_errno = errno;
    lull_reclaim_stats r2 = reclaim_stats();
    dprintf(1,
            "running=%d\ndirty_before=%llu\ndirty_after=%llu\npurged_grew=%llu\n"
            "estimate_ok=%d\ninline=%llu\nbig=%d\nbig_errno=%d\nwaits=%llu\nrefusals=%llu\n",
            (int)r.running, (unsigned long long)c0.total.dirty, (unsigned long long)c1.total.dirty,
            (unsigned long long)(c1.total.purged - c0.total.purged), estimate_ok,
            (unsigned long long)r.inline_purges, big != NULL, big_errno,
            (unsigned long long)r2.limit_waits, (unsigned long long)lull_resident_refusals());
}

__attribute__((constructor(200))) static void limits_probe(void) {
    const char *s = getenv("LULL_TEST_LIMITS");
    if (!s) return;
    if (!strcmp(s, "tiny"))
        scenario_tiny();
    else if (!strcmp(s, "probe"))
        scenario_probe();
    else if (!strcmp(s, "nothread"))
        scenario_nothread();
    _exit(0);
}

static void run(const char *label, const char *const *vars, child_run *cr) {
    reexec_run("test_limits_probe", vars, label, 120000, cr);
    reexec_assert_exited_0(cr, label);
}

static int lines_starting(const char *s, const char *prefix) {
    int n = 0;
    for (const char *l = s; l && *l;) {
        if (!strncmp(l, prefix, strlen(prefix))) n++;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return n;
}

Test(limits, a_limit_of_1_mib_serves_small_blocks_and_refuses_a_1_mib_one, .timeout = 120) {
    child_run cr;
    const char *vars[] = {"LULL_TEST_LIMITS=tiny", "LULL_CONF=heap_limit_mb=1", NULL};
    run("tiny", vars, &cr);
    cr_assert_eq(reexec_field(&cr, "limit"), MiB);
    /* the first segment's header (128 KiB), the heaps and a span per class
     * in use come first: the rest holds 64-byte blocks */
    size_t small = reexec_field(&cr, "small");
    cr_assert_geq(small * 64, 512 * KiB, "only %zu blocks of 64 B under 1 MiB", small);
    cr_assert_lt(small, 65536, "small blocks were never refused");
    cr_assert_eq(reexec_field(&cr, "small_errno"), ENOMEM);
    cr_assert_leq(reexec_field(&cr, "at_small"), MiB);
    cr_assert_eq(reexec_field(&cr, "big"), 0, "a 1 MiB block under a 1 MiB limit");
    cr_assert_eq(reexec_field(&cr, "big_errno"), ENOMEM);
    cr_assert_eq(reexec_field(&cr, "again"), 1, "no small block after freeing them all");
    cr_assert_eq(reexec_field(&cr, "refusals"), 2);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 0, "stderr: %s", cr.err);
}

Test(limits, a_bad_value_is_reported_once_and_the_default_stays, .timeout = 120) {
    static const char *const bad[] = {"LULL_CONF=heap_limit_mb=abc", "LULL_CONF=heap_limit_mb=-5",
                                      "LULL_HEAP_LIMIT_MB=67108865", "LULL_HEAP_LIMIT_MB= 8",
                                      "LULL_CONF=heap_limit_mb=0x10"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        child_run cr;
        const char *vars[] = {"LULL_TEST_LIMITS=probe", bad[i], NULL};
        run(bad[i], vars, &cr);
        cr_assert_eq(reexec_field(&cr, "limit"), 0, "%s: a limit was set", bad[i]);
        cr_assert_eq(lines_starting(cr.err, "lull:"), 1, "%s: stderr: %s", bad[i], cr.err);
        cr_assert(strstr(cr.err, "heap_limit_mb") && strstr(cr.err, "using the default"),
                  "%s: stderr: %s", bad[i], cr.err);
    }
    child_run cr;
    const char *good[] = {"LULL_TEST_LIMITS=probe", "LULL_CONF=heap_limit_mb=300", NULL};
    run("good", good, &cr);
    cr_assert_eq(reexec_field(&cr, "limit"), (uint64_t)300 << 20);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 0, "stderr: %s", cr.err);
}

/* lull_configure(key, value) with its stderr in err. */
static bool configure(const char *key, const char *value, char *err, size_t len) {
    fflush(stderr);
    int m = memfd_create("stderr", MFD_CLOEXEC), saved = dup(STDERR_FILENO);
    cr_assert(m >= 0 && saved >= 0);
    cr_assert_geq(dup2(m, STDERR_FILENO), 0);
    bool ok = lull_configure(key, value);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(m, err, len - 1, 0);
    err[n > 0 ? n : 0] = '\0';
    close(m);
    return ok;
}

Test(limits, a_bad_value_at_run_time_keeps_the_limit_in_force) {
    char err[512];
    cr_assert(configure("heap_limit_mb", "512", err, sizeof err));
    cr_assert_str_empty(err);
    static const char *const bad[] = {"abc", "-5", "", "1e3", "67108865"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_not(configure("heap_limit_mb", bad[i], err, sizeof err), "'%s' taken", bad[i]);
        cr_assert_eq(lines_starting(err, "lull:"), 1, "'%s': stderr: %s", bad[i], err);
        cr_assert(strstr(err, "heap_limit_mb"), "stderr: %s", err);
        cr_assert_eq(lull_resident_limit(), (uint64_t)512 << 20, "'%s' changed the limit", bad[i]);
    }
    char conf[512];
    lull_config_format(conf, sizeof conf);
    cr_assert(strstr(conf, "heap_limit_mb=512"), "config: %s", conf);
}

/* ---- lull_purge_all -------------------------------------------------------- */

static size_t lazy_slices(void) {
    size_t n = 0;
    for (int i = 0; i < lull_arena_count; i++)
        for (lull_segment *s = atomic_load(&lull_arenas[i].segments); s; s = s->next)
            for (unsigned w = 0; w < LULL_SLICE_WORDS; w++)
                n += (size_t)__builtin_popcountll(atomic_load(&lull_slice_maps_of(s)->lazy[w]) &
                                                  atomic_load(&lull_slice_maps_of(s)->clean[w]));
    return n;
}

Test(limits, purge_all_purges_everything_free_whatever_the_delay, .init = setup) {
    /* what stays live until the lazy and warm slices exist (each malloc
     * would take them first) */
    for (int i = 0; i < 48; i++) {
        blocks[i] = lull_malloc(MiB);
        memset(blocks[i], 3, MiB);
    }
    char *h = lull_malloc(HUGE_SIZE);
    memset(h, 3, HUGE_SIZE);
    /* MADV_FREE'd slices: 16 MiB purged lazily, with a delay of 0 */
    for (int i = 32; i < 48; i++)
        lull_free(blocks[i]);
    cr_assert(lull_configure("purge_mode", "free"));
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    /* a day's delay: what is freed now stays dirty, MADV_FREE'd slices stay
     * lazy, and the warm reserve answers the refaults the policy is told of */
    cr_assert(lull_configure("purge_mode", "dontneed"));
    lull_set_purge_delay_ms(86400000);
    for (int i = 0; i < 32; i++)
        lull_free(blocks[i]);
    lull_free(h); /* cached, dirty */
    park_pages();
    /* 64 slices of demand, as the monitor or the accounting counts it */
    atomic_fetch_add(&lull_the_policy.refaulted_slices, 64);
    atomic_fetch_add(&lull_refault_pages_seen, 64 * 16);
    cr_assert(lull_reclaim_now());
    /* and "never" */
    lull_set_purge_delay_ms(-1);
    cr_assert(lull_reclaim_now());
    struct lull_counters c0 = snap("before");
    size_t st[4];
    freed_page_states(st);
    size_t lazy0 = lazy_slices();
    cr_assert_geq(lazy0, 16 * 15, "only %zu slices MADV_FREE'd", lazy0);
    cr_assert_gt(c0.total.warm, 0, "no warm reserve");
    cr_assert_geq(c0.total.dirty, 32 * MiB);
    cr_assert_geq(cache_bytes(&c0), HUGE_SIZE);
    cr_assert_geq(st[LULL_PAGE_PENDING], NBIG / 2, "only %zu pages parked", st[LULL_PAGE_PENDING]);
    lull_reclaim_stats r0 = reclaim_stats();

    lull_purge_all();

    /* done when it returns: nothing free is left resident */
    struct lull_counters c1 = snap("after");
    lull_reclaim_stats r1 = reclaim_stats();
    freed_page_states(st);
    cr_log_info("dirty %llu -> %llu KiB, warm %llu -> %llu KiB, cache %llu -> %llu KiB, purged "
                "%llu -> %llu KiB, lazy slices %zu -> %zu",
                (unsigned long long)c0.total.dirty >> 10, (unsigned long long)c1.total.dirty >> 10,
                (unsigned long long)c0.total.warm >> 10, (unsigned long long)c1.total.warm >> 10,
                (unsigned long long)cache_bytes(&c0) >> 10,
                (unsigned long long)cache_bytes(&c1) >> 10,
                (unsigned long long)c0.total.purged >> 10,
                (unsigned long long)c1.total.purged >> 10, lazy0, lazy_slices());
    cr_assert_eq(c1.total.dirty, 0, "%llu KiB still dirty",
                 (unsigned long long)c1.total.dirty >> 10);
    cr_assert_eq(c1.total.purging, 0);
    cr_assert_eq(c1.total.warm, 0, "%llu KiB still warm", (unsigned long long)c1.total.warm >> 10);
    cr_assert_eq(cache_bytes(&c1), 0, "the huge cache still holds %llu KiB",
                 (unsigned long long)cache_bytes(&c1) >> 10);
    cr_assert_eq(lazy_slices(), 0, "%zu slices still MADV_FREE'd", lazy_slices());
    cr_assert_eq(st[LULL_PAGE_PENDING] + st[LULL_PAGE_PURGING], 0, "%zu pages still parked",
                 st[LULL_PAGE_PENDING]);
    cr_assert_geq(st[LULL_PAGE_PURGED], NBIG / 2);
    cr_assert_geq(c1.total.purged + HUGE_SIZE, c0.total.purged + 32 * MiB + c0.total.warm,
                  "the purged term grew by %lld KiB",
                  (long long)(c1.total.purged - c0.total.purged) / 1024);
    cr_assert_geq(r1.page_purged_bytes - r0.page_purged_bytes, (uint64_t)NBIG / 2 * PAGE);
    cr_assert_geq(r1.huge_freed, r0.huge_freed + 1);
    cr_assert_eq(r1.forced_ticks, r0.forced_ticks + 1);
    /* the survivors kept their contents */
    for (size_t i = 0; i < NBIG; i++)
        if (big_live[i]) cr_assert_eq(((unsigned char *)big[i])[4095], 0x5a);
    /* and a later tick does not fill the reserve again */
    cr_assert(lull_reclaim_now());
    cr_assert_eq(snap("next tick").total.warm, 0);
}

/* Its calling thread's kept empty spans go too: a malloc/free loop's span
 * is kept by its heap, out of every arena's reach, until then. */
Test(limits, purge_all_gives_back_the_callers_kept_spans_first, .init = setup) {
    for (int i = 0; i < 100; i++) {
        void *p = lull_malloc(200 * KiB);
        memset(p, 1, 200 * KiB);
        lull_free(p);
    }
    struct lull_counters c0 = snap("kept");
    lull_purge_all();
    struct lull_counters c1 = snap("purged");
    cr_assert_eq(c1.total.dirty, 0);
    cr_assert_leq(c1.total.span_free + 200 * KiB, c0.total.span_free,
                  "span_free %llu -> %llu KiB: the kept span stayed",
                  (unsigned long long)c0.total.span_free >> 10,
                  (unsigned long long)c1.total.span_free >> 10);
}

#define THREADS 4
#define ROUNDS 20
static pthread_barrier_t done_barrier, check_barrier;

static void *purging_thread(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    void *mine[8];
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < 8; i++) {
            mine[i] = lull_malloc(i % 2 ? MiB : 48 * KiB + id * 1000);
            memset(mine[i], (int)id, 4096);
        }
        for (int i = 0; i < 8; i++)
            lull_free(mine[i]);
        lull_purge_all();
    }
    pthread_barrier_wait(&done_barrier);
    pthread_barrier_wait(&check_barrier); /* held while the main thread looks */
    return NULL;
}

Test(limits, purge_all_from_several_threads_at_once, .init = setup, .timeout = 120) {
    lull_reclaim_stats r0 = reclaim_stats();
    pthread_barrier_init(&done_barrier, NULL, THREADS + 1);
    pthread_barrier_init(&check_barrier, NULL, THREADS + 1);
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, purging_thread, (void *)i), 0);
    pthread_barrier_wait(&done_barrier);
    /* each thread's frees came before its last lull_purge_all: gone */
    struct lull_counters c = snap("all returned");
    lull_reclaim_stats r1 = reclaim_stats();
    pthread_barrier_wait(&check_barrier);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(c.total.dirty, 0, "%llu KiB dirty", (unsigned long long)c.total.dirty >> 10);
    /* calls at the same time share a forced tick: at most one each */
    cr_assert_geq(r1.forced_ticks, r0.forced_ticks + 1);
    cr_assert_leq(r1.forced_ticks, r0.forced_ticks + THREADS * ROUNDS);
}

Test(limits, purge_all_without_a_reclaim_thread_purges_on_the_caller, .timeout = 120) {
    child_run cr;
    const char *vars[] = {"LULL_TEST_LIMITS=nothread", "LULL_FAULT=thread_create", NULL};
    run("nothread", vars, &cr);
    cr_assert_eq(reexec_field(&cr, "running"), 0, "the reclaim thread started: %s", cr.out);
    cr_assert_geq(reexec_field(&cr, "dirty_before"), 32 * MiB + HUGE_SIZE, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "dirty_after"), 0, "%s", cr.out);
    cr_assert_geq(reexec_field(&cr, "purged_grew"), 31 * MiB, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "estimate_ok"), 1, "%s", cr.out);
    cr_assert_geq(reexec_field(&cr, "inline"), 1);
    cr_assert_eq(reexec_field(&cr, "big"), 0);
    cr_assert_eq(reexec_field(&cr, "big_errno"), ENOMEM);
    cr_assert_eq(reexec_field(&cr, "waits"), 0, "a refusal waited for a thread that is not there");
    cr_assert_eq(reexec_field(&cr, "refusals"), 1);
}

/* ---- no purge on request threads ------------------------------------------ */

typedef struct {
    bool installed, refused, purged_ok;
} watched_result;

static void *watched_thread(void *arg) {
    watched_result *r = arg;
    r->installed = syscall_watch_install_on_this_thread() == 0;
    for (int i = 0; i < 16; i++) {
        blocks[i] = lull_malloc(MiB);
        memset(blocks[i], 1, MiB);
    }
    char *h = lull_malloc(HUGE_SIZE);
    memset(h, 1, HUGE_SIZE);
    for (int i = 0; i < 16; i++)
        lull_free(blocks[i]);
    lull_free(h);
    lull_purge_all();
    struct lull_counters c;
    lull_stats(&c);
    r->purged_ok = c.total.dirty == 0;
    /* over the limit: it waits for the reclaim thread, never purges itself */
    limit_above_now(4);
    r->refused = lull_malloc(64 * MiB) == NULL;
    syscall_watch_thread_done();
    return NULL;
}

Test(limits, a_request_thread_never_purges_itself, .init = setup) {
    cr_assert_eq(syscall_watch_start(), 0, "seccomp user notification unavailable");
    watched_result r = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, watched_thread, &r), 0);
    pthread_join(t, NULL);
    cr_assert(r.installed);
    cr_assert(r.purged_ok, "lull_purge_all left dirty memory");
    cr_assert(r.refused);
    size_t n = syscall_watch_count();
    if (n) syscall_watch_dump(0);
    cr_assert_eq(n, 0, "%zu purge or unmap calls on the request thread", n);
}
