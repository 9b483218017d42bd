/* Reading a program's text output in tests: header-only (static inline),
 * no Criterion, so re-executed children can use it too. */
#ifndef LULL_TEST_TEXT_LINES_H
#define LULL_TEST_TEXT_LINES_H

#include <stdio.h>
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

/* The value of the line "key=value" of text into buf (cut to len - 1
 * bytes; "" when there is none). */
static inline const char *text_field(const char *text, const char *key, char *buf, size_t len) {
    size_t kl = strlen(key);
    buf[0] = '\0';
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, key, kl) == 0 && l[kl] == '=') {
            size_t n = strcspn(l + kl + 1, "\n");
            snprintf(buf, len, "%.*s", (int)(n < len ? n : len - 1), l + kl + 1);
            break;
        }
    return buf;
}

#endif
