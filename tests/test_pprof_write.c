/* lull_pprof_write (src/pprof_write.c), read back by `go tool pprof`:
 * records made by hand, whose pcs lie in this program's own functions
 * (pprof_site_*), must come back under those names with their figures, in
 * the order of the figures, for every sample type. go is required (CI
 * installs golang-go, tests/install-deps.sh): without it these tests fail
 * with a message, they do not skip. Also the file's gzip wrapper, its
 * contents read with zlib alone, and the write errors. */
#define _GNU_SOURCE
#include "src/pprof_write.h"
#include "tests/support/pprof_run.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

/* ---- stacks in this program's code ---------------------------------------------- */

static volatile int site_tag;

/* The return address less one, as the profiler records a frame: inside the
 * call instruction of the caller. The tag keeps the sites' code distinct,
 * so that the compiler cannot fold them into one (-fipa-icf). */
__attribute__((noinline)) static uintptr_t caller_pc(int tag) {
    site_tag = tag;
    return (uintptr_t)__builtin_extract_return_addr(__builtin_return_address(0)) - 1;
}

/* External, so that the names stay as written (no .constprop clone); the
 * barrier after the call keeps it from being a tail call, whose return
 * address would be in our caller. */
#define SITE(name, tag)                                                                            \
    __attribute__((noinline)) uintptr_t name(void);                                                \
    __attribute__((noinline)) uintptr_t name(void) {                                               \
        uintptr_t pc = caller_pc(tag);                                                             \
        __asm__ volatile("" ::: "memory");                                                         \
        return pc;                                                                                 \
    }
SITE(pprof_site_big, 1)
SITE(pprof_site_mid, 2)
SITE(pprof_site_small, 3)
SITE(pprof_site_outer, 4)

#define MB (1024 * 1024)

/* Four stacks: three leaves under pprof_site_outer, and pprof_site_mid's
 * pc once more on a stack of its own (one Location for both; pprof adds
 * the two samples). Each sample type has another leaf on top. */
static size_t make_records(lull_profile_record *r) {
    memset(r, 0, 4 * sizeof *r);
    uintptr_t outer = pprof_site_outer();
    uintptr_t leaf[4] = {pprof_site_big(), pprof_site_mid(), pprof_site_small(), pprof_site_mid()};
    for (int i = 0; i < 4; i++) {
        r[i].pc[0] = leaf[i];
        r[i].pc[1] = outer;
        r[i].depth = i < 3 ? 2 : 1;
    }
    /*                 big        mid (two samples)       small */
    r[0].inuse_space = 4 * MB, r[1].inuse_space = MB, r[3].inuse_space = MB, r[2].inuse_space = MB;
    r[0].alloc_space = 3 * MB, r[1].alloc_space = 4 * MB, r[3].alloc_space = 2 * MB,
    r[2].alloc_space = MB;
    r[0].peak_space = 2 * MB, r[1].peak_space = MB / 2, r[3].peak_space = MB / 2,
    r[2].peak_space = 8 * MB;
    r[0].inuse_objects = 40, r[1].inuse_objects = 10, r[3].inuse_objects = 10,
    r[2].inuse_objects = 30;
    r[0].alloc_objects = 100, r[1].alloc_objects = 200, r[3].alloc_objects = 100,
    r[2].alloc_objects = 50;
    r[0].peak_objects = 5, r[1].peak_objects = 3, r[3].peak_objects = 4, r[2].peak_objects = 9;
    return 4;
}

/* ---- running go tool pprof ---------------------------------------------------------- */

static char tmpdir[] = "/tmp/lull-pprof-XXXXXX";
static char profile[sizeof tmpdir + 16];
static char exe[PATH_MAX];
static bool made_tmpdir;

/* Writes the records' profile to a file in a fresh directory, which is
 * also go's home: the test needs no network and no writable home. */
static void write_profile(void) {
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    made_tmpdir = true;
    snprintf(profile, sizeof profile, "%s/heap.pb.gz", tmpdir);
    cr_assert_not_null(realpath("/proc/self/exe", exe));
    lull_profile_record r[4];
    size_t n = make_records(r);
    int fd = open(profile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "open %s: %s", profile, strerror(errno));
    cr_assert_eq(lull_pprof_write(fd, r, n, 512 * 1024, 1700000000123456789), 0,
                 "lull_pprof_write: %s", strerror(errno));
    close(fd);
    pprof_env(tmpdir);
}

static void remove_profile(void) {
    char cmd[sizeof tmpdir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (made_tmpdir && system(cmd) != 0) cr_log_warn("%s failed", cmd);
}

static char *pprof(const char *args) {
    return pprof_run(args, exe, profile);
}

typedef struct {
    const char *name, *flat; /* flat: as pprof prints it */
} row;

/* `-top` lists the functions by flat value, largest first: the first rows
 * must be `want`'s, in that order (and pprof_site_outer, which has only a
 * cumulative value, after them). */
static void expect_top(const char *args, const row *want, int nwant) {
    char *out = pprof(args);
    const char *l = strstr(out, "flat%");
    cr_assert_not_null(l, "no table in the output of -top %s:\n%s", args, out);
    l = strchr(l, '\n');
    for (int i = 0; i < nwant; i++) {
        cr_assert_not_null(l, "-top %s: %d rows, expected %d:\n%s", args, i, nwant, out);
        char flat[32], name[256];
        int got = sscanf(l + 1, "%31s %*s %*s %*s %*s %255s", flat, name);
        cr_assert_eq(got, 2, "-top %s: row %d unreadable:\n%s", args, i, out);
        cr_expect_str_eq(name, want[i].name, "-top %s: row %d is %s, expected %s:\n%s", args, i,
                         name, want[i].name, out);
        cr_expect_str_eq(flat, want[i].flat, "-top %s: %s's flat is %s, expected %s:\n%s", args,
                         name, flat, want[i].flat, out);
        l = strchr(l + 1, '\n');
    }
    cr_expect_not_null(strstr(out, "pprof_site_outer"), "-top %s: no pprof_site_outer:\n%s", args,
                       out);
    free(out);
}

TestSuite(pprof_write, .init = write_profile, .fini = remove_profile);

Test(pprof_write, inuse_space_is_the_default_and_reads_back) {
    const row want[] = {
        {"pprof_site_big", "4MB"}, {"pprof_site_mid", "2MB"}, {"pprof_site_small", "1MB"}};
    expect_top("-top -sample_index=inuse_space", want, 3);
    expect_top("-top", want, 3);
}

Test(pprof_write, alloc_space_reads_back) {
    const row want[] = {
        {"pprof_site_mid", "6MB"}, {"pprof_site_big", "3MB"}, {"pprof_site_small", "1MB"}};
    expect_top("-top -sample_index=alloc_space", want, 3);
}

Test(pprof_write, peak_space_reads_back) {
    const row want[] = {
        {"pprof_site_small", "8MB"}, {"pprof_site_big", "2MB"}, {"pprof_site_mid", "1MB"}};
    expect_top("-top -sample_index=peak_space", want, 3);
}

Test(pprof_write, object_counts_read_back) {
    const row inuse[] = {
        {"pprof_site_big", "40"}, {"pprof_site_small", "30"}, {"pprof_site_mid", "20"}};
    expect_top("-top -sample_index=inuse_objects", inuse, 3);
    const row alloc[] = {
        {"pprof_site_mid", "300"}, {"pprof_site_big", "100"}, {"pprof_site_small", "50"}};
    expect_top("-top -sample_index=alloc_objects", alloc, 3);
    const row peak[] = {
        {"pprof_site_small", "9"}, {"pprof_site_mid", "7"}, {"pprof_site_big", "5"}};
    expect_top("-top -sample_index=peak_objects", peak, 3);
}

/* The header fields, and mapping[0]: this program's file, with its build
 * id as `readelf -n` shows it. */
Test(pprof_write, raw_shows_the_period_and_this_program_first) {
    char *out = pprof("-raw");
    cr_expect_not_null(strstr(out, "PeriodType: space bytes\n"), "%s", out);
    cr_expect_not_null(strstr(out, "Period: 524288\n"), "%s", out);
    cr_expect_not_null(strstr(out, "alloc_objects/count alloc_space/bytes inuse_objects/count "
                                   "inuse_space/bytes[dflt] peak_objects/count peak_space/bytes"),
                       "%s", out);
    const char *maps = strstr(out, "Mappings\n");
    cr_assert_not_null(maps, "%s", out);
    const char *first = strchr(maps, '\n') + 1, *eol = strchr(first, '\n');
    cr_assert_not_null(eol);
    char line[4096];
    snprintf(line, sizeof line, "%.*s", (int)(eol - first), first);
    cr_expect_not_null(strstr(line, exe), "mapping[0] is not %s: %s", exe, line);

    char cmd[PATH_MAX + 64], id[160] = "";
    snprintf(cmd, sizeof cmd, "readelf -n '%s' | sed -n 's/.*Build ID: //p'", exe);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    if (!fgets(id, sizeof id, f)) id[0] = '\0';
    pclose(f);
    id[strcspn(id, "\n")] = '\0';
    if (id[0])
        cr_expect_not_null(strstr(line, id), "build id %s not in: %s", id, line);
    else
        cr_log_warn("%s has no build id: its mapping's is not checked", exe);
    free(out);
}

/* ---- the file itself, with zlib alone ------------------------------------------------- */

Test(pprof_write, file_is_gzip_of_a_profile) {
    unsigned char magic[2] = {0};
    int fd = open(profile, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(read(fd, magic, 2), 2);
    cr_expect(magic[0] == 0x1f && magic[1] == 0x8b, "magic %02x %02x, not gzip's 1f 8b", magic[0],
              magic[1]);
    lseek(fd, 0, SEEK_SET);
    gzFile gz = gzdopen(fd, "rb");
    cr_assert_not_null(gz);
    static char msg[1 << 16];
    int len = gzread(gz, msg, sizeof msg);
    int eof = gzeof(gz);
    gzclose(gz);
    cr_assert_gt(len, 0, "gzread");
    cr_expect(eof, "the message is larger than %zu bytes", sizeof msg);
    /* string_table's first entry, "": field 6, length 0 */
    cr_expect(memmem(msg, (size_t)len, "\x32\x00", 2) != NULL);
    const char *names[] = {"alloc_objects", "inuse_space", "peak_space", "count", exe};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        cr_expect(memmem(msg, (size_t)len, names[i], strlen(names[i])) != NULL, "no \"%s\"",
                  names[i]);
}

/* ---- errors ---------------------------------------------------------------------------- */

static void expect_write_fails(int fd, int err, const char *what) {
    lull_profile_record r[4];
    size_t n = make_records(r);
    errno = 0;
    cr_expect_eq(lull_pprof_write(fd, r, n, 512 * 1024, 0), -1, "%s: not -1", what);
    cr_expect_eq(errno, err, "%s: errno %d (%s), expected %d (%s)", what, errno, strerror(errno),
                 err, strerror(err));
}

Test(pprof_write, write_errors_return_minus_one_with_errno) {
    /* a high number, closed: a low one would be the next open()'s (the
     * library's own threads open files meanwhile) */
    int fd = open(profile, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(dup2(fd, 900), 900, "dup2: %s", strerror(errno));
    close(fd);
    close(900);
    expect_write_fails(900, EBADF, "a closed fd");
    fd = open(profile, O_RDONLY | O_CLOEXEC);
    expect_write_fails(fd, EBADF, "a read-only fd");
    close(fd);
    fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "/dev/full: %s", strerror(errno));
    expect_write_fails(fd, ENOSPC, "/dev/full");
    close(fd);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    close(p[0]);
    signal(SIGPIPE, SIG_IGN);
    expect_write_fails(p[1], EPIPE, "a pipe with no reader");
    close(p[1]);
}

Test(pprof_write, no_records_is_a_valid_profile) {
    int fd = open(profile, O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(lull_pprof_write(fd, NULL, 0, 512 * 1024, 0), 0, "%s", strerror(errno));
    close(fd);
    char *out = pprof("-raw");
    cr_expect_not_null(strstr(out, "Samples:\n"), "%s", out);
    free(out);
}
