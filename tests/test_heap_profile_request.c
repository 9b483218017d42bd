/* Heap profile requests through the counter page (include/lull/counters.h,
 * "Requests"): lullstat --heap-profile PID FILE against real lull processes.
 *
 * Each test starts this program again as a lull process (role "serve":
 * LULL_TEST_HPREQ_ROLE), whose constructor waits until its reclaim thread
 * has created its counter page, reports its name and pid on fd 3 and holds
 * until its stdin closes. Its profile comes from lull_profile_dump() under
 * LULL_CONF=profile_sample_kb=512 (and LULL_TEST_PROFILE_STUB=1, for the
 * temporary stub that stands in for it: its placeholder starts with the
 * gzip magic, as the real profile does). The tests run lullstat
 * (LULL_BUILD_DIR "/tools/lullstat", or $LULLSTAT) against it.
 *
 * When the test may, it runs under a private tmpfs over /dev/shm (a mount
 * namespace of its own), so that what it places there is out of reach of
 * other lull processes. Every wait ends on an event (a report line, an
 * answer in the page, a process's exit or stop); the caps (20 s for a page,
 * 60 s for a report or an answer) only end a broken run. Nothing depends on
 * how fast the machine is: the one timeout lullstat is given is for a
 * process that cannot answer at all (stopped). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include "lull/counters.h"
#include "lull.h"
#include "src/counter_page.h"
#include "tests/support/page_child.h"
#include "tests/support/text_lines.h"
#include "tests/support/timing.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef LULL_BUILD_DIR
#define LULL_BUILD_DIR "."
#endif

extern char **environ;

/* lullstat's exit codes (its --help). */
enum {
    LS_OK = 0,
    LS_FAIL = 1,
    LS_USAGE = 2,
    LS_NOPAGE = 4,
    LS_TIMEOUT = 9,
    LS_PROFILE_OFF = 10,
};

#define REPORT_FD PAGE_CHILD_REPORT_FD

/* ------------------------------------------------ stage 2: the process */

__attribute__((constructor(200))) static void hpreq_role(void) {
    const char *role = getenv("LULL_TEST_HPREQ_ROLE");
    if (!role) return;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char name[256] = "";
    if (strcmp(role, "serve") == 0 && !page_child_wait_own_page(name, sizeof name)) {
        page_child_report("error=no counter page after 20 s\n");
        _exit(80);
    }
    page_child_report("name=%s\npid=%d\nready=1\n", name, (int)getpid());
    char c;
    while (read(0, &c, 1) > 0) {
    }
    exit(0); /* exit handlers: the page (and a profile left) go */
}

/* ------------------------------------------------- stage 1: the tests */

struct kid {
    pid_t pid;
    int report, hold; /* the report pipe's read end, the stdin pipe's write end */
    char out[2048];
    size_t len;
    char name[256]; /* its page, "/lull.1234" */
    char pid_text[16];
};

/* Start this program as a lull process with `vars` (NULL-terminated) added
 * to an environment without LULL_* variables. */
static void kid_start(struct kid *k, const char *role, const char *const *vars) {
    static char *envp[512];
    static char role_var[64];
    size_t n = 0;
    for (char **e = environ; *e && n < 500; e++)
        if (strncmp(*e, "LULL_", 5) != 0) envp[n++] = *e;
    snprintf(role_var, sizeof role_var, "LULL_TEST_HPREQ_ROLE=%s", role);
    envp[n++] = role_var;
    for (size_t i = 0; vars && vars[i] && n < 510; i++)
        envp[n++] = (char *)vars[i];
    envp[n] = NULL;
    int r[2], h[2];
    cr_assert_eq(pipe2(r, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(h, O_CLOEXEC), 0);
    memset(k, 0, sizeof *k);
    fflush(NULL);
    k->pid = fork();
    cr_assert_geq(k->pid, 0);
    if (k->pid == 0) {
        dup2(h[0], 0);
        dup2(r[1], REPORT_FD);
        char *const argv[] = {(char *)role, NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(r[1]);
    close(h[0]);
    k->report = r[0];
    k->hold = h[1];
}

static const char *kid_field(const struct kid *k, const char *key, char *buf, size_t len) {
    return text_field(k->out, key, buf, len);
}

/* Read k's report up to its ready line. */
static void kid_wait_ready(struct kid *k) {
    for (uint64_t end = now_ms() + 60000;;) {
        k->out[k->len] = '\0';
        if (strstr(k->out, "ready=1\n") || strstr(k->out, "error=")) break;
        uint64_t now = now_ms();
        cr_assert_lt(now, end, "no report from the lull process: %s", k->out);
        struct pollfd p = {k->report, POLLIN, 0};
        if (poll(&p, 1, (int)(end - now)) <= 0) continue;
        ssize_t got = read(k->report, k->out + k->len, sizeof k->out - 1 - k->len);
        if (got < 0 && errno == EINTR) continue;
        cr_assert_gt(got, 0, "the lull process ended before it was ready: %s", k->out);
        k->len += (size_t)got;
    }
    char e[256];
    cr_assert_str_empty(kid_field(k, "error", e, sizeof e), "lull process: %s", e);
    kid_field(k, "name", k->name, sizeof k->name);
    kid_field(k, "pid", k->pid_text, sizeof k->pid_text);
}

/* A lull process with its page, and heap profiling on or off. */
static void kid_serve(struct kid *k, bool profiling) {
    static const char *const on[] = {"LULL_CONF=profile_sample_kb=512", "LULL_TEST_PROFILE_STUB=1",
                                     NULL};
    static const char *const off[] = {"LULL_TEST_PROFILE_STUB=1", NULL};
    kid_start(k, "serve", profiling ? on : off);
    kid_wait_ready(k);
    cr_assert(k->name[0] == '/', "no page name: %s", k->out);
}

static int kid_end(struct kid *k) {
    close(k->hold);
    int st = -1;
    cr_assert_eq(waitpid(k->pid, &st, 0), k->pid);
    close(k->report);
    return st;
}

static bool kid_alive(const struct kid *k) {
    int st;
    return waitpid(k->pid, &st, WNOHANG) == 0;
}

/* /dev/shm/<name><suffix> */
static const char *shm_path(char *buf, size_t len, const char *name, const char *suffix) {
    snprintf(buf, len, "%s%s%s%s", LULL_COUNTERS_SHM_DIR, name[0] == '/' ? "" : "/", name, suffix);
    return buf;
}

static const char *profile_path(char *buf, size_t len, const struct kid *k) {
    return shm_path(buf, len, k->name, LULL_COUNTERS_PROFILE_SUFFIX);
}

static bool isolate_dev_shm(void) {
    return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount("lulltest", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=1777") == 0;
}

static char tmpdir[64];

static void rm_tmpdir(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) {
    }
}

static void setup(void) {
    isolate_dev_shm(); /* else the shared /dev/shm: names are pid-based */
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lull-hpreq-XXXXXX");
    cr_assert(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
}

static const char *tmp_file(char *buf, size_t len, const char *leaf) {
    snprintf(buf, len, "%s/%s", tmpdir, leaf);
    return buf;
}

/* ------------------------------------------------------ running lullstat */

static const char *lullstat_path(void) {
    const char *p = getenv("LULLSTAT");
    return p && *p ? p : LULL_BUILD_DIR "/tools/lullstat";
}

struct run {
    int status; /* exit code, or 128 + signal */
    char out[4096];
    char err[4096];
};

/* Files lullstat writes may grow to this many bytes (RLIMIT_FSIZE, its
 * SIGXFSZ ignored: a write past it fails with EFBIG, as on a full disk);
 * 0: no limit. */
static rlim_t lullstat_file_limit;

static struct run *run_lullstat(const char *const *args) {
    static struct run r;
    int out = memfd_create("lullstat-out", MFD_CLOEXEC);
    int err = memfd_create("lullstat-err", MFD_CLOEXEC);
    cr_assert(out >= 0 && err >= 0);
    cr_assert_eq(access(lullstat_path(), X_OK), 0, "lullstat not found at %s", lullstat_path());
    const char *argv[16] = {"lullstat"};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(out, 1);
        dup2(err, 2);
        if (lullstat_file_limit) {
            struct rlimit lim = {lullstat_file_limit, lullstat_file_limit};
            signal(SIGXFSZ, SIG_IGN);
            setrlimit(RLIMIT_FSIZE, &lim);
        }
        execv(lullstat_path(), (char *const *)argv);
        _exit(121);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    ssize_t got = pread(out, r.out, sizeof r.out - 1, 0);
    r.out[got > 0 ? got : 0] = '\0';
    got = pread(err, r.err, sizeof r.err - 1, 0);
    r.err[got > 0 ? got : 0] = '\0';
    close(out);
    close(err);
    cr_assert_neq(r.status, 121, "could not run %s", lullstat_path());
    return &r;
}

#define LULLSTAT(...) run_lullstat((const char *const[]){__VA_ARGS__, NULL})

#define assert_contains(hay, needle)                                                               \
    cr_assert(strstr((hay), (needle)) != NULL, "expected \"%s\" in:\n%s", (needle), (hay))

/* The file holds a gzip stream's magic (1f 8b) and is 0600. */
static void assert_profile(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "no profile at %s: %s", path, strerror(errno));
    unsigned char magic[2] = {0, 0};
    cr_assert_eq(read(fd, magic, 2), 2, "%s is shorter than 2 bytes", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    close(fd);
    cr_assert(magic[0] == 0x1f && magic[1] == 0x8b, "%s starts with %02x %02x, not 1f 8b", path,
              magic[0], magic[1]);
    cr_assert_eq(st.st_mode & 07777, 0600, "%s has mode %o", path, st.st_mode & 07777);
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* The process's request block, mapped read-write as a requester maps it. */
static volatile struct lull_counters_request *map_requests(const struct kid *k, void **map) {
    char path[300];
    int fd = open(shm_path(path, sizeof path, k->name, ""), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_geq((size_t)st.st_size, LULL_COUNTERS_FILE_SIZE, "the page has no request block");
    *map = mmap(NULL, LULL_COUNTERS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(*map, MAP_FAILED);
    close(fd);
    return lull_counters_request_block(*map);
}

/* Until the process has answered request value v (60 s at most: an answer
 * comes at its next tick, 100 ms apart when idle). */
static bool answered(volatile struct lull_counters_request *b, uint64_t v) {
    for (uint64_t end = now_ms() + 60000; now_ms() < end;) {
        if (__atomic_load_n(&b->profile_done, __ATOMIC_ACQUIRE) == v) return true;
        sleep_ms(5);
    }
    return false;
}

/* ---------------------------------------------------------------- tests */

TestSuite(heap_profile_request, .init = setup, .fini = rm_tmpdir, .timeout = 180);

Test(heap_profile_request, lullstat_gets_a_profile) {
    struct kid k;
    kid_serve(&k, true);
    char file[128], path[300];
    /* into /tmp: another file system than /dev/shm (copied), when isolated */
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, tmp_file(file, sizeof file, "a.pb.gz"));
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->out, "written to");
    assert_profile(file);
    cr_assert(!exists(profile_path(path, sizeof path, &k)), "%s was left behind", path);

    /* next to the page (renamed), and over an existing file */
    char same_fs[300];
    snprintf(same_fs, sizeof same_fs, "%s/lulltest-hpreq-%d.pb.gz", LULL_COUNTERS_SHM_DIR,
             (int)getpid());
    r = LULLSTAT("--heap-profile", k.pid_text, same_fs);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(same_fs);
    r = LULLSTAT("--heap-profile", "--timeout", "30", k.pid_text, same_fs);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(same_fs);
    unlink(same_fs);
    cr_assert(!exists(path));

    /* the page says it serves requests */
    r = LULLSTAT(k.pid_text);
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    assert_contains(r->out, "profile-requests");
    cr_assert(kid_alive(&k));
    cr_assert_eq(kid_end(&k), 0);
}

/* The process's user may replace its profile file between lullstat's
 * check of it (open, fstat: a regular file of that user) and the rename
 * that moves it to the destination: a symbolic link swapped in was moved
 * there, for a later write through it (a copy across file systems opens
 * the destination) to land where the link points. LULLSTAT_TEST_SWAP_PROFILE
 * makes the swap in that window (a test hook, as the library's LULL_FAULT):
 * the destination must be the profile lullstat checked, the link's target
 * untouched. Session 22's review. */
Test(heap_profile_request, a_profile_swapped_for_a_link_is_not_moved) {
    struct kid k;
    kid_serve(&k, true);
    char victim[128], same_fs[300];
    tmp_file(victim, sizeof victim, "victim");
    int fd = open(victim, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "victim\n", 7), 7);
    close(fd);
    snprintf(same_fs, sizeof same_fs, "%s/lulltest-hpswap-%d.pb.gz", LULL_COUNTERS_SHM_DIR,
             (int)getpid());
    unlink(same_fs);
    setenv("LULLSTAT_TEST_SWAP_PROFILE", victim, 1);
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, same_fs);
    unsetenv("LULLSTAT_TEST_SWAP_PROFILE");
    struct stat st;
    bool link = lstat(same_fs, &st) == 0 && S_ISLNK(st.st_mode);
    if (link) unlink(same_fs);
    cr_assert_not(link, "the swapped-in link was moved to the destination; stderr: %s", r->err);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(same_fs);
    unlink(same_fs);
    char text[16] = {0};
    fd = open(victim, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(read(fd, text, sizeof text - 1), 7);
    close(fd);
    cr_assert_str_eq(text, "victim\n");
    cr_assert(kid_alive(&k));
    cr_assert_eq(kid_end(&k), 0);
}

/* A text file's content, "" if it cannot be read. */
static const char *file_text(const char *path, char *buf, size_t len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, buf, len - 1) : -1;
    buf[got > 0 ? got : 0] = '\0';
    if (fd >= 0) close(fd);
    return buf;
}

static void write_text(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, mode);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    cr_assert_eq(fchmod(fd, mode), 0);
    close(fd);
}

/* FILE on another file system than /dev/shm (the profile is copied) that
 * is a hard link to another file, mode 0644: the profile replaces the name
 * FILE, as the rename on one file system does. The copy opened FILE with
 * O_TRUNC and wrote through it: the other name's file was overwritten
 * with the profile, which kept mode 0644. Session 29's review. */
Test(heap_profile_request, a_copied_profile_replaces_a_hard_link) {
    struct kid k;
    kid_serve(&k, true);
    char file[128], other[128], text[64];
    tmp_file(file, sizeof file, "linked.pb.gz");
    tmp_file(other, sizeof other, "other");
    write_text(other, "other\n", 0644);
    cr_assert_eq(link(other, file), 0, "link: %s", strerror(errno));
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, file);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    cr_assert_str_eq(file_text(other, text, sizeof text), "other\n",
                     "the profile was written through the hard link FILE");
    assert_profile(file);
    cr_assert_eq(kid_end(&k), 0);
}

/* A profile that cannot be written to FILE (a full disk; here a file size
 * limit: the same failed write) leaves what FILE held as it was, and the
 * process's profile in /dev/shm for the next try. The copy truncated FILE,
 * failed, and removed it: an earlier profile there was lost. */
Test(heap_profile_request, a_failed_copy_leaves_the_file_alone) {
    struct kid k;
    kid_serve(&k, true);
    char file[128], text[64], path[300];
    tmp_file(file, sizeof file, "earlier.pb.gz");
    write_text(file, "earlier profile\n", 0600);
    lullstat_file_limit = 20; /* a profile is hundreds of bytes */
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, file);
    lullstat_file_limit = 0;
    cr_assert_eq(r->status, LS_FAIL, "status %d, stderr: %s", r->status, r->err);
    cr_assert_str_eq(file_text(file, text, sizeof text), "earlier profile\n",
                     "a failed copy changed FILE; stderr: %s", r->err);
    cr_assert(exists(profile_path(path, sizeof path, &k)), "the profile was not kept in /dev/shm");
    /* the next try, without the limit, moves it */
    r = LULLSTAT("--heap-profile", k.pid_text, file);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(file);
    cr_assert_eq(kid_end(&k), 0);
}

Test(heap_profile_request, profiling_off_is_said) {
    struct kid k;
    kid_serve(&k, false);
    char file[128], path[300], want[160];
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, tmp_file(file, sizeof file, "off.gz"));
    cr_assert_eq(r->status, LS_PROFILE_OFF, "status %d, stderr: %s", r->status, r->err);
    snprintf(want, sizeof want,
             "heap profiling is off in process %s: start it with "
             "LULL_CONF=profile_sample_kb=512",
             k.pid_text);
    assert_contains(r->err, want);
    cr_assert(!exists(file), "%s was created", file);
    cr_assert(!exists(profile_path(path, sizeof path, &k)), "%s was left behind", path);
    cr_assert(kid_alive(&k));
    cr_assert_eq(kid_end(&k), 0);
}

/* A process that cannot answer (stopped): lullstat gives up after its
 * timeout with a message. The request is served once the process runs
 * again; its file, which nobody collected, is replaced by the next
 * request's and removed when the process exits. */
Test(heap_profile_request, a_process_that_does_not_answer_times_out) {
    struct kid k;
    kid_serve(&k, true);
    cr_assert_eq(kill(k.pid, SIGSTOP), 0);
    int st;
    cr_assert_eq(waitpid(k.pid, &st, WUNTRACED), k.pid);
    cr_assert(WIFSTOPPED(st));
    char file[128], path[300];
    struct run *r =
        LULLSTAT("--heap-profile", "-t", "0.5", k.pid_text, tmp_file(file, sizeof file, "s.gz"));
    cr_assert_eq(r->status, LS_TIMEOUT, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->err, "did not answer the heap profile request within 0.5 s");
    cr_assert(!exists(file));
    cr_assert_eq(kill(k.pid, SIGCONT), 0);

    /* the late answer leaves its file; the next request replaces it */
    void *map;
    volatile struct lull_counters_request *b = map_requests(&k, &map);
    uint64_t pending = __atomic_load_n(&b->profile_request, __ATOMIC_ACQUIRE);
    cr_assert(answered(b, pending), "the request was never served after SIGCONT");
    cr_assert(exists(profile_path(path, sizeof path, &k)), "no profile left by the late answer");
    r = LULLSTAT("--heap-profile", k.pid_text, file);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(file);
    cr_assert(!exists(path));

    /* one left at exit goes with the page */
    __atomic_store_n(&b->profile_request, pending + 1000, __ATOMIC_RELEASE);
    cr_assert(answered(b, pending + 1000));
    cr_assert(exists(path));
    munmap(map, LULL_COUNTERS_FILE_SIZE);
    cr_assert_eq(kid_end(&k), 0);
    cr_assert(!exists(path), "%s outlived its process", path);
}

/* Whatever a requester writes into the request block is at most a request:
 * extreme values, a flood of them, garbage in the words lull writes. */
Test(heap_profile_request, garbage_in_the_request_block_does_no_harm) {
    struct kid k;
    kid_serve(&k, true);
    void *map;
    volatile struct lull_counters_request *b = map_requests(&k, &map);
    static const uint64_t values[] = {UINT64_MAX, UINT64_C(1) << 63, 0, 1, UINT64_C(0xdeadbeef)};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
        /* lull never reads back what it writes */
        __atomic_store_n(&b->profile_done, ~values[i], __ATOMIC_RELAXED);
        __atomic_store_n(&b->profile_status, UINT64_MAX, __ATOMIC_RELAXED);
        for (int j = 0; j < 5; j++)
            __atomic_store_n(&b->reserved[j], UINT64_MAX - (uint64_t)j, __ATOMIC_RELAXED);
        __atomic_store_n(&b->profile_request, values[i], __ATOMIC_RELEASE);
        cr_assert(answered(b, values[i]), "request %#llx was not answered",
                  (unsigned long long)values[i]);
        cr_assert_eq(__atomic_load_n(&b->profile_status, __ATOMIC_ACQUIRE), 0);
        cr_assert(kid_alive(&k));
    }
    /* a flood: the value changes faster than the thread ticks */
    for (uint64_t v = 1; v <= 100000; v++)
        __atomic_store_n(&b->profile_request, v * UINT64_C(0x9e3779b97f4a7c15), __ATOMIC_RELEASE);
    uint64_t last = UINT64_C(100000) * UINT64_C(0x9e3779b97f4a7c15);
    cr_assert(answered(b, last), "the last request of the flood was not answered");
    cr_assert(kid_alive(&k));
    /* lullstat still works, with garbage left in the block */
    __atomic_store_n(&b->profile_done, 12345, __ATOMIC_RELAXED);
    char file[128];
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, tmp_file(file, sizeof file, "g.gz"));
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(file);
    munmap(map, LULL_COUNTERS_FILE_SIZE);
    cr_assert_eq(kid_end(&k), 0);
}

/* What someone else put at the profile's name is never followed, opened
 * for writing or removed: a symbolic link, a FIFO, another user's file. A
 * stale profile of lull's own user is replaced. */
Test(heap_profile_request, what_is_in_the_way_is_left_alone) {
    struct kid k;
    kid_serve(&k, true);
    char path[300], victim[128], file[128];
    profile_path(path, sizeof path, &k);
    tmp_file(victim, sizeof victim, "victim");
    tmp_file(file, sizeof file, "w.gz");
    static const char data[] = "not to be overwritten";
    FILE *f = fopen(victim, "w");
    cr_assert(f);
    fputs(data, f);
    fclose(f);

    cr_assert_eq(symlink(victim, path), 0, "symlink %s: %s", path, strerror(errno));
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, file);
    cr_assert_eq(r->status, LS_FAIL, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->err, "is in the way");
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "the symlink was removed");
    cr_assert(S_ISLNK(st.st_mode));
    char back[64] = "";
    f = fopen(victim, "r");
    cr_assert(f);
    cr_assert(fgets(back, sizeof back, f));
    fclose(f);
    cr_assert_str_eq(back, data, "the symlink's target was written");
    cr_assert(!exists(file));
    unlink(path);

    cr_assert_eq(mkfifo(path, 0666), 0);
    r = LULLSTAT("--heap-profile", k.pid_text, file); /* returns: nothing blocks on it */
    cr_assert_eq(r->status, LS_FAIL, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->err, "is in the way");
    cr_assert_eq(lstat(path, &st), 0, "the FIFO was removed");
    cr_assert(S_ISFIFO(st.st_mode));
    unlink(path);

    if (geteuid() == 0) { /* another user's regular file */
        int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, data, sizeof data), (ssize_t)sizeof data);
        cr_assert_eq(fchown(fd, 65534, 65534), 0);
        close(fd);
        r = LULLSTAT("--heap-profile", k.pid_text, file);
        cr_assert_eq(r->status, LS_FAIL, "status %d, stderr: %s", r->status, r->err);
        assert_contains(r->err, "is in the way");
        cr_assert_eq(lstat(path, &st), 0, "another user's file was removed");
        cr_assert_eq(st.st_uid, 65534);
        cr_assert_eq((size_t)st.st_size, sizeof data, "another user's file was written");
        unlink(path);
    }

    /* a stale one of ours: replaced */
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "old", 3), 3);
    close(fd);
    r = LULLSTAT("--heap-profile", k.pid_text, file);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_profile(file);
    cr_assert(!exists(path));
    cr_assert(kid_alive(&k));
    cr_assert_eq(kid_end(&k), 0);
}

Test(heap_profile_request, a_process_without_a_page_is_said) {
    struct kid k;
    static const char *const vars[] = {"LULL_COUNTER_PAGE=off", NULL};
    kid_start(&k, "nopage", vars);
    kid_wait_ready(&k);
    char file[128];
    struct run *r = LULLSTAT("--heap-profile", k.pid_text, tmp_file(file, sizeof file, "n.gz"));
    cr_assert_eq(r->status, LS_NOPAGE, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->err, "has no counter page");
    assert_contains(r->err, "no thread to answer");
    cr_assert_eq(kid_end(&k), 0);
}

Test(heap_profile_request, usage) {
    char file[128];
    tmp_file(file, sizeof file, "u.gz");
    cr_assert_eq(LULLSTAT("--heap-profile", "1")->status, LS_USAGE);
    cr_assert_eq(LULLSTAT("--heap-profile", "1", file, "x")->status, LS_USAGE);
    cr_assert_eq(LULLSTAT("--heap-profile", "-t", "0", "1", file)->status, LS_USAGE);
    cr_assert_eq(LULLSTAT("--heap-profile", "-t", "1.2345", "1", file)->status, LS_USAGE);
    cr_assert_eq(LULLSTAT("--heap-profile", "--json", "1", file)->status, LS_USAGE);
    struct run *r = LULLSTAT("--help");
    assert_contains(r->out, "--heap-profile");
    assert_contains(r->out, "profile_sample_kb");
}

/* A profile file nobody collected, whose page is gone (its process was
 * killed), is not a page for --list, and --clean removes it. */
Test(heap_profile_request, clean_removes_a_profile_whose_page_is_gone) {
    pid_t dead = fork();
    cr_assert_geq(dead, 0);
    if (dead == 0) _exit(0);
    cr_assert_eq(waitpid(dead, NULL, 0), dead);
    char name[64], path[300];
    snprintf(name, sizeof name, "lull.%d%s", (int)dead, LULL_COUNTERS_PROFILE_SUFFIX);
    shm_path(path, sizeof path, name, "");
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    close(fd);
    struct run *r = LULLSTAT("--list");
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    cr_assert_null(strstr(r->out, name), "--list shows a profile as a page:\n%s", r->out);
    char pid[16];
    snprintf(pid, sizeof pid, "%d", (int)dead);
    r = LULLSTAT("--clean", pid);
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->out, name);
    cr_assert(!exists(path), "--clean left %s", path);
}
