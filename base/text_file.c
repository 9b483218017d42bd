/* Small kernel text files; see text_file.h. */
#include "base/text_file.h"
#include "base/no_cancel.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

static int read_text_file(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = -errno;
            close(fd);
            return e;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    return (int)got;
}

/* open, read and close are cancellation points: a cancelled caller would
 * leave the descriptor open (and the start of the NUMA module half done) */
int lull_read_text_file(const char *path, char *buf, size_t size) {
    int cancel = lull_cancel_off();
    int r = read_text_file(path, buf, size);
    lull_cancel_restore(cancel);
    return r;
}

const char *lull_parse_ulong(const char *s, unsigned long *out) {
    unsigned long v = 0;
    if (*s < '0' || *s > '9') return NULL;
    while (*s >= '0' && *s <= '9') {
        unsigned long d = (unsigned long)(*s - '0');
        /* past ULONG_MAX it stays there: wrapped, 2^64 + 1 read as 1 */
        v = v > (ULONG_MAX - d) / 10 ? ULONG_MAX : v * 10 + d;
        s++;
    }
    *out = v;
    return s;
}

uint64_t lull_meminfo_bytes(const char *text, const char *key) {
    const char *p = strstr(text, key);
    if (!p) return 0;
    p += strlen(key);
    while (*p == ' ' || *p == ':' || *p == '\t')
        p++;
    unsigned long kb;
    if (!lull_parse_ulong(p, &kb)) return 0;
    return kb > UINT64_MAX / 1024 ? UINT64_MAX : (uint64_t)kb * 1024;
}
