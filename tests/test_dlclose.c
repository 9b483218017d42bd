/* liblull.so loaded with dlopen and closed again (a plugin that links
 * -llull, unloaded by its host) stays loaded: its reclaim thread runs on
 * and cannot be stopped from outside. Before, dlclose unmapped the library
 * under that thread, and the process died of SIGSEGV at its next tick. */
#define _GNU_SOURCE
#include "tests/support/command_output.h"

#include <criterion/criterion.h>

#include <stdlib.h>
#include <sys/wait.h>

#ifndef DLCLOSE_LULL_PATH
#error "DLCLOSE_LULL_PATH (tests/programs/dlclose_lull.c's program) must be defined"
#endif

Test(dlclose, a_closed_library_stays_and_its_reclaim_thread_runs_on, .timeout = 120) {
#ifdef LULL_SANITIZED
    cr_skip_test("a sanitized liblull.so cannot be dlopened by a program without the runtime");
#endif
    int status;
    char *out = command_output("env -u LD_PRELOAD LULL_COUNTER_PAGE=off '" DLCLOSE_LULL_PATH
                               "' '" LULL_SO_PATH "'",
                               &status);
    cr_assert_neq(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 4,
                  "no reclaim thread started in the program: nothing was tested");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "prog_dlclose_lull: %s %d (exit 3: dlclose unloaded liblull.so under its reclaim "
              "thread)",
              WIFSIGNALED(status) ? "killed by signal" : "exit",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    cr_assert_str_eq(out, "OK\n");
    free(out);
}
