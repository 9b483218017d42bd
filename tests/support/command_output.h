/* A shell command's output, whole: for the tests that read what a tool
 * prints (nm, readelf, go tool pprof). */
#ifndef LULL_TEST_COMMAND_OUTPUT_H
#define LULL_TEST_COMMAND_OUTPUT_H

/* The stdout of `cmd` (popen; malloc'd, NUL-terminated), and its wait
 * status in *status. Fails the test if the command cannot be started. */
char *command_output(const char *cmd, int *status);

#endif
