/* Decimal digits without printf: the paths lull builds at start-up (sysfs,
 * /proc) and the counter page's name, in code that must not fault in
 * printf's pages or call malloc. */
#ifndef LULL_DECIMAL_H
#define LULL_DECIMAL_H

#include <stddef.h>
#include <stdint.h>

/* The digits of v into buf (at least 21 bytes), NUL-terminated; returns
 * their count. */
static inline size_t lull_format_u64(char *buf, uint64_t v) {
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
    return n;
}

#endif
