/* Allocation-free reporting; see message.h. */
#include "src/message.h"
#include "src/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void write_message(const char *fmt, va_list ap) {
    char buf[512];
    int n = snprintf(buf, sizeof buf, "lull: ");
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    if (m < 0) m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof buf - 2) len = sizeof buf - 2;
    buf[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, buf, len);
    (void)w;
}

void lull_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_message(fmt, ap);
    va_end(ap);
}

void lull_verbose(const char *fmt, ...) {
    if (!__atomic_load_n(&lull_config.verbose, __ATOMIC_RELAXED)) return;
    va_list ap;
    va_start(ap, fmt);
    write_message(fmt, ap);
    va_end(ap);
}

void lull_fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_message(fmt, ap);
    va_end(ap);
    abort();
}
