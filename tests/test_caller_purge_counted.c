/* With no reclaim thread (its start failed), lull_purge_all() purges on its
 * caller with a backend of its own (reclaim/purge_now.c), plain madvise.
 * That memory leaves the process all the same, and the counter page's
 * purge figures (purged_pages, the denominator of the wasted-purge ratio,
 * and purge_calls / purge_bytes / purge_syscalls of the madvise backend)
 * must say so: they were read from the reclaim thread's backend only, and
 * the caller's counts were lost with its short-lived backend, so a purge
 * of 16 MiB read as none. The scenario runs in a new process of this
 * program with LULL_FAULT=thread_create (tests/support/reexec.h). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define PAGE ((size_t)4096)
#define BLOCK (16 * MiB)

static size_t resident_pages(const void *p, size_t len) {
    static unsigned char vec[BLOCK / PAGE];
    if (mincore((void *)p, len, vec) != 0) return 0;
    size_t n = 0;
    for (size_t i = 0; i < len / PAGE; i++)
        n += vec[i] & 1;
    return n;
}

static void scenario(void) {
    struct lull_counters c0, c1;
    memset(&c0, 0, sizeof c0);
    memset(&c1, 0, sizeof c1);
    /* a large block: one span of whole slices, freed dirty */
    char *p = lull_malloc(BLOCK);
    if (!p) _exit(3);
    memset(p, 0x5a, BLOCK);
    if (lull_reclaim_now()) _exit(4); /* a reclaim thread runs after all */
    if (lull_stats(&c0) != 0) _exit(5);
    size_t before = resident_pages(p, BLOCK);
    lull_free(p);
    lull_purge_all();
    size_t after = resident_pages(p, BLOCK);
    if (lull_stats(&c1) != 0) _exit(5);
    printf("running=%d\n", !!(c1.flags & LULL_COUNTERS_F_RECLAIM_THREAD));
    printf("resident_before=%zu\nresident_after=%zu\n", before, after);
    printf("purged_pages=%llu\n", (unsigned long long)(c1.purged_pages - c0.purged_pages));
    printf("madvise_calls=%llu\n",
           (unsigned long long)(c1.purge_calls[LULL_COUNTERS_BACKEND_MADVISE] -
                                c0.purge_calls[LULL_COUNTERS_BACKEND_MADVISE]));
    printf("madvise_bytes=%llu\n",
           (unsigned long long)(c1.purge_bytes[LULL_COUNTERS_BACKEND_MADVISE] -
                                c0.purge_bytes[LULL_COUNTERS_BACKEND_MADVISE]));
    printf("madvise_syscalls=%llu\n",
           (unsigned long long)(c1.purge_syscalls[LULL_COUNTERS_BACKEND_MADVISE] -
                                c0.purge_syscalls[LULL_COUNTERS_BACKEND_MADVISE]));
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor(200))) static void child(void) {
    if (getenv("LULL_TEST_CALLER_PURGE")) scenario();
}

Test(caller_purge, a_purge_on_the_caller_counts_in_purged_pages, .timeout = 120) {
    const char *vars[] = {"LULL_TEST_CALLER_PURGE=1", "LULL_FAULT=thread_create",
                          "LULL_CONF=warm_reserve_mb=0,refault_monitor=off", NULL};
    child_run cr;
    reexec_run("test_caller_purge_counted", vars, "caller purge", 60000, &cr);
    reexec_assert_exited_0(&cr, "caller purge");
    cr_assert_eq(reexec_field(&cr, "running"), 0, "a reclaim thread runs");
    uint64_t before = reexec_field(&cr, "resident_before");
    uint64_t after = reexec_field(&cr, "resident_after");
    cr_assert_geq(before, BLOCK / PAGE * 9 / 10, "the block was not resident");
    /* the purge itself happened: the block's pages left memory */
    cr_assert_leq(after, BLOCK / PAGE / 16, "%llu pages of the freed block still resident",
                  (unsigned long long)after);
    uint64_t purged = reexec_field(&cr, "purged_pages");
    cr_assert_geq(purged, (before - after) * 3 / 4,
                  "%llu pages left memory through lull_purge_all(), purged_pages +%llu",
                  (unsigned long long)(before - after), (unsigned long long)purged);
    cr_assert_geq(reexec_field(&cr, "madvise_bytes"), (before - after) * PAGE * 3 / 4,
                  "purge_bytes[madvise] did not count the caller's purge");
    cr_assert_geq(reexec_field(&cr, "madvise_calls"), 1, "purge_calls[madvise] +0");
    cr_assert_geq(reexec_field(&cr, "madvise_syscalls"), 1, "purge_syscalls[madvise] +0");
}
