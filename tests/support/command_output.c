/* See command_output.h. */
#include "tests/support/command_output.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *command_output(const char *cmd, int *status) {
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "popen %s: %s", cmd, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    for (size_t n; (n = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
        len += n;
        if (len + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[len] = 0;
    *status = pclose(f);
    return buf;
}
