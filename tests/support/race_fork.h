/* One trial of a race test that forks inside a window (tests/test_race_*.c,
 * a -DLULL_RACE=ON build): `run(arg)` on a thread of its own, `point` armed
 * with a delay drawn from `seed` (base/race.h); once the thread reached the
 * point (held there, or run through it for a quarter of the seeds), fork,
 * and in the child exit with `child(child_arg)`. Joins the thread, disarms,
 * and returns the child's exit status and, in *result, what `run` returned
 * (if result is not NULL). */
#ifndef LULL_TEST_RACE_FORK_H
#define LULL_TEST_RACE_FORK_H

#include "base/race.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#define RACE_FORK_MAX_DELAY_US 40000
#define RACE_FORK_WAIT_MS 5000

static inline int race_fork_at(lull_race_point_id point, uint64_t seed, void *(*run)(void *),
                               void *arg, int (*child)(void *), void *child_arg, void **result) {
    lull_race_arm(1u << point, seed, RACE_FORK_MAX_DELAY_US);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, run, arg), 0);
    uint64_t until = now_ms() + RACE_FORK_WAIT_MS;
    while (lull_race_hits(point) == 0) {
        cr_assert_lt(now_ms(), until, "the thread never reached %s (seed %llu)",
                     lull_race_point_name(point), (unsigned long long)seed);
        sched_yield();
    }
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(child(child_arg));
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    void *rc;
    pthread_join(t, &rc);
    lull_race_arm(0, 0, 0);
    if (result) *result = rc;
    cr_assert(WIFEXITED(status), "child died of signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
}

#endif
