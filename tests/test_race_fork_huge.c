/* fork() while another thread holds freed huge mappings it took whole
 * from a lock-free stack or queue and has not given back yet, or has
 * counted a mapping it has not queued yet. The race harness holds that
 * thread inside the window (base/race.h; a -DLULL_RACE=ON build):
 *
 * - huge_take_aligned: a huge malloc aligned past a slice took the
 *   overflow stack of freed mappings (reclaim/huge_queue.c's
 *   take_aligned) whole, and gives the rest back after a look at up to 64
 *   entries;
 * - huge_take_all: a huge malloc with no reclaim thread running took every
 *   queued mapping (reclaim/huge_queue.c's take_first_fit), and gives back
 *   those it does not keep;
 * - huge_tail_push: a realloc that shrank a huge block in place counted
 *   the tail in the tails' held bytes, and has not pushed it yet
 *   (reclaim/huge_tail.c).
 *
 * A child copied inside one of the first two had none of those mappings
 * queued: nobody held them there, and their address space was never
 * unmapped in it. One copied inside the third counted a tail nobody holds
 * there as held for good (relief waited for a forced tick for it).
 *
 * Each trial: a thread of its own enters the window and is held at the
 * point (or runs through it, a quarter of the seeds: base/race.c); the
 * main thread forks once the point is reached, and the child must count
 * as queued what was queued before (as held what its tails' stack
 * holds). Bounded by trials (SEEDS), not by time. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/fault.h"
#include "reclaim/huge_queue.h"
#include "reclaim/huge_tail.h"

#include "tests/support/race_fork.h"
#include "tests/support/reclaim_hold.h"

#include <criterion/criterion.h>
#include <stdint.h>

#define SEEDS 16
#define MiB ((size_t)1 << 20)
#define ALIGN (2 * MiB) /* past a slice: such blocks wait on the overflow only */
#define SIZE (24 * MiB) /* huge, never touched: address space only */
#define FREED 4

/* larger than every freed block: it looks at them all and keeps none */
static void *take_none(void *arg) {
    (void)arg;
    return lull_aligned_alloc(ALIGN, 2 * SIZE);
}

/* The child: 1 if it counts less queued than *before. */
static int child_check(void *before) {
    return lull_huge_queue_bytes() < *(uint64_t *)before;
}

/* The blocks the takes got: freed at the end (freed earlier, a later take
 * would fit one and rightly take it). */
static void *got[SEEDS];

/* One trial (seed s): 1 if the child counted less queued than the parent
 * before the take. */
static int fork_inside_an_aligned_take(uint64_t s) {
    void *b[FREED];
    for (int i = 0; i < FREED; i++) {
        b[i] = lull_aligned_alloc(ALIGN, SIZE);
        cr_assert_not_null(b[i]);
    }
    for (int i = 0; i < FREED; i++)
        lull_free(b[i]);
    uint64_t queued = lull_huge_queue_bytes();
    cr_assert_geq(queued, (uint64_t)FREED * SIZE, "the freed blocks are not queued");
    int lost = race_fork_at(LULL_RACE_HUGE_TAKE_ALIGNED, 0xa11ceULL * (s + 1), take_none, NULL,
                            child_check, &queued, &got[s]);
    cr_assert_not_null(got[s]);
    return lost;
}

Test(race_fork_huge, fork_while_an_aligned_malloc_holds_the_overflow, .timeout = 300) {
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    int lost = 0;
    for (uint64_t s = 0; s < SEEDS; s++)
        lost += fork_inside_an_aligned_take(s);
    cr_assert(reclaim_release());
    for (int s = 0; s < SEEDS; s++)
        lull_free(got[s]);
    cr_assert_eq(lost, 0,
                 "%d of %d fork children lost the freed mappings an aligned malloc had taken", lost,
                 SEEDS);
}

/* ---- no reclaim thread: a huge malloc takes the whole queue --------------- */

/* Its start refused for good: freed huge mappings wait on the queue
 * (inline_purge is off), and a huge malloc takes the queue whole to look
 * for a fit (reclaim_thread.c's huge_take). */
static void no_reclaim_thread(void) {
    lull_fault_arm(LULL_FAULT_THREAD_CREATE, -1);
    lull_free(lull_malloc(64));
    cr_assert_not(lull_reclaim_now(), "a reclaim thread runs");
}

/* larger than every queued block: it takes them all and keeps none */
static void *take_all_none(void *arg) {
    (void)arg;
    return lull_malloc(2 * SIZE);
}

Test(race_fork_huge, fork_while_a_malloc_without_a_reclaim_thread_holds_the_queue,
     .init = no_reclaim_thread, .timeout = 300) {
    void *b[FREED];
    for (int i = 0; i < FREED; i++) {
        b[i] = lull_malloc(SIZE);
        cr_assert_not_null(b[i]);
    }
    for (int i = 0; i < FREED; i++)
        lull_free(b[i]);
    uint64_t queued = lull_huge_queue_bytes();
    cr_assert_geq(queued, (uint64_t)FREED * SIZE, "the freed blocks are not queued");
    int lost = 0;
    for (uint64_t s = 0; s < SEEDS; s++) {
        lost += race_fork_at(LULL_RACE_HUGE_TAKE_ALL, 0x7a4eULL * (s + 1), take_all_none, NULL,
                             child_check, &queued, &got[s]);
        cr_assert_not_null(got[s]);
        cr_assert_eq(lull_huge_queue_bytes(), queued, "the parent lost queued mappings");
    }
    for (int s = 0; s < SEEDS; s++)
        lull_free(got[s]);
    cr_assert_eq(lost, 0,
                 "%d of %d fork children lost the queued mappings a malloc had taken whole", lost,
                 SEEDS);
}

/* ---- a shrunk block's tail, counted before it is pushed ---------------------- */

#define BIG (40 * MiB)
#define SMALL (10 * MiB)

static void *shrink(void *p) {
    return lull_realloc(p, SMALL);
}

/* The child: 1 if it counts as held more than its tails' stack holds. */
static int child_check_tails(void *unused) {
    (void)unused;
    uint64_t counted = lull_huge_tail_bytes(), held = 0;
    for (lull_huge_tail *t = lull_huge_tail_take_all(); t; t = t->next)
        held += t->len;
    return counted != held;
}

/* With no reclaim thread the tails stay on their stack (inline_purge is
 * off): each trial's is there in the parent afterwards. */
Test(race_fork_huge, fork_while_a_realloc_pushes_a_shrunk_tail, .init = no_reclaim_thread,
     .timeout = 300) {
    int wrong = 0;
    for (uint64_t s = 0; s < SEEDS; s++) {
        void *p = lull_malloc(BIG);
        cr_assert_not_null(p);
        uint64_t before = lull_huge_tail_bytes();
        wrong += race_fork_at(LULL_RACE_HUGE_TAIL_PUSH, 0x7a11ULL * (s + 1), shrink, p,
                              child_check_tails, NULL, &got[s]);
        cr_assert_eq(got[s], p, "the block moved");
        cr_assert_gt(lull_huge_tail_bytes(), before, "no tail was pushed");
    }
    for (int s = 0; s < SEEDS; s++)
        lull_free(got[s]);
    cr_assert_eq(wrong, 0, "%d of %d fork children counted as held a tail their stack did not hold",
                 wrong, SEEDS);
}
