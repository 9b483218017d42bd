/* Freed huge blocks aligned past a slice come back to aligned allocations,
 * and the queue of freed mappings stays bounded when none fits: a loop of
 * aligned_alloc(1 GiB, 100) and free() mapped a new block each time while
 * the freed ones waited for the reclaim thread (nothing asked the queue for
 * an aligned block), and reached 2-10 TiB of address space (VmPeak).
 *
 * Event-bounded: the reclaim thread is held (tests/support/reclaim_hold.h)
 * while the loops run, which is the reclaim thread at its slowest: nothing
 * freed is unmapped unless an allocation waits for its tick, which the
 * test lets it run as soon as the statistics count the wait. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/huge.h"
#include "reclaim/huge_queue.h"
#include "reclaim/reclaim.h"
#include "base/types.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define ALIGN ((size_t)1 << 30)

/* kB of VmPeak, the most address space the process ever held */
static uint64_t vm_peak(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (uint64_t)kb << 10;
}

static uint64_t reused_count(void) {
    uint64_t n = 0;
    for (int i = 0; i < LULL_MAX_NODES; i++)
        n += atomic_load(&lull_huge_acct[i].reused);
    return n;
}

static uint64_t backlog_waits(void) {
    lull_reclaim_stats s = {0};
    lull_reclaim_get_stats(&s);
    return s.huge_backlog_waits;
}

static void setup(void) {
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

/* the same aligned block again and again: one mapping serves them all
 * (before: a new one each time, 32 MiB of address space each while the
 * huge region had free 1 GiB boundaries, 1 GiB more after) */
#define SAME_LOOPS 1000
Test(huge_aligned_reuse, a_freed_aligned_block_is_reused, .init = setup) {
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    uint64_t peak0 = vm_peak(), reused0 = reused_count();
    for (int i = 0; i < SAME_LOOPS; i++) {
        char *p = lull_aligned_alloc(ALIGN, 100);
        cr_assert_not_null(p, "allocation %d failed", i);
        cr_assert_eq((uintptr_t)p % ALIGN, 0, "block %p is not aligned", (void *)p);
        p[0] = p[99] = 1;
        lull_free(p);
    }
    uint64_t grew = vm_peak() - peak0, reused = reused_count() - reused0;
    cr_assert(reclaim_release(), "the reclaim thread stayed held");
    cr_log_info("VmPeak +%llu MiB, %llu of %d reused", (unsigned long long)(grew / MiB),
                (unsigned long long)reused, SAME_LOOPS);
    cr_expect_geq(reused, SAME_LOOPS - 1, "%llu of %d aligned blocks reused a freed mapping",
                  (unsigned long long)reused, SAME_LOOPS);
    cr_assert_leq(grew, GiB, "VmPeak grew by %llu MiB", (unsigned long long)(grew / MiB));
}

/* blocks that grow by a MiB each time: no freed one ever fits the next, so
 * only the bound on the queue (LULL_HUGE_QUEUE_WAIT) keeps the loop from
 * holding every block it ever freed */
#define GROWING_LOOPS 600
#define FIRST_SIZE (20 * MiB)
static _Atomic int loop_done;

static void *growing_loop(void *arg) {
    (void)arg;
    for (int i = 0; i < GROWING_LOOPS; i++) {
        char *p = lull_aligned_alloc(ALIGN, FIRST_SIZE + (size_t)i * MiB);
        if (!p || (uintptr_t)p % ALIGN) {
            atomic_store(&loop_done, -1 - i);
            return NULL;
        }
        p[0] = 1;
        lull_free(p);
    }
    atomic_store(&loop_done, 1);
    return NULL;
}

Test(huge_aligned_reuse, the_queue_of_freed_aligned_blocks_is_bounded, .init = setup) {
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    uint64_t peak0 = vm_peak(), waits0 = backlog_waits();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, growing_loop, NULL), 0);
    /* the loop ends, or waits for a tick: then the reclaim thread runs
     * (the deadline is only against a hang) */
    uint64_t until = now_ms() + 60000;
    while (!atomic_load(&loop_done) && backlog_waits() == waits0 && now_ms() < until)
        sleep_ms(1);
    bool waited = backlog_waits() != waits0;
    cr_assert(reclaim_release(), "the reclaim thread stayed held");
    pthread_join(t, NULL);
    int done = atomic_load(&loop_done);
    cr_assert_eq(done, 1, "aligned allocation %d failed", -1 - done);
    uint64_t grew = vm_peak() - peak0;
    cr_log_info("VmPeak +%llu MiB, waited %d", (unsigned long long)(grew / MiB), waited);
    /* what is queued, plus what a tick claimed and is still unmapping, plus
     * the largest block and its slack */
    uint64_t bound = 2 * LULL_HUGE_QUEUE_WAIT + 4 * GiB;
    cr_assert_leq(grew, bound, "VmPeak grew by %llu GiB (bound %llu GiB), waited %d",
                  (unsigned long long)(grew / GiB), (unsigned long long)(bound / GiB), waited);
}
