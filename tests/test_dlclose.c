/* liblull.so loaded with dlopen and closed again (a plugin that links
 * -llull, unloaded by its host) stays loaded: its reclaim thread runs on
 * and cannot be stopped from outside. Before, dlclose unmapped the library
 * under that thread, and the process died of SIGSEGV at its next tick. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef DLCLOSE_LULL_PATH
#error "DLCLOSE_LULL_PATH (tests/programs/dlclose_lull.c's program) must be defined"
#endif

Test(dlclose, a_closed_library_stays_and_its_reclaim_thread_runs_on, .timeout = 120) {
#ifdef LULL_SANITIZED
    cr_skip_test("a sanitized liblull.so cannot be dlopened by a program without the runtime");
#endif
    int pipefd[2];
    cr_assert_eq(pipe2(pipefd, O_CLOEXEC), 0, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(pipefd[1], 1);
        setenv("LULL_COUNTER_PAGE", "off", 1);
        unsetenv("LD_PRELOAD");
        execl(DLCLOSE_LULL_PATH, DLCLOSE_LULL_PATH, LULL_SO_PATH, (char *)NULL);
        _exit(127);
    }
    close(pipefd[1]);
    char out[64] = {0};
    ssize_t got = 0, n;
    while ((n = read(pipefd[0], out + got, sizeof out - 1 - (size_t)got)) > 0)
        got += n;
    close(pipefd[0]);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert_neq(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 4,
                  "no reclaim thread started in the program: nothing was tested");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "prog_dlclose_lull: %s %d (exit 3: dlclose unloaded liblull.so under its reclaim "
              "thread)",
              WIFSIGNALED(status) ? "killed by signal" : "exit",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    cr_assert_str_eq(out, "OK\n");
}
