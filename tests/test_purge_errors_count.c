/* The counter page's purge_errors counts each purge the kernel refused
 * once. The reclaim steps count a refused run in purge_failures, and the
 * backend counts the same refused range in its errors: the counter page
 * added the two, so every refusal showed as two errors. A child locks its
 * memory (mlockall: every MADV_DONTNEED fails with EINVAL) and has the
 * reclaim thread purge one-slice runs; the refusals are then counted by
 * the steps and must read the same on the counter page. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/config.h"
#include "base/types.h"
#include "reclaim/reclaim.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SPANS 200
#define PER_SPAN 64

enum {
    CHILD_OK = 0,
    CHILD_NO_LOCK = 2,
    CHILD_NO_THREAD = 3,
    CHILD_NOT_REFUSED = 4,
    CHILD_STATS = 5,
    CHILD_MISCOUNTED = 6
};

static int child(void) {
    /* no warm reserve: its purges fail too, but no step counts them */
    if (!lull_config_set("warm_reserve_mb", "0")) return CHILD_STATS;
    if (mlockall(MCL_CURRENT | MCL_FUTURE | MCL_ONFAULT) != 0) return CHILD_NO_LOCK;
    static void *b[SPANS * PER_SPAN];
    for (int i = 0; i < SPANS * PER_SPAN; i++) {
        b[i] = lull_malloc(1024);
        if (!b[i]) return CHILD_NO_LOCK;
        memset(b[i], 1, 1024);
    }
    if (!lull_reclaim_now()) return CHILD_NO_THREAD;
    lull_reclaim_stats r0, r1;
    struct lull_counters c0, c1;
    lull_reclaim_get_stats(&r0);
    if (lull_stats(&c0) != 0) return CHILD_STATS;
    for (int i = 0; i < SPANS * PER_SPAN; i++)
        if (((uintptr_t)b[i] >> LULL_SLICE_SHIFT) % 2 == 0) lull_free(b[i]);
    lull_set_purge_delay_ms(0);
    if (!lull_reclaim_now() || !lull_reclaim_now()) return CHILD_NO_THREAD;
    lull_reclaim_get_stats(&r1);
    if (lull_stats(&c1) != 0) return CHILD_STATS;
    uint64_t refused = r1.purge_failures - r0.purge_failures;
    uint64_t errors = c1.purge_errors - c0.purge_errors;
    printf("refused purges %llu, purge_errors +%llu\n", (unsigned long long)refused,
           (unsigned long long)errors);
    fflush(stdout);
    if (refused == 0) return CHILD_NOT_REFUSED;
    return errors == refused ? CHILD_OK : CHILD_MISCOUNTED;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

Test(purge_errors, a_refused_purge_counts_once, .timeout = 120) {
#ifdef LULL_SANITIZED
    cr_skip_test("mlockall of a sanitizer's shadow reservations");
#endif
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(child());
    int status = 0;
    pid_t got = 0;
    for (double end = now_s() + 60; (got = waitpid(pid, &status, WNOHANG)) == 0 && now_s() < end;)
        usleep(10000);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        cr_assert_fail("the child did not finish in 60 s");
    }
    cr_assert(WIFEXITED(status), "status %#x", status);
    if (WEXITSTATUS(status) == CHILD_NO_LOCK) cr_skip_test("mlockall refused (RLIMIT_MEMLOCK)");
    cr_assert_neq(WEXITSTATUS(status), CHILD_NO_THREAD, "no reclaim thread");
    cr_assert_neq(WEXITSTATUS(status), CHILD_STATS, "lull_stats or lull_config_set failed");
    cr_assert_neq(WEXITSTATUS(status), CHILD_NOT_REFUSED,
                  "no purge failed: this kernel purges locked pages");
    cr_assert_eq(WEXITSTATUS(status), CHILD_OK,
                 "purge_errors on the counter page is not the number of refused purges");
}
