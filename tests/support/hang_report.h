/* What a hung child process is doing, for the test's log before it is
 * killed: each thread's name, state, system call and kernel stack from
 * /proc, and a backtrace of every thread if gdb is installed. A hang in CI
 * happens once in many runs; without this it leaves nothing to go on. */
#ifndef LULL_TEST_HANG_REPORT_H
#define LULL_TEST_HANG_REPORT_H

#include <stdio.h>
#include <sys/types.h>

/* Writes the report on `out` (the child must still be alive). */
void hang_report(pid_t pid, FILE *out);

#endif
