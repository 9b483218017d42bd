/* fork while other threads take heap profile samples: each sample walks
 * its stack under the stack-walk cache's lock (src/profile_stack.c), and
 * a fork that copied the lock held left the child's first sample waiting
 * for ever (session 22's review: a child hung within 3-35 forks). The
 * scenario runs in a process of its own with profiling on
 * (tests/support/reexec.h): two threads allocate through deep stacks
 * while main forks FORKS times, and each child samples too and exits. The
 * parent gives each child 10 s, which it takes milliseconds of. */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define FORKS 300

static atomic_int stop;

__attribute__((noinline)) static void *deep(int n) {
    if (n) {
        void *p = deep(n - 1);
        __asm__ volatile("" ::: "memory"); /* no tail call: a frame each */
        return p;
    }
    return lull_malloc(64);
}

static void *sampler(void *arg) {
    while (!atomic_load(&stop))
        lull_free(deep(20));
    return arg;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* 1: the child exited 0; 0: it hung (killed) or failed */
static int child_ends(pid_t pid) {
    int status;
    for (double end = now_s() + 10; now_s() < end;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        usleep(1000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return 0;
}

__attribute__((constructor(200))) static void scenario(void) {
    if (!getenv("LULL_TEST_PROFILE_FORK")) return;
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, sampler, NULL)) _exit(3);
    int done = 0;
    for (; done < FORKS; done++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) _exit(4);
        if (pid == 0) {
            for (int k = 0; k < 2000; k++)
                lull_free(deep(5));
            _exit(0);
        }
        if (!child_ends(pid)) break;
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("forks_done=%d\n", done);
    fflush(stdout);
    _exit(0);
}

Test(profile_fork, children_of_a_sampling_process_sample_too) {
#ifdef LULL_SANITIZED
    /* a sanitizer's own allocator, which libc and libgcc use there, is not
     * fork-safe with other threads allocating: the child's first
     * allocation through it (pthread_create's, starting the reclaim
     * thread) waited on its lock, copied held (seen under ASan) */
    cr_skip_test("the sanitizer's allocator is not fork-safe with threads allocating");
#endif
    child_run cr;
    const char *vars[] = {"LULL_TEST_PROFILE_FORK=1", "LULL_CONF=profile_sample_kb=1", NULL};
    reexec_run("test_profile_fork_scenario", vars, "fork while sampling", 300000, &cr);
    reexec_assert_exited_0(&cr, "fork while sampling");
    cr_assert_eq(reexec_field(&cr, "forks_done"), FORKS,
                 "a child hung (or failed) at fork %llu of %d:\n%s",
                 (unsigned long long)reexec_field(&cr, "forks_done"), FORKS, cr.out);
}
