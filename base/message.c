/* Allocation-free reporting; see message.h. */
#include "base/message.h"
#include "base/no_cancel.h"

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
    /* write(2) is a cancellation point, and a message may come with a
     * lock held (numa_segment_prepare: the arena's) */
    int cancel = lull_cancel_off();
    ssize_t w = write(STDERR_FILENO, buf, len);
    lull_cancel_restore(cancel);
    (void)w;
}

void lull_message(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    write_message(fmt, ap);
    va_end(ap);
}

/* config.c sets it with the `verbose` key: messages know nothing of the
 * configuration */
static bool verbose_on;

void lull_message_set_verbose(bool on) {
    __atomic_store_n(&verbose_on, on, __ATOMIC_RELAXED);
}

void lull_verbose(const char *fmt, ...) {
    if (!__atomic_load_n(&verbose_on, __ATOMIC_RELAXED)) return;
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
