/* Sub-checks: a part of a check run in a fresh process of this program
 * (see guest.h). The check's process forks and re-executes /proc/self/exe
 * as "/init lull-sub NAME FD" with the environment it was given; the
 * constructor below runs the sub-check there before main and exits with its
 * result. Lines on FD: "I text" an INFO line, "D text" the detail; any
 * other line (the sub-process's stderr goes to FD too) is relayed as an
 * INFO line as it is. Needs nothing of lull: the same machinery serves the
 * numa/-only build. */
#define _GNU_SOURCE
#include "guest.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Weak: a program none of whose files registers a sub-check has no such
 * section, and the linker then defines neither symbol. */
extern const struct guest_sub __start_guest_subs[] __attribute__((weak));
extern const struct guest_sub __stop_guest_subs[] __attribute__((weak));

static int out_fd = -1; /* in a sub-process: the pipe to the check's process */

static const struct guest_sub *sub_named(const char *name) {
    for (const struct guest_sub *s = __start_guest_subs; s && s < __stop_guest_subs; s++)
        if (strcmp(s->name, name) == 0) return s;
    return NULL;
}

static void say(char tag, const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf + 2, sizeof buf - 3, fmt, ap);
    for (char *c = buf + 2; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
    if (out_fd < 0) {
        if (tag == 'I')
            guest_info("%s", buf + 2);
        else
            guest_detail("%s", buf + 2);
        return;
    }
    /* One write(2), no stdio: dprintf mallocs a buffer, and a sub-check
     * that measures lull's heap must not change it by reporting. */
    buf[0] = tag;
    buf[1] = ' ';
    size_t n = strlen(buf);
    buf[n++] = '\n';
    ssize_t w = write(out_fd, buf, n);
    (void)w;
}

void guest_sub_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say('I', fmt, ap);
    va_end(ap);
}

void guest_sub_detail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    say('D', fmt, ap);
    va_end(ap);
}

/* In the re-executed program, before main: run the sub-check, exit. */
__attribute__((constructor(1000))) static void sub_entry(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc != 4 || strcmp(argv[1], "lull-sub") != 0) return;
    out_fd = atoi(argv[3]);
    const struct guest_sub *sub = sub_named(argv[2]);
    if (!sub) {
        guest_sub_detail("no sub-check %s", argv[2]);
        _exit(GUEST_FAIL);
    }
    int r = sub->run();
    _exit(r == GUEST_PASS || r == GUEST_SKIP ? r : GUEST_FAIL);
}

static void relay(char *line, char *detail, size_t len) {
    if (line[0] == 'I' && line[1] == ' ')
        guest_info("%s", line + 2);
    else if (line[0] == 'D' && line[1] == ' ')
        snprintf(detail, len, "%s", line + 2);
    else if (line[0])
        guest_info("%s", line); /* the sub-process's stderr */
}

int guest_sub_run(const char *name, const char *const *env) {
    if (!sub_named(name)) {
        guest_detail("no sub-check %s", name);
        return GUEST_FAIL;
    }
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        guest_detail("pipe: %s", strerror(errno));
        return GUEST_FAIL;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        guest_detail("fork: %s", strerror(errno));
        return GUEST_FAIL;
    }
    if (pid == 0) {
        /* Dies with the check's process (its time limit kills it). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char fd[16];
        snprintf(fd, sizeof fd, "%d", dup(fds[1])); /* the dup has no O_CLOEXEC */
        dup2(fds[1], 2);                            /* stderr too (dup2 clears O_CLOEXEC) */
        char *argv[] = {"/init", "lull-sub", (char *)name, fd, NULL};
        char *none[] = {NULL};
        char **envp = env ? (char **)env : none;
        execve("/proc/self/exe", argv, envp);
        execve("/init", argv, envp);
        _exit(126);
    }
    close(fds[1]);
    char buf[8192], detail[1024] = "";
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fds[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            relay(line, detail, sizeof detail);
            line = nl + 1;
        }
        have = strlen(line);
        memmove(buf, line, have);
        if (have == sizeof buf - 1) have = 0; /* a line too long: drop it */
    }
    if (have) {
        buf[have] = '\0';
        relay(buf, detail, sizeof detail);
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(st) && (WEXITSTATUS(st) == GUEST_PASS || WEXITSTATUS(st) == GUEST_SKIP)) {
        guest_detail("%s", detail);
        return WEXITSTATUS(st);
    }
    if (WIFSIGNALED(st))
        guest_detail("sub-process died of signal %d (%s); last: %s", WTERMSIG(st),
                     strsignal(WTERMSIG(st)), detail);
    else if (WEXITSTATUS(st) == 126)
        guest_detail("cannot execute /proc/self/exe or /init");
    else
        guest_detail("%s", detail[0] ? detail : "failed without a detail");
    return GUEST_FAIL;
}
