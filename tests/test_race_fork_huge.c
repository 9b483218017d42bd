/* fork() while another thread's huge malloc aligned past a slice holds the
 * overflow stack of freed mappings (reclaim/huge_queue.c's take_aligned):
 * taken whole in one exchange, given back after a look at up to 64
 * entries. The race harness holds the taking thread between the two
 * (base/race.h, point huge_take_aligned; a -DLULL_RACE=ON build).
 *
 * A child copied in between had none of those mappings queued: nobody
 * held them there, and their address space was never unmapped in it.
 *
 * Each trial: freed aligned blocks wait on the overflow (the reclaim
 * thread held, so that it drains nothing), a thread of its own asks for an
 * aligned block none of them fits and is held at the point (or runs
 * through it, a quarter of the seeds: base/race.c); the main thread forks
 * once the point is reached, and the child must count as queued what was
 * queued before. Bounded by trials (SEEDS), not by time. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "reclaim/huge_queue.h"

#include "tests/support/reclaim_hold.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEEDS 16
#define MAX_DELAY_US 40000
#define WAIT_MS 5000
#define MiB ((size_t)1 << 20)
#define ALIGN (2 * MiB) /* past a slice: such blocks wait on the overflow only */
#define SIZE (24 * MiB) /* huge, never touched: address space only */
#define FREED 4

static uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* larger than every freed block: it looks at them all and keeps none */
static void *take_none(void *arg) {
    (void)arg;
    return lull_aligned_alloc(ALIGN, 2 * SIZE);
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
    lull_race_arm(1u << LULL_RACE_HUGE_TAKE_ALIGNED, 0xa11ceULL * (s + 1), MAX_DELAY_US);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, take_none, NULL), 0);
    uint64_t until = now_ms() + WAIT_MS;
    while (lull_race_hits(LULL_RACE_HUGE_TAKE_ALIGNED) == 0) {
        cr_assert_lt(now_ms(), until, "the thread never reached huge_take_aligned (seed %llu)",
                     (unsigned long long)s);
        sched_yield();
    }
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(lull_huge_queue_bytes() < queued);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    pthread_join(t, &got[s]);
    lull_race_arm(0, 0, 0);
    cr_assert_not_null(got[s]);
    cr_assert(WIFEXITED(status), "child died of signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
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
