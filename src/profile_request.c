/* Serving heap profile requests (include/lull/counters.h, "Requests").
 *
 * lullstat --heap-profile raises the request word of the counter page; the
 * reclaim thread, which alone writes the page, sees it at its next tick
 * (src/stats_publish.c), writes the profile with lull_profile_dump() into
 * LULL_COUNTERS_SHM_DIR/<page name>.heap and answers with a status.
 *
 * Invariant: lull writes a profile only into a file it has just created
 * itself (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600) in a directory where no
 * other user can remove or replace it (sticky, or writable by no one else),
 * so the file lull_profile_dump() renames over the path (a new one of its
 * own, created exclusively next to it) replaces that file. What
 * lull finds at the name first is removed only when it is a regular file of
 * lull's own user (unlink removes a name: a hard link to another file of
 * ours loses only that name); anything else (a symbolic link, a FIFO,
 * another user's file) is left alone and the request fails with EEXIST.
 * The request word is compared for inequality, never used otherwise: no
 * value of it can do more than ask for one profile.
 *
 * Runs on the reclaim thread between its steps, for as long as the dump
 * takes; request threads never take part. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "src/profile_request.h"
#include "lull.h"
#include "base/message.h"
#include "src/counter_page.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* May another user remove or rename files in dir? Then no file lull makes
 * there is safe from being swapped before the dump opens it. */
static int dir_unsafe(int dir) {
    struct stat st;
    if (fstat(dir, &st) != 0) return errno;
    bool shared = (st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX);
    bool foreign_owner = st.st_uid != 0 && st.st_uid != geteuid();
    return shared || foreign_owner ? EPERM : 0;
}

/* Create the file, exclusively; a stale regular file of ours at the name
 * goes first. The open descriptor, or -errno. */
static int create_own(int dir, const char *file) {
    for (int attempt = 0; attempt < 3; attempt++) {
        int fd = openat(dir, file, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            /* 0600 whatever the umask: the dump opens it for writing */
            if (fchmod(fd, 0600) != 0) {
                int e = errno;
                close(fd);
                unlinkat(dir, file, 0);
                return -e;
            }
            return fd;
        }
        if (errno != EEXIST) return -errno;
        struct stat st;
        if (fstatat(dir, file, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) continue; /* gone meanwhile */
            return -errno;
        }
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
            lull_verbose("heap profile request: %s/%s exists and is not a file of this user: "
                         "leaving it alone",
                         LULL_COUNTERS_SHM_DIR, file);
            return -EEXIST;
        }
        if (unlinkat(dir, file, 0) != 0 && errno != ENOENT) return -errno;
    }
    return -EEXIST;
}

/* Write the profile file: 0, or an errno. */
static int write_profile(void) {
    char file[NAME_MAX + 1];
    int err = counter_page_profile_file(file, sizeof file);
    if (err) return -err;
    char path[sizeof LULL_COUNTERS_SHM_DIR + sizeof file];
    size_t d = sizeof LULL_COUNTERS_SHM_DIR - 1;
    memcpy(path, LULL_COUNTERS_SHM_DIR, d);
    path[d] = '/';
    memcpy(path + d + 1, file, strlen(file) + 1);

    int dir = open(LULL_COUNTERS_SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return errno;
    err = dir_unsafe(dir);
    int fd = err ? -err : create_own(dir, file);
    if (fd < 0) {
        close(dir);
        return -fd;
    }
    close(fd);
    errno = 0;
    if (lull_profile_dump(path) != 0) {
        err = errno ? errno : EIO;
        unlinkat(dir, file, 0); /* ours: created above, in a directory only we change */
    }
    close(dir);
    return err;
}

void profile_request_serve(void) {
    uint64_t req;
    if (!counter_page_take_request(&req)) return;
    int status = write_profile();
    if (status) {
        const char *d = strerrordesc_np(status); /* never allocates (strerror may) */
        lull_verbose("heap profile request: %s", d ? d : "unknown error");
    }
    counter_page_answer(req, status);
}
