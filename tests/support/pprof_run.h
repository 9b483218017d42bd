/* Reading profiles back with `go tool pprof`, for the tests of the pprof
 * encoder and of the heap profile. go is required (CI installs golang-go,
 * tests/install-deps.sh): without it a test fails with a message. */
#ifndef LULL_TEST_PPROF_RUN_H
#define LULL_TEST_PPROF_RUN_H

/* Point go's home, caches and pprof's temporary files at `dir` (an
 * existing directory), and keep go off the network. */
void pprof_env(const char *dir);
/* `go tool pprof ARGS BINARY PROFILE`'s output (malloc'd); fails the test
 * unless it exits 0. */
char *pprof_run(const char *args, const char *binary, const char *profile);

#endif
