/* fork() while another thread starts lull (src/init.c: the modules start at
 * the first allocation, or in the library constructor where libnuma must
 * be loaded), with the race harness holding the start open (base/race.h,
 * point module_start; a -DLULL_RACE=ON build), or holding the core's
 * initialisation before it open (point core_init).
 *
 * A child that inherits "starting" (or the core's "initialising") has no
 * thread to finish it, and its first malloc waits for it for ever: the
 * prepare handler must wait for a start in progress on another thread
 * before the fork.
 *
 * Each trial is a new process (the start happens once a process): a
 * function that runs before every constructor creates a thread, then the
 * main thread's first allocation starts lull's modules, held at
 * module_start, while the new thread forks; the grandchild allocates and
 * exits. The test re-runs the
 * trial until the fork landed inside a held start HELD_TRIALS times (at
 * most MAX_TRIALS: bounded by trials, not by time) and fails if any
 * grandchild hung or failed. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "tests/support/hang_report.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HELD_TRIALS 3
#define MAX_TRIALS 40
#define HOLD_US 200000 /* the longest the start is held */
#define WAIT_S 10      /* a grandchild that takes longer hung */

static pthread_t forker;
static lull_race_point_id held_point; /* where the main thread's first allocation is held */
static _Atomic bool lull_started;     /* the main thread's first malloc returned */
static int trial_held, trial_result = -1;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* 0 the grandchild exited 0, 1 it failed, 2 it hung (killed) */
static int wait_grandchild(pid_t pid) {
    for (int i = 0; i < WAIT_S * 100; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
        sleep_ms(10);
    }
    hang_report(pid, stderr);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 2;
}

static void *fork_during_start(void *arg) {
    (void)arg;
    /* the main thread's first allocation reached the start */
    for (int i = 0; i < WAIT_S * 1000 && lull_race_hits(held_point) == 0; i++)
        sleep_ms(1);
    bool held = !atomic_load(&lull_started);
    pid_t pid = fork();
    if (pid == 0) {
        void *p = lull_malloc(100);
        if (!p) _exit(3);
        lull_free(p);
        _exit(0);
    }
    trial_held = held && lull_race_hits(held_point) > 0;
    trial_result = pid < 0 ? 1 : wait_grandchild(pid);
    return NULL;
}

/* Before every constructor, lull's too (.preinit_array, which only an
 * executable has): the thread that forks. */
static void trial_start(int argc, char **argv, char **envp) {
    (void)argc;
    (void)argv;
    /* environ is not set yet: the loader passes the environment */
    const char *at = NULL;
    for (char **e = envp; *e && !at; e++)
        if (strncmp(*e, "LULL_TEST_FORK_AT_START=", 24) == 0) at = *e + 24;
    if (!at) return;
    held_point = strcmp(at, "core") == 0 ? LULL_RACE_CORE_INIT : LULL_RACE_MODULE_START;
    lull_race_arm(1u << held_point, (uint64_t)getpid(), HOLD_US);
    if (pthread_create(&forker, NULL, fork_during_start, NULL) != 0) _exit(4);
}

__attribute__((section(".preinit_array"),
               used)) static void (*const run_trial_start)(int, char **, char **) = trial_start;

/* After lull's constructor (101), which put the start off: the first
 * allocation starts lull, held at module_start. */
__attribute__((constructor(102))) static void trial_end(void) {
    if (!getenv("LULL_TEST_FORK_AT_START")) return;
    void *first = lull_malloc(16);
    atomic_store(&lull_started, true);
    lull_free(first);
    pthread_join(forker, NULL);
    printf("held=%d\nresult=%d\n", trial_held, trial_result);
    fflush(stdout);
    _exit(0);
}

/* Trials with LULL_TEST_FORK_AT_START=at until HELD_TRIALS forked inside the
 * held window; every grandchild must allocate and exit. */
static void fork_at_start(const char *at) {
    int held = 0, trials = 0;
    char var[64];
    snprintf(var, sizeof var, "LULL_TEST_FORK_AT_START=%s", at);
    const char *vars[] = {var, NULL};
    while (held < HELD_TRIALS && trials < MAX_TRIALS) {
        child_run cr;
        reexec_run("test_race_start_trial", vars, "fork at start", 60000, &cr);
        reexec_assert_exited_0(&cr, "fork at start");
        trials++;
        uint64_t result = reexec_field(&cr, "result");
        cr_assert_eq(result, 0,
                     "trial %d: the child forked during the start %s (held %llu)\nstderr:\n%s",
                     trials, result == 2 ? "hung" : "failed",
                     (unsigned long long)reexec_field(&cr, "held"), cr.err);
        held += (int)reexec_field(&cr, "held");
    }
    cr_log_info("%d of %d trials forked inside a held start", held, trials);
    cr_assert_geq(held, HELD_TRIALS, "only %d of %d trials forked inside the start", held, trials);
}

Test(race_start, fork_while_another_thread_starts_lull, .timeout = 600) {
    fork_at_start("modules");
}

/* The core's initialisation (init_state 1, src/init.c) before the modules'
 * start: a child copied inside it waited for ever at its first malloc. */
Test(race_start, fork_while_another_thread_initialises_the_core, .timeout = 600) {
    fork_at_start("core");
}
