/* See pprof_run.h. */
#define _GNU_SOURCE
#include "tests/support/pprof_run.h"

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
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "popen %s: %s", cmd, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (size_t n; (n = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += n;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    int status = pclose(f);
    cr_assert_eq(status, 0, "%s: exit status %d\n%s", cmd, status, buf);
    return buf;
}
