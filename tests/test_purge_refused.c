/* Purges the kernel refuses: a process that locked its memory
 * (mlockall, as latency-sensitive servers do) gets EINVAL for every
 * MADV_DONTNEED and MADV_FREE. The reclaim thread must count the failures
 * and go on: a step that claimed a full batch of runs, all refused, put
 * them back as dirty and claimed the same batch again, for ever, so
 * lull_reclaim_now() never returned and the thread spun on a core
 * (session 22's review). Each case runs in a forked child (mlockall is the
 * whole process's); the parent gives it a minute, which a tick that ends
 * takes milliseconds of. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/types.h"
#include "reclaim/reclaim.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* one-slice spans of 1 KiB blocks: every other one freed whole leaves
 * more one-slice dirty runs than a step claims (LULL_STEP_RUNS) */
#define SPANS 800
#define PER_SPAN 64

enum { CHILD_OK = 0, CHILD_NO_LOCK = 2, CHILD_NO_THREAD = 3, CHILD_NOT_REFUSED = 4 };

static int refused_purges_child(void) {
    if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0) return CHILD_NO_LOCK;
    static void *b[SPANS * PER_SPAN];
    for (int i = 0; i < SPANS * PER_SPAN; i++) {
        b[i] = lull_malloc(1024);
        if (!b[i]) return CHILD_NO_LOCK;
        memset(b[i], 1, 1024);
    }
    for (int i = 0; i < SPANS * PER_SPAN; i++)
        if (((uintptr_t)b[i] >> LULL_SLICE_SHIFT) % 2 == 0) lull_free(b[i]);
    lull_reclaim_stats before, after;
    lull_reclaim_get_stats(&before);
    lull_set_purge_delay_ms(0);
    if (!lull_reclaim_now() || !lull_reclaim_now()) return CHILD_NO_THREAD;
    lull_purge_all();
    lull_reclaim_get_stats(&after);
    if (after.purge_failures == before.purge_failures) return CHILD_NOT_REFUSED;
    return CHILD_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

Test(purge_refused, ticks_end_when_every_purge_is_refused, .timeout = 120) {
#ifdef LULL_SANITIZED
    cr_skip_test("mlockall of a sanitizer's shadow reservations");
#endif
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(refused_purges_child());
    int status = 0;
    pid_t got = 0;
    for (double end = now_s() + 60; (got = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < end;)
        usleep(10000);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        cr_assert_fail("a reclaim tick did not end in 60 s with every purge refused");
    }
    cr_assert(WIFEXITED(status), "status %#x", status);
    if (WEXITSTATUS(status) == CHILD_NO_LOCK) cr_skip_test("mlockall refused (RLIMIT_MEMLOCK)");
    cr_assert_neq(WEXITSTATUS(status), CHILD_NO_THREAD, "no reclaim thread");
    cr_assert_neq(WEXITSTATUS(status), CHILD_NOT_REFUSED,
                  "no purge failed: this kernel purges locked pages");
    cr_assert_eq(WEXITSTATUS(status), CHILD_OK);
}
