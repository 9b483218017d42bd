/* See pprof_run.h. */
#define _GNU_SOURCE
#include "tests/support/pprof_run.h"
#include "tests/support/command_output.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void pprof_env(const char *dir) {
    setenv("HOME", dir, 1);
    setenv("GOCACHE", dir, 1);
    setenv("GOPATH", dir, 1);
    setenv("PPROF_TMPDIR", dir, 1);
    setenv("PPROF_BINARY_PATH", dir, 1);
    setenv("GOTOOLCHAIN", "local", 1); /* newer go: never fetch another toolchain */
    setenv("GOPROXY", "off", 1);
}

char *pprof_run(const char *args, const char *binary, const char *profile) {
    if (system("command -v go >/dev/null 2>&1") != 0)
        cr_assert_fail("go is not on PATH: these tests read the profile with `go tool pprof` "
                       "(install golang-go; tests/install-deps.sh does)");
    char cmd[3 * PATH_MAX];
    snprintf(cmd, sizeof cmd, "go tool pprof %s '%s' '%s' 2>&1", args, binary, profile);
    int status;
    char *buf = command_output(cmd, &status);
    cr_assert_eq(status, 0, "%s: exit status %d\n%s", cmd, status, buf);
    return buf;
}
