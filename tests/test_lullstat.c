/* lullstat, run as a separate program against pages written by the counter
 * page writer (in a forked child) or crafted by hand.
 *
 * The binary is LULL_BUILD_DIR "/tools/lullstat" (built by tools/), or the
 * path in the environment variable LULLSTAT. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include "lull/counters.h"
#include "base/config.h"
#include "src/counter_page.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LULL_BUILD_DIR
#define LULL_BUILD_DIR "."
#endif

extern char **environ;

/* Exit codes of lullstat (see its --help). */
enum {
    LS_OK = 0,
    LS_USAGE = 2,
    LS_NOPROC = 3,
    LS_NOPAGE = 4,
    LS_VERSION = 5,
    LS_PERM = 6,
    LS_TORN = 7,
    LS_STALE = 8,
};

static const char *lullstat_path(void) {
    const char *p = getenv("LULLSTAT");
    return p && *p ? p : LULL_BUILD_DIR "/tools/lullstat";
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A mount namespace of this test's own (Criterion runs each test in a
 * process of its own) with a private tmpfs over /dev/shm, when it may: the
 * pages a test crafts are then out of reach of the lull processes that run
 * on the machine meanwhile (each removes the stale pages it finds when it
 * creates its own), and the test's lullstat --list and --clean see its
 * pages alone. Without the privilege the test runs on the shared one. */
static bool isolate_dev_shm(void) {
    return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
           mount("lulltest", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=1777") == 0;
}

static bool isolated;

/* Keep the library's own page out of the way (see test_counter_page.c);
 * run with LULL_COUNTER_PAGE=off. */
static void fresh(void) {
    __atomic_store_n(&lull_config.counter_page, false,
                     __ATOMIC_RELAXED); /* the reclaim thread reads it */
    counter_page_close();
    isolated = isolate_dev_shm();
    if (access(lullstat_path(), X_OK) != 0)
        cr_assert_fail("lullstat not found at %s (build tools/ first, or set LULLSTAT)",
                       lullstat_path());
}

/* ------------------------------------------------------ running lullstat */

struct run {
    int status; /* exit code, or 128 + signal */
    char out[1 << 16];
    char err[1 << 13];
};

struct proc {
    pid_t pid;
    int out_fd, err_fd;
};

/* Start lullstat with argv (NULL-terminated, without argv[0]); `drop`:
 * run it as uid/gid 65534 (we are root). */
static struct proc start_lullstat(bool drop, const char *const *args) {
    struct proc p;
    p.out_fd = memfd_create("lullstat-out", MFD_CLOEXEC);
    p.err_fd = memfd_create("lullstat-err", MFD_CLOEXEC);
    cr_assert(p.out_fd >= 0 && p.err_fd >= 0);
    /* Opened here, so a child without the rights to walk the build
     * directory can still execute it. */
    int exe = open(lullstat_path(), O_RDONLY | O_CLOEXEC);
    cr_assert(exe >= 0, "open %s: %s", lullstat_path(), strerror(errno));
    const char *argv[32] = {"lullstat"};
    int n = 1;
    for (; args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    p.pid = fork();
    cr_assert(p.pid >= 0);
    if (p.pid == 0) {
        dup2(p.out_fd, 1);
        dup2(p.err_fd, 2);
        if (drop) {
            if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(120);
        }
        fexecve(exe, (char *const *)argv, environ);
        _exit(121);
    }
    close(exe);
    return p;
}

/* Wait (up to 10 s) until a running lullstat has written `lines` lines. */
static void wait_lines(const struct proc *p, int lines) {
    for (int i = 0; i < 1000; i++) {
        char buf[4096];
        ssize_t n = pread(p->out_fd, buf, sizeof buf, 0);
        int nl = 0;
        for (ssize_t j = 0; j < n; j++)
            nl += buf[j] == '\n';
        if (nl >= lines) return;
        sleep_ms(10);
    }
}

static void finish_lullstat(struct proc *p, struct run *r) {
    int status;
    cr_assert_eq(waitpid(p->pid, &status, 0), p->pid);
    r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    ssize_t n = pread(p->out_fd, r->out, sizeof r->out - 1, 0);
    r->out[n > 0 ? n : 0] = '\0';
    n = pread(p->err_fd, r->err, sizeof r->err - 1, 0);
    r->err[n > 0 ? n : 0] = '\0';
    close(p->out_fd);
    close(p->err_fd);
    cr_assert(r->status != 120 && r->status != 121, "could not run lullstat (%d)", r->status);
}

static struct run *run_as(bool drop, const char *const *args) {
    static struct run r;
    struct proc p = start_lullstat(drop, args);
    finish_lullstat(&p, &r);
    return &r;
}

#define LULLSTAT(...) run_as(false, (const char *const[]){__VA_ARGS__, NULL})

#define assert_contains(hay, needle)                                                               \
    cr_assert(strstr((hay), (needle)) != NULL, "expected \"%s\" in:\n%s", (needle), (hay))

/* ----------------------------------------------------------- publishers */

static void fill_sample(struct lull_counters *c, bool consistent) {
    memset(c, 0, sizeof *c);
    c->flags = LULL_COUNTERS_F_RECLAIM_THREAD;
    c->page_size = 4096;
    c->node_count = 2;
    c->backend = LULL_COUNTERS_BACKEND_URING;
    c->refault_mechanism = LULL_COUNTERS_REFAULT_UFFD_WP;
    c->purge_mode = LULL_COUNTERS_PURGE_DONTNEED;
    c->purge_delay_ms = 1500;
    c->malloc_count = 77777;
    c->free_count = 66666;
    c->reclaim_cpu_ns = 1234567890;
    c->reclaim_ticks = 4321;
    c->purge_calls[LULL_COUNTERS_BACKEND_URING] = 4242;
    c->purge_syscalls[LULL_COUNTERS_BACKEND_URING] = 17;
    c->purge_bytes[LULL_COUNTERS_BACKEND_URING] = 987654321;
    c->purge_calls[LULL_COUNTERS_BACKEND_MADVISE] = 3;
    c->purge_bytes[LULL_COUNTERS_BACKEND_MADVISE] = 12288;
    c->huge_unmapped = 5;
    c->huge_unmapped_bytes = 5 << 21;
    c->purged_pages = 1000;
    c->refault_pages = 25;
    c->refault_distance[3] = 20;
    c->refault_distance[15] = 5;
    c->refault_distance_ms_sum = 20 * 5 + 5 * 20000;
    struct lull_counters_accounting n0 = {0, 100000000, 1000, 2000, 3000, 0, 4000, 5000, 6000};
    struct lull_counters_accounting n1 = {0, 23456789, 11, 22, 33, 44, 55, 66, 77};
    n0.mapped = lull_counters_accounting_sum(&n0);
    n1.mapped = lull_counters_accounting_sum(&n1);
    c->nodes[0].node_id = 0;
    c->nodes[0].acct = n0;
    c->nodes[0].purge_bytes = 900000000;
    c->nodes[0].refault_pages = 20;
    c->nodes[1].node_id = 1;
    c->nodes[1].acct = n1;
    c->nodes[1].purge_bytes = 87666609;
    c->nodes[1].refault_pages = 5;
    struct lull_counters_accounting t = {
        n0.mapped + n1.mapped,       n0.live + n1.live,   n0.rounding + n1.rounding,
        n0.span_free + n1.span_free, n0.dirty + n1.dirty, n0.purging + n1.purging,
        n0.purged + n1.purged,       n0.warm + n1.warm,   n0.metadata + n1.metadata};
    c->total = t; /* live = 123456789 */
    if (!consistent) c->total.mapped += 4096;
    snprintf(c->config, sizeof c->config, "purge_delay=auto,backend=uring,test=\"lullstat\"");
}

struct publisher {
    pid_t pid;
};

static volatile sig_atomic_t publisher_stop;
static void on_term(int sig) {
    (void)sig;
    publisher_stop = 1;
}

/* A child that opens its page /lull.<pid> and publishes *c every ms until
 * SIGTERM; it then closes the page (removing it) and exits. (A signal, not
 * a pipe: a pipe end would leak into the other children.) */
static struct publisher start_publisher(const struct lull_counters *c) {
    int ready[2];
    cr_assert_eq(pipe2(ready, O_CLOEXEC), 0);
    struct publisher p;
    p.pid = fork();
    cr_assert(p.pid >= 0);
    if (p.pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
        /* Stop too if the test dies on a failed assertion. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1) _exit(2);
        counter_page_close();
        int rc = counter_page_open(NULL);
        if (rc == 0) counter_page_publish(c);
        if (write(ready[1], &rc, sizeof rc) != sizeof rc || rc != 0) _exit(1);
        while (!publisher_stop) {
            counter_page_publish(c);
            sleep_ms(1);
        }
        counter_page_close();
        _exit(0);
    }
    close(ready[1]);
    int rc = -1;
    cr_assert_eq(read(ready[0], &rc, sizeof rc), (ssize_t)sizeof rc);
    cr_assert_eq(rc, 0, "publisher could not open its page: %d", rc);
    close(ready[0]);
    return p;
}

static void stop_publisher(struct publisher *p) {
    kill(p->pid, SIGTERM);
    int status;
    cr_assert_eq(waitpid(p->pid, &status, 0), p->pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A child that just sleeps (a live process without a page). */
static pid_t start_sleeper(void) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    return pid;
}

static void kill_wait(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* The pid of a process that has exited and been reaped. */
static pid_t dead_pid(void) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) _exit(0);
    waitpid(pid, NULL, 0);
    return pid;
}

static uint64_t start_time_of(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long long v = 0;
    cr_assert_eq(sscanf(p + 2,
                        "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s "
                        "%*s %*s %*s %llu",
                        &v),
                 1);
    return v;
}

/* Write a page by hand: /dev/shm/<name> with the given header. */
static void craft_page(const char *name, uint64_t magic, uint64_t version, uint64_t pid,
                       uint64_t start_time, uint64_t seq) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    unlink(path);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    static struct lull_counters c;
    fill_sample(&c, true);
    c.magic = magic;
    c.abi_version = version;
    c.size = sizeof c;
    c.pid = pid;
    c.start_time = start_time;
    c.seq = seq;
    cr_assert_eq(pwrite(fd, &c, sizeof c, 0), (ssize_t)sizeof c);
    close(fd);
}

static bool shm_exists(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    return access(path, F_OK) == 0;
}

static char *pidstr(char *buf, pid_t pid) {
    sprintf(buf, "%d", (int)pid);
    return buf;
}

/* ---------------------------------------------------------------- tests */

TestSuite(lullstat, .timeout = 60);

Test(lullstat, prints_a_live_process) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    struct run *r = LULLSTAT(pidstr(pid, p.pid));
    cr_assert_eq(r->status, LS_OK, "status %d, stderr: %s", r->status, r->err);
    assert_contains(r->out, "123456789"); /* total live */
    assert_contains(r->out, "100000000"); /* node 0 live */
    assert_contains(r->out, "23456789");  /* node 1 live */
    assert_contains(r->out, "sum == mapped: ok");
    assert_contains(r->out, "node 1");
    assert_contains(r->out, "987654321"); /* uring purge bytes */
    assert_contains(r->out, "4242");
    assert_contains(r->out, "uring");
    assert_contains(r->out, "dontneed");
    assert_contains(r->out, "1500 ms");
    assert_contains(r->out, "uffd_wp");
    assert_contains(r->out, "0.0250"); /* wasted-purge ratio 25 / 1000 */
    assert_contains(r->out, "77777");
    assert_contains(r->out, "66666");
    assert_contains(r->out, "4321 ticks");
    assert_contains(r->out, "test=\"lullstat\"");
    assert_contains(r->out, "reclaim");
    assert_contains(r->out, "refault");
    assert_contains(r->out, "config");
    stop_publisher(&p);
}

Test(lullstat, identity_mismatch_is_flagged) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, false);
    struct publisher p = start_publisher(&c);
    char pid[16];
    struct run *r = LULLSTAT(pidstr(pid, p.pid));
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    assert_contains(r->out, "sum == mapped: MISMATCH");
    cr_assert_null(strstr(r->out, "sum == mapped: ok"));
    r = LULLSTAT("--json", pid);
    assert_contains(r->out, "\"identity_ok\":false");
    stop_publisher(&p);
}

/* Braces and brackets balance outside strings, and the text is one object. */
static bool json_balanced(const char *s) {
    int depth = 0;
    bool in_str = false;
    while (*s == ' ')
        s++;
    if (*s != '{') return false;
    for (; *s; s++) {
        if (in_str) {
            if (*s == '\\' && s[1])
                s++;
            else if (*s == '"')
                in_str = false;
            continue;
        }
        if (*s == '"') in_str = true;
        if (*s == '{' || *s == '[') depth++;
        if (*s == '}' || *s == ']') {
            if (--depth < 0) return false;
            if (depth == 0 && s[1] != '\n' && s[1] != '\0') return false;
        }
    }
    return depth == 0 && !in_str;
}

Test(lullstat, json) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    struct run *r = LULLSTAT("--json", pidstr(pid, p.pid));
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    cr_assert(json_balanced(r->out), "not one balanced JSON object:\n%s", r->out);
    char want[64];
    snprintf(want, sizeof want, "\"pid\":%d", (int)p.pid);
    assert_contains(r->out, want);
    assert_contains(r->out, "\"abi_version\":1");
    assert_contains(r->out, "\"accounting\":{\"mapped\":");
    assert_contains(r->out, "\"live\":123456789");
    assert_contains(r->out, "\"identity_ok\":true");
    assert_contains(r->out, "\"nodes\":[{\"node\":0");
    assert_contains(r->out, "\"backend\":\"uring\"");
    assert_contains(r->out, "\"uring\":{\"calls\":4242,\"syscalls\":17,\"bytes\":987654321}");
    assert_contains(r->out, "\"wasted_purge_ratio\":0.025");
    assert_contains(r->out, "\"malloc_count\":77777");
    assert_contains(r->out, "\"config\":\"purge_delay=auto,backend=uring,test=\\\"lullstat\\\"\"");
    stop_publisher(&p);
}

Test(lullstat, prometheus) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    struct run *r = LULLSTAT("--prom", pidstr(pid, p.pid));
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    assert_contains(r->out, "# HELP lull_live_bytes ");
    assert_contains(r->out, "# TYPE lull_live_bytes gauge");
    char want[128];
    snprintf(want, sizeof want, "lull_live_bytes{pid=\"%d\"} 123456789\n", (int)p.pid);
    assert_contains(r->out, want);
    snprintf(want, sizeof want, "lull_node_live_bytes{pid=\"%d\",node=\"1\"} 23456789\n",
             (int)p.pid);
    assert_contains(r->out, want);
    assert_contains(r->out, "# TYPE lull_purge_bytes_total counter");
    snprintf(want, sizeof want, "lull_purge_bytes_total{pid=\"%d\",backend=\"uring\"} 987654321",
             (int)p.pid);
    assert_contains(r->out, want);
    assert_contains(r->out, "# TYPE lull_refault_distance_seconds histogram");
    assert_contains(r->out, "le=\"+Inf\"} 25\n");

    /* Every sample has the lull_ prefix and a HELP and TYPE line before it
     * for its family. */
    char *save, *text = strdup(r->out);
    char family[128] = "";
    bool help = false, type = false;
    int samples = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[128];
        if (sscanf(line, "# HELP %127s", name) == 1) {
            snprintf(family, sizeof family, "%s", name);
            help = true;
            type = false;
            continue;
        }
        if (sscanf(line, "# TYPE %127s", name) == 1) {
            cr_assert_str_eq(name, family);
            type = true;
            continue;
        }
        cr_assert(line[0] != '#', "stray comment: %s", line);
        cr_assert(strncmp(line, "lull_", 5) == 0, "sample without lull_ prefix: %s", line);
        cr_assert(help && type, "sample before HELP/TYPE: %s", line);
        cr_assert(strncmp(line, family, strlen(family)) == 0, "sample %s outside family %s", line,
                  family);
        samples++;
    }
    free(text);
    cr_assert(samples > 40, "%d samples", samples);
    stop_publisher(&p);
}

Test(lullstat, interval_lines_and_count) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    struct run *r = LULLSTAT("-i", "50", "-n", "3", pidstr(pid, p.pid));
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    int lines = 0;
    for (char *s = r->out; *s; s++)
        lines += *s == '\n';
    cr_assert_eq(lines, 4, "want header + 3 lines:\n%s", r->out);
    assert_contains(r->out, "mapped");
    assert_contains(r->out, "118M"); /* total live 123456789 bytes */

    r = LULLSTAT("-i", "20", "-n", "25", pid);
    cr_assert_eq(r->status, LS_OK);
    int headers = 0;
    for (char *s = r->out; (s = strstr(s, "mapped")); s++)
        headers++;
    cr_assert_eq(headers, 2, "a header every 20 lines:\n%s", r->out);

    r = LULLSTAT("--json", "-i", "20", "-n", "2", pid);
    cr_assert_eq(r->status, LS_OK);
    char *second = strchr(r->out, '\n');
    cr_assert(second && json_balanced(second + 1));
    stop_publisher(&p);
}

Test(lullstat, interval_stops_on_ctrl_c) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    pidstr(pid, p.pid);
    struct proc lp = start_lullstat(false, (const char *const[]){"-i", "30", pid, NULL});
    /* Lines come out once the SIGINT handler is in place: wait for three. */
    wait_lines(&lp, 3);
    kill(lp.pid, SIGINT);
    static struct run r;
    finish_lullstat(&lp, &r);
    cr_assert_eq(r.status, LS_OK, "status %d", r.status);
    int lines = 0;
    for (char *s = r.out; *s; s++)
        lines += *s == '\n';
    cr_assert(lines >= 3, "%d lines", lines);
    stop_publisher(&p);
}

Test(lullstat, interval_ends_when_process_exits) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16];
    pidstr(pid, p.pid);
    struct proc lp = start_lullstat(false, (const char *const[]){"-i", "20", pid, NULL});
    wait_lines(&lp, 3);
    stop_publisher(&p);
    static struct run r;
    finish_lullstat(&lp, &r);
    cr_assert_eq(r.status, LS_NOPROC, "status %d", r.status);
    assert_contains(r.err, "exited");
}

Test(lullstat, bad_pid) {
    fresh();
    char pid[16];
    struct run *r = LULLSTAT(pidstr(pid, dead_pid()));
    cr_assert_eq(r->status, LS_NOPROC);
    assert_contains(r->err, "no such process");
    r = LULLSTAT("abc");
    cr_assert_eq(r->status, LS_USAGE);
    assert_contains(r->err, "bad pid");
    r = LULLSTAT("-i", "0", "1");
    cr_assert_eq(r->status, LS_USAGE);
}

Test(lullstat, missing_page) {
    fresh();
    pid_t s = start_sleeper();
    char pid[16];
    struct run *r = LULLSTAT(pidstr(pid, s));
    kill_wait(s);
    cr_assert_eq(r->status, LS_NOPAGE, "status %d: %s", r->status, r->err);
    assert_contains(r->err, "no counter page");
    r = LULLSTAT("--name", "lulltest-no-such-page");
    cr_assert_eq(r->status, LS_NOPAGE);
}

Test(lullstat, unknown_version) {
    fresh();
    pid_t s = start_sleeper();
    char name[64], pid[16];
    snprintf(name, sizeof name, "lull.%d", (int)s);
    craft_page(name, LULL_COUNTERS_MAGIC, 999, (uint64_t)s, start_time_of(s), 2);
    struct run *r = LULLSTAT(pidstr(pid, s));
    int status = r->status;
    static char err[sizeof((struct run *)0)->err];
    snprintf(err, sizeof err, "%s", r->err);
    r = LULLSTAT("--name", name);
    kill_wait(s);
    shm_unlink(name);
    cr_assert_eq(status, LS_VERSION, "status %d: %s", status, err);
    assert_contains(err, "version 999");
    assert_contains(err, "knows version 1");
    cr_assert_eq(r->status, LS_VERSION);
    assert_contains(r->err, "999");
}

Test(lullstat, not_a_counter_page) {
    fresh();
    char name[64];
    snprintf(name, sizeof name, "lulltest-badmagic-%d", (int)getpid());
    craft_page(name, 0x1234, 1, (uint64_t)getpid(), 0, 2);
    struct run *r = LULLSTAT("--name", name);
    shm_unlink(name);
    cr_assert_eq(r->status, LS_VERSION);
    assert_contains(r->err, "not a lull counter page");
}

Test(lullstat, permission_denied) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char pid[16], name[64], path[128];
    pidstr(pid, p.pid);
    snprintf(name, sizeof name, "lull.%d", (int)p.pid);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    bool root = geteuid() == 0;
    if (!root) cr_assert_eq(chmod(path, 0), 0); /* our own page, unreadable */
    /* As root, drop to uid 65534 in the child: root would read any page. */
    struct run *r = run_as(root, (const char *const[]){pid, NULL});
    if (!root) chmod(path, 0600);
    cr_assert_eq(r->status, LS_PERM, "status %d: %s%s", r->status, r->out, r->err);
    assert_contains(r->err, "permission denied");
    stop_publisher(&p);
}

Test(lullstat, torn_snapshot_is_reported, .timeout = 30) {
    fresh();
    pid_t s = start_sleeper();
    char name[64], pid[16];
    snprintf(name, sizeof name, "lull.%d", (int)s);
    /* seq odd forever: the writer died in the middle of a publication */
    craft_page(name, LULL_COUNTERS_MAGIC, 1, (uint64_t)s, start_time_of(s), 5);
    struct run *r = LULLSTAT(pidstr(pid, s));
    kill_wait(s);
    shm_unlink(name);
    cr_assert_eq(r->status, LS_TORN, "status %d: %s", r->status, r->err);
    assert_contains(r->err, "no consistent snapshot");
}

Test(lullstat, stale_pages_listed_and_cleaned) {
    fresh();
    /* a page whose process is gone */
    pid_t dead = dead_pid();
    char dead_name[64], pid[16];
    snprintf(dead_name, sizeof dead_name, "lull.%d", (int)dead);
    craft_page(dead_name, LULL_COUNTERS_MAGIC, 1, (uint64_t)dead, 12345, 2);
    /* another dead one, named with a non-pid name (as --name pages are) */
    char other_name[64];
    snprintf(other_name, sizeof other_name, "lull.test-other-%d", (int)getpid());
    craft_page(other_name, LULL_COUNTERS_MAGIC, 1, (uint64_t)dead, 12345, 2);
    /* a page whose pid was reused by another (live) process */
    pid_t s = start_sleeper();
    char reused_name[64];
    snprintf(reused_name, sizeof reused_name, "lull.%d", (int)s);
    craft_page(reused_name, LULL_COUNTERS_MAGIC, 1, (uint64_t)s, start_time_of(s) + 1000, 2);
    /* and a live page */
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char live_name[64];
    snprintf(live_name, sizeof live_name, "lull.%d", (int)p.pid);

    struct run *r = LULLSTAT("--list");
    cr_assert_eq(r->status, LS_OK);
    char line[256];
    snprintf(line, sizeof line, "/%s", dead_name);
    char *at = strstr(r->out, line);
    cr_assert(at, "dead page not listed:\n%s", r->out);
    cr_assert(strstr(at, "stale") && strstr(at, "stale") < strchr(at, '\n'), "%s", r->out);
    snprintf(line, sizeof line, "/%s", reused_name);
    at = strstr(r->out, line);
    cr_assert(at && strstr(at, "stale") < strchr(at, '\n'), "%s", r->out);
    snprintf(line, sizeof line, "/%s", live_name);
    at = strstr(r->out, line);
    cr_assert(at, "live page not listed:\n%s", r->out);
    char *eol = strchr(at, '\n');
    cr_assert(strstr(at, "alive") && strstr(at, "alive") < eol, "%s", r->out);
    cr_assert(strstr(at, "test_lullstat") && strstr(at, "test_lullstat") < eol,
              "command name of the live process missing:\n%s", r->out);

    /* lullstat on the dead pid mentions the stale page; on the reused pid
     * it refuses the page. */
    r = LULLSTAT(pidstr(pid, dead));
    cr_assert_eq(r->status, LS_NOPROC);
    assert_contains(r->err, "stale");
    r = LULLSTAT(pidstr(pid, s));
    cr_assert_eq(r->status, LS_STALE, "status %d: %s", r->status, r->err);

    /* --clean with names/pids touches only those (a plain --clean would
     * also remove stale pages other tests running now may be looking at). */
    char dead_pid_arg[16];
    pidstr(dead_pid_arg, dead);
    r = LULLSTAT("--clean", dead_pid_arg, reused_name, live_name);
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    snprintf(line, sizeof line, "removed /%s", dead_name);
    assert_contains(r->out, line);
    snprintf(line, sizeof line, "removed /%s", reused_name);
    assert_contains(r->out, line);
    cr_assert(!shm_exists(dead_name));
    cr_assert(!shm_exists(reused_name));
    cr_assert(shm_exists(live_name), "--clean removed a live page");
    snprintf(line, sizeof line, "kept /%s", live_name);
    assert_contains(r->out, line);
    cr_assert(shm_exists(other_name), "--clean PID... removed a page it was not given");

    /* by name; and a page that is not there */
    r = LULLSTAT("--clean", other_name);
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    cr_assert(!shm_exists(other_name));
    r = LULLSTAT("--clean", other_name);
    cr_assert_eq(r->status, LS_NOPAGE);

    kill_wait(s);
    stop_publisher(&p);
    cr_assert(!shm_exists(live_name));
}

/* A header-less lull.* object of another user is not lull's to remove:
 * root's --clean removed a text file of uid 65534 named lull.* as "no
 * header" (session 22's review). Our own such object still goes. */
static void headerless(const char *name, uid_t owner) {
    char path[128];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0644);
    cr_assert_geq(fd, 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, "not a counter page\n", 19), 19);
    close(fd);
    cr_assert_eq(chown(path, owner, (gid_t)-1), 0);
    struct timeval old[2] = {{time(NULL) - 60, 0}, {time(NULL) - 60, 0}};
    cr_assert_eq(utimes(path, old), 0); /* past the 2 s a writer has to fill it */
}

Test(lullstat, clean_leaves_another_users_headerless_object) {
    if (geteuid() != 0) cr_skip_test("needs root, to make a file of another user");
    fresh();
    char theirs[64], ours[64];
    snprintf(theirs, sizeof theirs, "lull.test-theirs-%d", (int)getpid());
    snprintf(ours, sizeof ours, "lull.test-ours-%d", (int)getpid());
    headerless(theirs, 65534);
    headerless(ours, 0);
    struct run *r = LULLSTAT("--clean", theirs, ours);
    bool kept = shm_exists(theirs);
    shm_unlink(theirs);
    cr_assert(kept, "--clean removed another user's file: %s%s", r->out, r->err);
    cr_assert_not(shm_exists(ours), "our own header-less object stayed: %s%s", r->out, r->err);
    char line[128];
    snprintf(line, sizeof line, "kept /%s", theirs);
    assert_contains(r->out, line);
}

/* The same with a name that says a pid, of a process that is gone: a
 * header-less lull.<pid> was judged by its name alone ("process gone"), and
 * a lull.<pid>.heap (a profile has no header either) went once no page was
 * there, whoever owned them: root's --clean removed both files of uid
 * 65534. Our own lull.<pid>.heap still goes. */
Test(lullstat, clean_leaves_another_users_files_named_for_a_dead_pid) {
    if (geteuid() != 0) cr_skip_test("needs root, to make a file of another user");
    fresh();
    pid_t dead = dead_pid(), ours_dead = dead_pid();
    char theirs[64], theirs_heap[64], ours_heap[64], arg[16], arg_ours[16];
    snprintf(theirs, sizeof theirs, "lull.%d", (int)dead);
    snprintf(theirs_heap, sizeof theirs_heap, "lull.%d.heap", (int)dead);
    snprintf(ours_heap, sizeof ours_heap, "lull.%d.heap", (int)ours_dead);
    headerless(theirs, 65534);
    headerless(theirs_heap, 65534);
    headerless(ours_heap, 0);
    struct run *r = LULLSTAT("--clean", pidstr(arg, dead), pidstr(arg_ours, ours_dead));
    bool kept = shm_exists(theirs), kept_heap = shm_exists(theirs_heap);
    shm_unlink(theirs);
    shm_unlink(theirs_heap);
    cr_assert(kept, "--clean removed another user's header-less %s: %s%s", theirs, r->out, r->err);
    cr_assert(kept_heap, "--clean removed another user's %s: %s%s", theirs_heap, r->out, r->err);
    cr_assert_not(shm_exists(ours_heap), "our own profile file stayed: %s%s", r->out, r->err);
    cr_assert_eq(r->status, LS_OK, "stdout: %s\nstderr: %s", r->out, r->err);
    char line[128];
    snprintf(line, sizeof line, "kept /%s", theirs);
    assert_contains(r->out, line);
}

Test(lullstat, named_page) {
    fresh();
    char name[64];
    snprintf(name, sizeof name, "lulltest-named-%d", (int)getpid());
    cr_assert_eq(counter_page_open(name), 0);
    static struct lull_counters c;
    fill_sample(&c, true);
    counter_page_publish(&c);
    struct run *r = LULLSTAT("--name", name);
    cr_assert_eq(r->status, LS_OK, "stderr: %s", r->err);
    assert_contains(r->out, "123456789");
    counter_page_close();
}

/* ------------------------------------------------- hostile pages */

/* Wait up to 10 s for a started lullstat to exit (far more than it takes:
 * one still running then is blocked for good); false if it did not, and it
 * is killed. */
static bool finish_within_10s(struct proc *p, struct run *r) {
    for (int i = 0; i < 1000; i++) {
        int status;
        pid_t w = waitpid(p->pid, &status, WNOHANG);
        cr_assert_neq(w, -1);
        if (w == p->pid) {
            r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            ssize_t n = pread(p->out_fd, r->out, sizeof r->out - 1, 0);
            r->out[n > 0 ? n : 0] = '\0';
            n = pread(p->err_fd, r->err, sizeof r->err - 1, 0);
            r->err[n > 0 ? n : 0] = '\0';
            close(p->out_fd);
            close(p->err_fd);
            return true;
        }
        sleep_ms(10);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    close(p->out_fd);
    close(p->err_fd);
    return false;
}

/* A page truncated to `cut` bytes while lullstat -i reads it (by its
 * writer's replacement, or anyone who can write it): a clear error, and
 * lullstat stops. */
static void expect_truncation_reported(off_t cut) {
    fresh();
    pid_t s = start_sleeper();
    char name[64], path[128], pid[16];
    snprintf(name, sizeof name, "lull.%d", (int)s);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    craft_page(name, LULL_COUNTERS_MAGIC, 1, (uint64_t)s, start_time_of(s), 2);
    struct proc lp = start_lullstat(false, (const char *const[]){"-i", "20", pidstr(pid, s), NULL});
    wait_lines(&lp, 3); /* it has the page mapped and reads it */
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    cr_assert_eq(ftruncate(fd, cut), 0);
    close(fd);
    static struct run r;
    bool done = finish_within_10s(&lp, &r);
    kill_wait(s);
    unlink(path);
    cr_assert(done, "lullstat -i went on running on a page cut to %lld bytes", (long long)cut);
    cr_assert_eq(r.status, 1, "status %d (135: SIGBUS); stderr: %s", r.status, r.err);
    assert_contains(r.err, "truncated");
}

/* Cut to nothing: reads of the mapping raise SIGBUS, caught. */
Test(lullstat, page_truncated_while_reading_is_an_error) {
    expect_truncation_reported(0);
}

/* Cut inside its last page of memory: reads past the cut give zeros, not
 * SIGBUS; lullstat must see from the size that the page is no longer
 * whole, and not print what the zeros make of it. */
Test(lullstat, page_truncated_within_its_last_page_is_an_error) {
    long page = sysconf(_SC_PAGESIZE);
    off_t cut = (off_t)(sizeof(struct lull_counters) - 1) / page * page + 8;
    cr_assert_lt(cut, (off_t)sizeof(struct lull_counters));
    expect_truncation_reported(cut);
}

/* A FIFO where a page is looked for (the default name is predictable):
 * not a counter page, at once; opening it used to block for ever. */
Test(lullstat, fifo_is_not_a_page_and_does_not_block) {
    fresh();
    char name[64], path[128];
    snprintf(name, sizeof name, "lulltest-fifo-%d", (int)getpid());
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    unlink(path);
    cr_assert_eq(mkfifo(path, 0600), 0);
    static struct run r;
    struct proc lp = start_lullstat(false, (const char *const[]){"--name", name, NULL});
    bool done = finish_within_10s(&lp, &r);
    unlink(path);
    cr_assert(done, "lullstat --name blocked on a FIFO");
    cr_assert_eq(r.status, LS_VERSION, "status %d: %s", r.status, r.err);
    assert_contains(r.err, "not a lull counter page");
    assert_contains(r.err, "FIFO");

    /* the same at a live process's default name */
    pid_t s = start_sleeper();
    char pid[16];
    snprintf(path, sizeof path, "/dev/shm/lull.%d", (int)s);
    cr_assert_eq(mkfifo(path, 0600), 0);
    lp = start_lullstat(false, (const char *const[]){pidstr(pid, s), NULL});
    done = finish_within_10s(&lp, &r);
    kill_wait(s);
    unlink(path);
    cr_assert(done, "lullstat PID blocked on a FIFO");
    cr_assert_eq(r.status, LS_VERSION, "status %d: %s", r.status, r.err);
}

static bool has_control_bytes(const char *s) {
    for (; *s; s++)
        if (((unsigned char)*s < 0x20 && *s != '\n') || (unsigned char)*s == 0x7f) return true;
    return false;
}

/* Text that other users control - a page's config string, a process's
 * name, a file name in /dev/shm - is printed with its control characters
 * escaped (\xNN), never raw to the terminal. */
Test(lullstat, control_characters_are_escaped) {
    fresh();
    static const char evil[] = "\x1b]0;owned\x07\x1b[2J\r\x7f";
    /* a live writer whose name has an escape sequence */
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t s = fork();
    cr_assert(s >= 0);
    if (s == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        prctl(PR_SET_NAME, "ev\x1b[31mil", 0, 0, 0);
        if (write(ready[1], "r", 1) != 1) _exit(1);
        for (;;)
            pause();
    }
    char go;
    cr_assert_eq(read(ready[0], &go, 1), 1);
    close(ready[0]);
    close(ready[1]);
    char name[64], path[128], pid[16];
    snprintf(name, sizeof name, "lull.%d", (int)s);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    craft_page(name, LULL_COUNTERS_MAGIC, 1, (uint64_t)s, start_time_of(s), 2);
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0);
    char config[LULL_COUNTERS_CONFIG_LEN] = {0};
    snprintf(config, sizeof config, "purge_delay_ms=auto%s,numa=local", evil);
    cr_assert_eq(pwrite(fd, config, sizeof config, offsetof(struct lull_counters, config)),
                 (ssize_t)sizeof config);
    close(fd);
    /* and a page whose file name has one */
    char odd[64], odd_path[128];
    snprintf(odd, sizeof odd, "lull.test\x1b[2J-%d", (int)getpid());
    snprintf(odd_path, sizeof odd_path, "/dev/shm/%s", odd);
    craft_page(odd, LULL_COUNTERS_MAGIC, 1, (uint64_t)s, start_time_of(s), 2);

    struct run *r = LULLSTAT(pidstr(pid, s));
    int status = r->status;
    static char out[sizeof r->out];
    memcpy(out, r->out, sizeof out);
    struct run *l = LULLSTAT("--list");
    kill_wait(s);
    unlink(path);
    unlink(odd_path);
    cr_assert_eq(status, LS_OK);
    cr_assert_not(has_control_bytes(out), "control characters printed raw:\n%s", out);
    assert_contains(out, "purge_delay_ms=auto\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x7f,numa=local");
    assert_contains(out, "(ev\\x1b[31mil)");
    cr_assert_eq(l->status, LS_OK);
    cr_assert_not(has_control_bytes(l->out), "control characters printed raw:\n%s", l->out);
    char want[80];
    snprintf(want, sizeof want, "/lull.test\\x1b[2J-%d", (int)getpid());
    assert_contains(l->out, want);
    assert_contains(l->out, "ev\\x1b[31mil");
}

/* ------------------------------------------------ PID namespaces */

/* A publisher that is pid 1 of a PID namespace of its own: this program
 * again (LULL_TEST_LULLSTAT_ROLE=publisher), started by a raw clone with
 * CLONE_NEWPID, so that it is a lull process of its own. It opens its page,
 * publishes the sample, says "ready" on fd 3 and holds until its stdin
 * closes. */
__attribute__((constructor(200))) static void lullstat_role(void) {
    const char *role = getenv("LULL_TEST_LULLSTAT_ROLE");
    if (!role || strcmp(role, "publisher") != 0) return;
    static struct lull_counters c;
    fill_sample(&c, true);
    int rc = counter_page_open(NULL);
    if (rc == 0) counter_page_publish(&c);
    dprintf(3, "rc=%d\npid=%d\nname=%s\n", rc, (int)getpid(),
            counter_page_name() ? counter_page_name() : "");
    close(3);
    char b;
    while (read(0, &b, 1) > 0) {
    }
    exit(0);
}

struct ns_publisher {
    pid_t pid; /* as this test sees it */
    int hold;
    char report[512];
};

/* false if a PID namespace cannot be made here */
static bool start_ns_publisher(struct ns_publisher *p) {
    static char *envp[512];
    size_t n = 0;
    for (char **e = environ; *e && n < 510; e++)
        envp[n++] = *e;
    envp[n++] = "LULL_TEST_LULLSTAT_ROLE=publisher";
    envp[n] = NULL;
    int r[2], h[2];
    cr_assert_eq(pipe2(r, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(h, O_CLOEXEC), 0);
    fflush(NULL);
    p->pid = (pid_t)syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0);
    if (p->pid < 0) {
        close(r[0]), close(r[1]), close(h[0]), close(h[1]);
        return false;
    }
    if (p->pid == 0) {
        dup2(h[0], 0);
        dup2(r[1], 3);
        char *const argv[] = {"ns_publisher", NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(r[1]);
    close(h[0]);
    p->hold = h[1];
    size_t len = 0;
    for (;;) { /* until EOF: the publisher closes fd 3 once it has said all */
        struct pollfd pf = {r[0], POLLIN, 0};
        cr_assert_eq(poll(&pf, 1, 60000), 1, "no word from the publisher in its PID namespace");
        ssize_t got = read(r[0], p->report + len, sizeof p->report - 1 - len);
        if (got <= 0) break;
        len += (size_t)got;
    }
    p->report[len] = '\0';
    close(r[0]);
    cr_assert(strstr(p->report, "rc=0\n"), "the publisher could not open its page: %s", p->report);
    return true;
}

/* lullstat PID takes PID as this lullstat's /proc shows it: for a process
 * in another PID namespace (pid 1 there) it finds the page under the name
 * that process gave it, lull.<its pid>.<its namespace>. --list says it is
 * alive, and --clean leaves it; once the process is killed, the page is
 * stale and --clean removes it. (lullstat looked for lull.<PID>, found
 * nothing, and --clean took the live page of a pid 1 for stale: /proc/1 is
 * another process.) */
Test(lullstat, a_process_in_another_pid_namespace_is_found_by_its_pid) {
    fresh();
    if (!isolated) cr_skip_test("no mount namespace of our own (needs CAP_SYS_ADMIN)");
    struct ns_publisher p;
    if (!start_ns_publisher(&p)) cr_skip_test("clone(CLONE_NEWPID): %s", strerror(errno));
    cr_assert(strstr(p.report, "pid=1\n"), "%s", p.report);
    const char *nm = strstr(p.report, "name=");
    cr_assert(nm);
    char name[128];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(nm + 6, "\n"), nm + 6); /* without '/' */
    cr_assert(strncmp(name, "lull.1.", 7) == 0, "page name %s", name);
    char pid[16];
    pidstr(pid, p.pid);

    struct run *r = LULLSTAT(pid);
    cr_assert_eq(r->status, LS_OK, "lullstat %s: status %d: %s", pid, r->status, r->err);
    assert_contains(r->out, "123456789");
    assert_contains(r->out, name);
    char want[64];
    snprintf(want, sizeof want, "pid %s", pid);
    assert_contains(r->out, want);
    cr_assert_null(strstr(r->out, "exited"), "%s", r->out);
    r = LULLSTAT("--json", pid);
    cr_assert_eq(r->status, LS_OK, "%s", r->err);
    assert_contains(r->out, "\"alive\":true");

    r = LULLSTAT("--list");
    cr_assert_eq(r->status, LS_OK);
    char *at = strstr(r->out, name);
    cr_assert(at, "page not listed:\n%s", r->out);
    char *eol = strchr(at, '\n');
    cr_assert(strstr(at, "alive") && strstr(at, "alive") < eol, "%s", r->out);
    cr_assert(strstr(at, pid) && strstr(at, pid) < eol, "the pid as we see it is not listed:\n%s",
              r->out);

    r = LULLSTAT("--clean");
    cr_assert_eq(r->status, LS_OK, "%s", r->err);
    cr_assert(shm_exists(name),
              "--clean removed the live page of a process in another PID "
              "namespace:\n%s",
              r->out);

    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    close(p.hold);
    cr_assert(shm_exists(name));
    r = LULLSTAT("--list");
    at = strstr(r->out, name);
    cr_assert(at, "%s", r->out);
    eol = strchr(at, '\n');
    cr_assert(strstr(at, "stale") && strstr(at, "stale") < eol, "%s", r->out);
    r = LULLSTAT("--clean");
    cr_assert_eq(r->status, LS_OK, "%s", r->err);
    cr_assert(!shm_exists(name), "--clean left the page of a killed process:\n%s", r->out);
}

/* The same in a normal process, and a named page: a writer killed with
 * SIGKILL leaves a page nobody holds; --list says stale, --clean removes
 * it, by pid or all at once. */
Test(lullstat, a_killed_writers_page_is_stale_and_cleaned) {
    fresh();
    static struct lull_counters c;
    fill_sample(&c, true);
    struct publisher p = start_publisher(&c);
    char name[64], pid[16];
    snprintf(name, sizeof name, "lull.%d", (int)p.pid);
    pidstr(pid, p.pid);
    kill(p.pid, SIGKILL);
    waitpid(p.pid, NULL, 0);
    cr_assert(shm_exists(name));
    struct run *r = LULLSTAT("--list");
    char *at = strstr(r->out, name);
    cr_assert(at, "%s", r->out);
    cr_assert(strstr(at, "stale") && strstr(at, "stale") < strchr(at, '\n'), "%s", r->out);
    r = LULLSTAT("--clean", pid);
    cr_assert_eq(r->status, LS_OK, "%s", r->err);
    cr_assert(!shm_exists(name), "%s", r->out);
}
