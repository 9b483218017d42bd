/* See fork_capture.h. */
#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void read_all_fd(int fd, char *buf, size_t cap, size_t *len) {
    *len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + *len, cap - 1 - *len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        *len += (size_t)n;
        if (*len == cap - 1) break;
    }
    buf[*len] = 0;
}

void run_in_child(void (*fn)(void *), void *arg, child_result *r) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        close(fds[1]);
        close(saved);
        fn(arg);
        _exit(0);
    }
    dup2(saved, STDERR_FILENO);
    close(saved);
    cr_assert_geq(pid, 0);
    close(fds[1]);
    read_all_fd(fds[0], r->err, sizeof r->err, &r->err_len);
    close(fds[0]);
    cr_assert_eq(waitpid(pid, &r->status, 0), pid);
}

void expect_abort(const child_result *r, const void *addr, const char *word) {
    char where[32];
    snprintf(where, sizeof where, "%p", addr);
    if (WIFEXITED(r->status))
        cr_assert_fail("the child returned from the bad operation (exit %d); stderr: '%s'",
                       WEXITSTATUS(r->status), r->err);
    cr_assert(WIFSIGNALED(r->status));
    cr_assert_eq(WTERMSIG(r->status), SIGABRT, "killed by signal %d, not SIGABRT; stderr: '%s'",
                 WTERMSIG(r->status), r->err);
    cr_assert_not_null(strstr(r->err, "lull"), "stderr: '%s'", r->err);
    cr_assert_not_null(strstr(r->err, where), "address %s not in '%s'", where, r->err);
    cr_assert_not_null(strstr(r->err, word), "'%s' not in '%s'", word, r->err);
}
