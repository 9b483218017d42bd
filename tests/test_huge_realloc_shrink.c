/* realloc() shrinking a huge block to under half its usable size keeps the
 * block where it is and hands the tail to the reclaim thread, which purges
 * and unmaps it at its next tick; the request thread makes no madvise or
 * munmap. Before, the shrink allocated a new block and copied into it:
 * 120-320 ms for a 23 MiB block, a stall of the request thread.
 *
 * Event-bounded: lull_reclaim_now() returns after a tick that started after
 * the call, and the tick gives every queued tail back first. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/resident.h"
#include "base/types.h"
#include "tests/support/syscall_watch.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define BIG (40 * MiB)
#define SMALL (10 * MiB + 100)

/* pages in the process's address space and resident, from statm */
static void statm(size_t *space, size_t *rss) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long s = 0, r = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &s, &r) != 2) s = r = 0;
        fclose(f);
    }
    *space = s * (size_t)sysconf(_SC_PAGESIZE);
    *rss = r * (size_t)sysconf(_SC_PAGESIZE);
}

static uint64_t huge_mapped(void) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    return c.total.mapped;
}

static void setup(void) {
    /* what the first huge malloc sets up, before any baseline */
    lull_free(lull_malloc(BIG));
    lull_purge_all();
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static void fill(char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096)
        p[i] = (char)(i / 4096 + 1);
}

static void check(const char *p, size_t n) {
    for (size_t i = 0; i < n; i += 4096)
        cr_assert_eq(p[i], (char)(i / 4096 + 1), "byte %zu lost", i);
}

typedef struct {
    char *p, *q;
    size_t space0, rss0; /* before the realloc, this thread's stack made */
    size_t watched_calls;
    int watched;
} shrink_run;

/* the realloc on a thread of its own, watched for madvise and munmap */
static void *shrink_watched(void *arg) {
    shrink_run *r = arg;
    r->watched = syscall_watch_install_on_this_thread() == 0;
    statm(&r->space0, &r->rss0);
    r->q = lull_realloc(r->p, SMALL);
    r->watched_calls = syscall_watch_count_tid((pid_t)syscall(SYS_gettid));
    syscall_watch_thread_done();
    return NULL;
}

Test(huge_realloc_shrink, keeps_the_block_and_gives_the_tail_back, .init = setup) {
    cr_assert_eq(syscall_watch_start(), 0, "no syscall watch");
    shrink_run r = {.p = lull_malloc(BIG)};
    cr_assert_not_null(r.p);
    fill(r.p, BIG);
    uint64_t mapped0 = huge_mapped(), resident0 = lull_resident_bytes();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, shrink_watched, &r), 0);
    pthread_join(t, NULL);
    size_t space0 = r.space0, rss0 = r.rss0;
    cr_assert_eq(r.q, r.p, "the block moved: %p -> %p", (void *)r.p, (void *)r.q);
    cr_assert(r.watched, "the watch was not installed");
    cr_assert_eq(r.watched_calls, 0, "the realloc made %zu madvise/munmap calls", r.watched_calls);
    size_t usable = lull_usable_size(r.q);
    cr_assert(usable >= SMALL && usable < SMALL + 4096, "usable %zu for %zu", usable, SMALL);
    check(r.q, SMALL);
    /* a tick that started after the realloc has given the tail back */
    cr_assert(lull_reclaim_now());
    size_t space1, rss1;
    statm(&space1, &rss1);
    uint64_t mapped1 = huge_mapped(), resident1 = lull_resident_bytes();
    size_t tail = BIG - SMALL - 4096;
    cr_log_info("address space -%zu MiB, RSS -%zu MiB, mapped -%llu MiB, resident -%llu MiB",
                (space0 - space1) / MiB, (rss0 - rss1) / MiB,
                (unsigned long long)((mapped0 - mapped1) / MiB),
                (unsigned long long)((resident0 - resident1) / MiB));
    cr_assert_geq(space0 - space1, tail, "address space went down by %zu MiB only",
                  (space0 - space1) / MiB);
    /* RSS: less what the process touched meanwhile (the statistics, the
     * log), a few pages */
    cr_assert_geq(rss0 - rss1, tail - 2 * MiB, "RSS went down by %zu MiB only",
                  (rss0 - rss1) / MiB);
    cr_assert_geq(mapped0 - mapped1, tail);
    cr_assert_geq(resident0 - resident1, tail, "the resident estimate kept the tail");
    check(r.q, SMALL);
    lull_free(r.q);
}

/* the accounting of a shrunk block comes back to where it started once the
 * block is freed and everything given back; grown again, its bytes stay */
Test(huge_realloc_shrink, grows_again_and_frees_to_the_baseline, .init = setup) {
    lull_purge_all();
    uint64_t mapped0 = huge_mapped(), resident0 = lull_resident_bytes();
    char *p = lull_malloc(BIG);
    cr_assert_not_null(p);
    fill(p, BIG);
    char *q = lull_realloc(p, SMALL);
    cr_assert_eq(q, p, "the block moved");
    /* grown before the tail is given back (it is still mapped) and after */
    q = lull_realloc(q, SMALL + 20 * MiB);
    cr_assert_not_null(q);
    check(q, SMALL);
    fill(q, SMALL + 20 * MiB);
    cr_assert(lull_reclaim_now());
    char *s = lull_realloc(q, SMALL / 4);
    cr_assert_eq(s, q, "the block moved");
    cr_assert(lull_reclaim_now());
    s = lull_realloc(s, BIG);
    cr_assert_not_null(s);
    check(s, SMALL / 4);
    lull_free(s);
    lull_purge_all();
    cr_assert_eq(huge_mapped(), mapped0, "mapped %llu, was %llu", (unsigned long long)huge_mapped(),
                 (unsigned long long)mapped0);
    cr_assert_eq(lull_resident_bytes(), resident0, "resident estimate %llu, was %llu",
                 (unsigned long long)lull_resident_bytes(), (unsigned long long)resident0);
}

/* A huge block shrunk to a size a small block serves moves to one (a copy
 * of that size): kept where it was, each such block held its own mapping,
 * header slice and VMA, 68 KiB of the resident estimate for 100 bytes, and
 * a loop of malloc(20 MiB) and realloc(p, 100) ran out of a 64 MiB heap
 * limit after a few hundred blocks (each malloc mapped anew: the shrunk
 * block's mapping was never freed for the next to reuse). */
#define KEPT 1000
Test(huge_realloc_shrink, a_block_shrunk_to_a_small_size_moves, .init = setup) {
    static char *kept[KEPT];
    lull_purge_all();
    unsigned mb = (unsigned)((lull_resident_bytes() + 64 * MiB + MiB - 1) >> 20);
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    for (int i = 0; i < KEPT; i++) {
        char *p = lull_malloc(20 * MiB);
        cr_assert_not_null(p, "malloc(20 MiB) refused after %d blocks shrunk to 100 bytes", i);
        memset(p, i & 0x7f, 100);
        kept[i] = lull_realloc(p, 100);
        cr_assert_not_null(kept[i]);
        cr_assert_eq(kept[i][99], (char)(i & 0x7f));
    }
    for (int i = 0; i < KEPT; i++)
        lull_free(kept[i]);
}
