/* Running the test program itself again: see reexec.h. */
#define _GNU_SOURCE
#include "reexec.h"
#include "hang_report.h"
#include "timing.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REEXEC_MAX_ENV 512
#define REEXEC_MAX_VARS 8

extern char **environ;

void reexec_run(const char *argv0, const char *const *vars, const char *label, uint64_t timeout_ms,
                child_run *cr) {
    static char *envp[REEXEC_MAX_ENV];
    size_t n = 0;
    for (char **e = environ; *e && n < REEXEC_MAX_ENV - REEXEC_MAX_VARS - 2; e++)
        if (strncmp(*e, "LULL_", 5) != 0) envp[n++] = *e;
    envp[n++] = "LULL_COUNTER_PAGE=off";
    for (size_t i = 0; vars && vars[i]; i++) {
        cr_assert_lt(i, REEXEC_MAX_VARS, "more than %d variables for %s", REEXEC_MAX_VARS, label);
        envp[n++] = (char *)vars[i];
    }
    envp[n] = NULL;

    int o[2], e[2];
    cr_assert_eq(pipe(o), 0);
    cr_assert_eq(pipe(e), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(o[1], STDOUT_FILENO);
        dup2(e[1], STDERR_FILENO);
        close(o[0]), close(o[1]), close(e[0]), close(e[1]);
        char *const argv[] = {(char *)argv0, NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(o[1]);
    close(e[1]);
    /* both pipes at once: a child that fills one while we wait on the
     * other would never finish */
    struct {
        int fd;
        char *buf;
        size_t len, cap;
    } in[2] = {{o[0], cr->out, 0, sizeof cr->out}, {e[0], cr->err, 0, sizeof cr->err}};
    uint64_t until = now_ms() + timeout_ms;
    while (in[0].fd >= 0 || in[1].fd >= 0) {
        struct pollfd p[2] = {{in[0].fd, POLLIN, 0}, {in[1].fd, POLLIN, 0}};
        uint64_t now = now_ms();
        int left = (int)(until > now ? until - now : 0);
        if (left == 0 || poll(p, 2, left) == 0) {
            hang_report(pid, stderr);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            cr_assert_fail("scenario %s timed out; output so far:\n%.*s", label, (int)in[0].len,
                           cr->out);
        }
        for (int i = 0; i < 2; i++) {
            if (in[i].fd < 0 || !p[i].revents) continue;
            char spill[256]; /* read past a full buffer, so the child is not blocked */
            bool full = in[i].len == in[i].cap - 1;
            ssize_t k = full ? read(in[i].fd, spill, sizeof spill)
                             : read(in[i].fd, in[i].buf + in[i].len, in[i].cap - 1 - in[i].len);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                close(in[i].fd);
                in[i].fd = -1;
            } else if (!full) {
                in[i].len += (size_t)k;
            }
        }
    }
    cr->out[in[0].len] = 0;
    cr->err[in[1].len] = 0;
    cr_assert_eq(waitpid(pid, &cr->status, 0), pid);
    cr_log_info("scenario %s:\n%s", label, cr->out);
}

void reexec_assert_exited_0(const child_run *cr, const char *label) {
    cr_assert(WIFEXITED(cr->status) && WEXITSTATUS(cr->status) == 0,
              "%s: the child exited with status %#x\nstdout:\n%s\nstderr:\n%s", label, cr->status,
              cr->out, cr->err);
}

uint64_t reexec_field(const child_run *cr, const char *key) {
    size_t kl = strlen(key);
    for (const char *l = cr->out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, kl) == 0 && l[kl] == '=') return strtoull(l + kl + 1, NULL, 10);
    cr_assert_fail("no %s in the scenario's output:\n%s", key, cr->out);
    return 0;
}
