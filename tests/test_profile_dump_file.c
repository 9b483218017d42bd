/* lull_profile_dump(path) and the file at path: the profile goes into a
 * new file next to it, renamed over it, so that a dump that fails (here:
 * RLIMIT_FSIZE, with SIGXFSZ ignored, as a full disk would) leaves the
 * profile path held before, where an open with O_TRUNC left the first
 * bytes of the new one; and so that a hard link at path loses only its
 * name there (its other file kept, the profile mode 0600). No file of
 * the dump's own is left in the directory either way. */
#define _GNU_SOURCE
#include "lull.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

const char *lull_conf = "profile_sample_kb=512";

#define MiB ((size_t)1 << 20)

static char dir[] = "/tmp/lull-profile-dump-file-XXXXXX";
static char path[sizeof dir + 32];

static void make_dir(void) {
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/heap.pb.gz", dir);
    /* a sampled block (8 MiB at 512 KiB: sampled all but surely), so that
     * the profile has a sample in it */
    void *p = lull_malloc(8 * MiB);
    cr_assert_not_null(p);
    __asm__ volatile("" ::"r"(p) : "memory");
}

static void remove_dir(void) {
    char cmd[sizeof dir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("%s failed", cmd);
}

TestSuite(profile_dump_file, .init = make_dir, .fini = remove_dir);

/* The whole of file into buf (at most cap bytes): its length. */
static size_t read_all(const char *file, char *buf, size_t cap) {
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", file, strerror(errno));
    size_t len = 0;
    for (ssize_t n; (n = read(fd, buf + len, cap - len)) > 0;)
        len += (size_t)n;
    close(fd);
    cr_assert_lt(len, cap, "%s is larger than the test's buffer", file);
    return len;
}

/* The names in dir, but . and .., one line each. */
static void names_in_dir(char *out, size_t cap) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    size_t len = 0;
    out[0] = '\0';
    for (struct dirent *de; (de = readdir(d));)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            len += (size_t)snprintf(out + len, cap - len, "%s\n", de->d_name);
    closedir(d);
}

Test(profile_dump_file, a_failed_dump_leaves_the_earlier_profile) {
    static char before[1 << 16], after[1 << 16];
    cr_assert_eq(lull_profile_dump(path), 0, "lull_profile_dump: %s", strerror(errno));
    size_t len = read_all(path, before, sizeof before);
    cr_assert_gt(len, 64, "a profile of %zu bytes", len);

    struct rlimit was;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
    struct rlimit small = {.rlim_cur = 64, .rlim_max = was.rlim_max};
    void (*was_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0, "setrlimit: %s", strerror(errno));
    errno = 0;
    int rc = lull_profile_dump(path);
    int err = errno;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &was), 0);
    signal(SIGXFSZ, was_handler);

    cr_assert_eq(rc, -1, "a dump past RLIMIT_FSIZE succeeded");
    cr_expect_eq(err, EFBIG, "errno %d (%s), not EFBIG", err, strerror(err));
    size_t now = read_all(path, after, sizeof after);
    cr_expect(now == len && memcmp(before, after, len) == 0,
              "the failed dump changed the earlier profile: %zu bytes, %zu before", now, len);
    char names[4096];
    names_in_dir(names, sizeof names);
    cr_expect_str_eq(names, "heap.pb.gz\n", "the directory holds:\n%s", names);
}

Test(profile_dump_file, a_hard_link_at_path_keeps_its_other_file) {
    char other[sizeof dir + 32];
    snprintf(other, sizeof other, "%s/other", dir);
    int fd = open(other, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "other file\n", 11), 11);
    cr_assert_eq(fchmod(fd, 0644), 0);
    close(fd);
    cr_assert_eq(link(other, path), 0, "link: %s", strerror(errno));

    cr_assert_eq(lull_profile_dump(path), 0, "lull_profile_dump: %s", strerror(errno));
    static char text[1 << 16];
    size_t len = read_all(other, text, sizeof text);
    cr_expect(len == 11 && memcmp(text, "other file\n", 11) == 0,
              "the dump wrote into the hard link's other file (%zu bytes)", len);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_expect_eq(st.st_mode & 07777, 0600, "the profile's mode is %o", st.st_mode & 07777);
    cr_expect_eq(st.st_nlink, 1, "the profile has %ju links", (uintmax_t)st.st_nlink);
    char names[4096];
    names_in_dir(names, sizeof names);
    cr_expect(strstr(names, "heap.pb.gz\n") && strstr(names, "other\n") &&
                  strlen(names) == strlen("heap.pb.gz\nother\n"),
              "the directory holds:\n%s", names);
}
