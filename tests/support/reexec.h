/* Running the test program itself again, in a new process: for scenarios
 * whose configuration lull reads once at start (LULL_CONF, LULL_FAULT, ...).
 *
 * The test program has a constructor that looks for a variable of its own
 * (LULL_TEST_REFAULT, LULL_TEST_WARM, ...): when it is set, the constructor
 * runs the scenario before Criterion starts, prints its figures to stdout
 * as key=value lines and _exits. reexec_run() starts /proc/self/exe with the
 * parent's environment minus every LULL_* variable, plus LULL_COUNTER_PAGE=off
 * and the caller's variables, and collects its stdout, stderr and exit
 * status.
 *
 * Both functions fail the calling Criterion test (cr_assert) on error. */
#ifndef LULL_TEST_REEXEC_H
#define LULL_TEST_REEXEC_H

#include <stdint.h>

typedef struct {
    char out[4096]; /* the child's stdout (NUL-terminated; cut at 4095 bytes) */
    char err[4096]; /* its stderr, the same way */
    int status;     /* its wait status */
} child_run;

/* Runs /proc/self/exe as argv0 with `vars` (NULL-terminated "NAME=value"
 * strings, up to 8) added to the environment; kills it and fails the test
 * after timeout_ms. `label` names the scenario in the messages and the
 * test's log. The exit status is left to the caller to judge. */
void reexec_run(const char *argv0, const char *const *vars, const char *label, uint64_t timeout_ms,
                child_run *cr);

/* Fails the test unless the child exited with status 0; the message gives
 * the label, the status and the child's stdout and stderr. */
void reexec_assert_exited_0(const child_run *cr, const char *label);

/* The value of the line "key=value" of the child's output (the test fails
 * when there is none). */
uint64_t reexec_field(const child_run *cr, const char *key);

#endif
