/* Reading a program's text output in tests: header-only (static inline),
 * no Criterion, so re-executed children can use it too. */
#ifndef LULL_TEST_TEXT_LINES_H
#define LULL_TEST_TEXT_LINES_H

#include <string.h>

/* The number of lines of s that contain `what`. */
static inline int count_lines_with(const char *s, const char *what) {
    int n = 0;
    for (const char *l = s; *l;) {
        const char *eol = strchr(l, '\n');
        size_t len = eol ? (size_t)(eol - l) : strlen(l);
        const char *hit = strstr(l, what);
        if (hit && hit < l + len) n++;
        l += len + (eol != NULL);
    }
    return n;
}

#endif
