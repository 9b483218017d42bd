/* Which descriptors a process has open, before and after something that
 * may leave one behind (a fork child copied inside an open). */
#ifndef TESTS_SUPPORT_FD_SNAPSHOT_H
#define TESTS_SUPPORT_FD_SNAPSHOT_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FD_SNAPSHOT_MAX 1024

/* set[fd] = 1 for each descriptor open now (below FD_SNAPSHOT_MAX), but
 * the one this reads /proc/self/fd with. */
static inline void fd_snapshot(unsigned char set[FD_SNAPSHOT_MAX]) {
    memset(set, 0, FD_SNAPSHOT_MAX);
    DIR *d = opendir("/proc/self/fd");
    if (!d) return;
    int own = dirfd(d);
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd != own && fd >= 0 && fd < FD_SNAPSHOT_MAX) set[fd] = 1;
    }
    closedir(d);
}

/* The first descriptor open now that `before` did not have, its file in
 * target ("?" if unknown); -1 if none. */
static inline int fd_new_since(const unsigned char *before, char *target, size_t len) {
    unsigned char now[FD_SNAPSHOT_MAX];
    fd_snapshot(now);
    for (int fd = 0; fd < FD_SNAPSHOT_MAX; fd++)
        if (now[fd] && !before[fd]) {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t n = readlink(link, target, len - 1);
            if (n > 0)
                target[n] = '\0';
            else
                snprintf(target, len, "?");
            return fd;
        }
    return -1;
}

#endif
