/* A fork child of a process whose reclaim thread failed to start
 * (pthread_create refused: here LULL_FAULT=thread_create, disarmed before
 * the fork, so the child could start one). The parent's failure is the
 * parent's: a child is a new process with one thread, and a thread limit
 * the parent had reached (RLIMIT_NPROC, a cgroup's pids.max) need not hold
 * there. The child must start its own thread on first need, as a child of
 * a process whose thread runs does (reclaim/reclaim.h): lazily, at a start
 * point, never in the fork handler, so that a child that only execs stays
 * single-threaded. Before, the child inherited "never" (NOT_DEFERRED with
 * no thread), started none, and purged nothing but what lull_purge_all()
 * purged on its caller.
 *
 * The scenario runs in a new process of this program (tests/support/
 * reexec.h), forks, and prints the child's figures and then its own. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/fault.h"
#include "reclaim/reclaim.h"
#include "tests/support/reexec.h"
#include "tests/support/task_list.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define BLOCK (16 * MiB)

/* Figures noted first and printed at the end: a printf could allocate,
 * and an allocation is a start point (so is task_count()'s, where lull
 * replaces malloc: the first in the child only notes the time). */
static int child_scenario(void) {
    int threads_after_fork = task_count();
    int deferred_after_fork = atomic_load(&lull_reclaim_deferred);
    /* a span given back: the thread is wanted, not started (a free never
     * starts it) */
    char *p = lull_malloc(BLOCK);
    if (!p) return 3;
    memset(p, 0x5a, BLOCK);
    lull_free(p);
    int deferred_after_free = atomic_load(&lull_reclaim_deferred);
    /* an allocation that takes a span (a size class not used yet): a
     * start point */
    static void *fresh[64];
    for (int i = 0; i < 64; i++)
        if (!(fresh[i] = lull_malloc(2000))) return 4;
    int deferred_after_malloc = atomic_load(&lull_reclaim_deferred);
    int threads_after_malloc = task_count();
    /* its tick purges the block's slices (purge delay 0) */
    bool ran = lull_reclaim_now();
    if (ran) lull_reclaim_now();
    lull_reclaim_stats st;
    lull_reclaim_get_stats(&st);
    printf("child_threads_after_fork=%d\nchild_deferred_after_fork=%d\n", threads_after_fork,
           deferred_after_fork);
    printf("child_deferred_after_free=%d\nchild_deferred_after_malloc=%d\n", deferred_after_free,
           deferred_after_malloc);
    printf("child_threads_after_malloc=%d\n", threads_after_malloc);
    printf("child_reclaim_now=%d\nchild_running=%d\nchild_start_failed=%d\n", ran, st.running,
           st.start_failed);
    printf("child_purged_bytes=%llu\n", (unsigned long long)st.purged_bytes);
    for (int i = 0; i < 64; i++)
        lull_free(fresh[i]);
    return 0;
}

static void scenario(void) {
    lull_set_purge_delay_ms(0);
    void *p = lull_malloc(64); /* the modules start: the thread is deferred */
    if (!p) _exit(3);
    lull_free(p);
    bool ran = lull_reclaim_now(); /* its start fails (LULL_FAULT=thread_create) */
    lull_reclaim_stats st;
    lull_reclaim_get_stats(&st);
    printf("parent_reclaim_now=%d\nparent_start_failed=%d\n", ran, st.start_failed);
    lull_fault_arm(LULL_FAULT_THREAD_CREATE, 0); /* the child could start one */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) _exit(5);
    if (pid == 0) {
        int r = child_scenario();
        fflush(stdout);
        _exit(r);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) _exit(6);
    printf("child_status=%d\n", status);
    /* the parent's own state is as the failure left it: "never" */
    printf("parent_deferred_after_fork=%d\n", atomic_load(&lull_reclaim_deferred));
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor(200))) static void child(void) {
    if (getenv("LULL_TEST_FORK_FAILED_START")) scenario();
}

Test(reclaim_start_fork, a_child_of_a_failed_start_starts_its_own_thread, .timeout = 120) {
    const char *vars[] = {"LULL_TEST_FORK_FAILED_START=1", "LULL_FAULT=thread_create",
                          "LULL_CONF=warm_reserve_mb=0,thp=never", NULL};
    child_run cr;
    reexec_run("test_reclaim_start_fork", vars, "fork after a failed start", 60000, &cr);
    reexec_assert_exited_0(&cr, "fork after a failed start");
    cr_assert_eq(reexec_field(&cr, "parent_reclaim_now"), 0, "the parent's thread started");
    cr_assert_eq(reexec_field(&cr, "parent_start_failed"), 1);
    cr_assert_eq(reexec_field(&cr, "child_status"), 0, "the child failed: %s / %s", cr.out, cr.err);
    /* lazily: not in the fork handler, not at a free */
    /* (the state says it: a start, failed or not, leaves NOT_DEFERRED;
     * thread counts do not, under ThreadSanitizer, which starts a thread
     * of its own in a fork child) */
    cr_assert_eq(reexec_field(&cr, "child_deferred_after_fork"), LULL_RECLAIM_DEFERRED,
                 "the child's thread is not deferred after the fork (NOT_DEFERRED is %d: no "
                 "thread, ever)",
                 LULL_RECLAIM_NOT_DEFERRED);
    cr_assert_eq(reexec_field(&cr, "child_deferred_after_free"), LULL_RECLAIM_WANTED,
                 "a free started the thread, or did not want it");
    cr_assert_eq(reexec_field(&cr, "child_deferred_after_malloc"), LULL_RECLAIM_NOT_DEFERRED,
                 "the child's start point did not start the thread");
    /* the thread, and perhaps its io_uring's worker (iou-wrk) */
    cr_assert_geq(reexec_field(&cr, "child_threads_after_malloc"),
                  reexec_field(&cr, "child_threads_after_fork") + 1,
                  "the child started no reclaim thread at its start point");
    cr_assert_eq(reexec_field(&cr, "child_reclaim_now"), 1);
    cr_assert_eq(reexec_field(&cr, "child_running"), 1);
    cr_assert_eq(reexec_field(&cr, "child_start_failed"), 0);
    cr_assert_geq(reexec_field(&cr, "child_purged_bytes"), BLOCK / 2,
                  "the child's thread purged %llu bytes of the %zu freed",
                  (unsigned long long)reexec_field(&cr, "child_purged_bytes"), BLOCK);
    cr_assert_eq(reexec_field(&cr, "parent_deferred_after_fork"), LULL_RECLAIM_NOT_DEFERRED);
}
