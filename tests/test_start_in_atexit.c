/* lull starts at a process's first allocation, and that allocation may be
 * the C library's own, made while it holds one of its locks: glibc's 33rd
 * atexit registration callocs a block of handlers holding
 * __exit_funcs_lock. The modules' start then registered the counter
 * page's quick_exit handler with at_quick_exit, which takes the same lock
 * (not recursive): the process hung in its first malloc, for ever. Run
 * with tests/programs/atexit_first.c under LD_PRELOAD=liblull.so, whose
 * first allocation is that calloc.
 *
 * The 60 s bound is a guard against that hang only: the program takes
 * milliseconds. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LULL_SO_PATH
#error "LULL_SO_PATH (the path of liblull.so) must be defined"
#endif
#ifndef ATEXIT_FIRST_PATH
#error "ATEXIT_FIRST_PATH (the path of tests/programs/atexit_first.c's program) must be defined"
#endif

#define GUARD_S 60

static int64_t mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Runs prog under the preload (LULL_COUNTER_PAGE=off: nothing left in
 * /dev/shm); its stdout in out. Returns the wait status, or -1 when the
 * guard ran out (the program is killed then). */
static int run_preloaded(const char *prog, char *out, size_t len) {
    int pipefd[2];
    cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(pipefd[1], 1);
        setenv("LD_PRELOAD", LULL_SO_PATH, 1);
        setenv("LULL_COUNTER_PAGE", "off", 1);
        execl(prog, prog, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    size_t n = 0;
    int64_t until = mono_ms() + GUARD_S * 1000;
    bool timed_out = false;
    for (;;) {
        int64_t left = until - mono_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
        int r = poll(&p, 1, (int)left);
        if (r < 0 && errno == EINTR) continue;
        cr_assert_geq(r, 0, "poll: %s", strerror(errno));
        if (r == 0) continue;
        ssize_t got = read(pipefd[0], out + n, len - 1 - n);
        if (got <= 0) break; /* end of file: the program has ended */
        n += (size_t)got;
        if (n == len - 1) break;
    }
    out[n] = 0;
    close(pipefd[0]);
    if (timed_out) kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid, "waitpid: %s", strerror(errno));
    return timed_out ? -1 : status;
}

Test(start_in_atexit, the_first_allocation_inside_atexit_does_not_hang) {
#if !defined(LULL_OVERRIDE) || defined(LULL_SANITIZED)
    cr_skip_test("this build's liblull.so does not replace malloc (LULL_OVERRIDE off or a "
                 "sanitizer build)");
#endif
    const char *prog = ATEXIT_FIRST_PATH;
    char out[256];
    cr_assert_eq(access(prog, X_OK), 0, "%s: %s", prog, strerror(errno));
    int status = run_preloaded(prog, out, sizeof out);
    cr_assert_neq(status, -1,
                  "prog_atexit_first under the preload hung (killed after %d s): its first "
                  "allocation, inside atexit, waits for the exit-handler lock it holds",
                  GUARD_S);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "prog_atexit_first: status %#x, not exit 0 (3: not every atexit handler ran)",
              status);
    cr_assert_str_eq(out, "allocated\n");
}
