/* Every kernel call lull makes, made to fail (base/fault.h), and what lull
 * must do then (design.md invariant 5: degrade to the next mechanism, say
 * so, never lose a block or crash the program):
 *
 *   mmap             segment and huge mappings: NULL + ENOMEM, the blocks
 *                    that exist stay intact, allocation works once disarmed
 *   uring_setup      no ring: the backend falls back, the stats say which
 *                    and flag DEGRADED, and purging still gives memory back
 *   uring_submit,    at open (the probe) and in the middle of a run: the
 *   uring_cqe        ranges are still purged, the fallback is counted
 *   process_madvise  falls back to madvise
 *   (a full ring)    more ranges in one tick than the ring holds: all purged
 *   uffd             refault_monitor=on without userfaultfd: the monitor
 *                    falls back and the stats report the mechanism in use
 *   shm_open         no counter page: one message, the program goes on
 *   thread_create    no reclaim thread: one clear message,
 *                    lull_reclaim_now() is false, freed memory is reused;
 *                    with inline_purge=on huge frees are unmapped at once
 *
 * Faults that must be set before lull starts (LULL_FAULT read at start,
 * LULL_CONF) run in a new process of this very program: the constructor
 * below sees LULL_FI_CHILD, runs the scenario of that name before Criterion
 * starts, prints what it found and exits with 0 (passed), 77 (the machine
 * lacks the mechanism) or 1. The parent checks the exit status and the
 * child's stderr (lull's messages). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/fault.h"
#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define PAGE ((size_t)4096)
#define CHILD_SKIP 77

extern char **environ;

/* ---- helpers usable in the child (no Criterion there) ------------------- */

/* Resident bytes of [p, p + len) (mincore); an unmapped range has none. */
static size_t resident_bytes(const void *p, size_t len) {
    unsigned char vec[4096];
    size_t total = 0;
    for (size_t off = 0; off < len; off += sizeof vec * PAGE) {
        size_t l = len - off < sizeof vec * PAGE ? len - off : sizeof vec * PAGE;
        if (mincore((char *)p + off, l, vec) != 0) continue; /* ENOMEM: unmapped */
        for (size_t i = 0; i < (l + PAGE - 1) / PAGE; i++)
            total += (vec[i] & 1) * PAGE;
    }
    return total;
}

static void touch(void *p, size_t len, unsigned char v) {
    volatile unsigned char *b = p;
    for (size_t i = 0; i < len; i += PAGE)
        b[i] = v;
    if (len) b[len - 1] = v;
}

static bool touched_with(const void *p, size_t len, unsigned char v) {
    const volatile unsigned char *b = p;
    for (size_t i = 0; i < len; i += PAGE)
        if (b[i] != v) return false;
    return !len || b[len - 1] == v;
}

static int child_failures;

__attribute__((format(printf, 3, 4))) static void child_fail(const char *cond, int line,
                                                             const char *fmt, ...) {
    printf("FAIL line %d: %s: ", line, cond);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    child_failures++;
}
#define CCHECK(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) child_fail(#cond, __LINE__, __VA_ARGS__);                                     \
    } while (0)

static struct lull_counters stats_now(void) {
    struct lull_counters c;
    memset(&c, 0, sizeof c);
    if (lull_stats(&c) != 0) child_fail("lull_stats", __LINE__, "failed");
    return c;
}

static uint64_t purged_by_all(const struct lull_counters *c) {
    uint64_t t = 0;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        t += c->purge_bytes[k];
    return t;
}

/* A 12 MiB block (a large span inside a segment), touched, freed, then two
 * reclaim ticks: its pages must have left memory and RSS must have fallen.
 * The children run with purge_delay_ms=0, purge_mode=dontneed and no warm
 * reserve, so nothing keeps the pages on purpose. */
static void check_purging_works(const char *what) {
    const size_t len = 12 * MiB;
    char *p = lull_malloc(len);
    CCHECK(p != NULL, "%s: malloc(12 MiB)", what);
    if (!p) return;
    touch(p, len, 0x5a);
    size_t rss_before = rss_bytes(), res_before = resident_bytes(p, len);
    struct lull_counters c0 = stats_now();
    uint64_t purged_before = purged_by_all(&c0);
    lull_free(p);
    CCHECK(lull_reclaim_now(), "%s: no reclaim thread", what);
    lull_reclaim_now();
    size_t res_after = resident_bytes(p, len), rss_after = rss_bytes();
    struct lull_counters c1 = stats_now();
    printf("%s: block resident %zu -> %zu KiB, RSS %zu -> %zu KiB, purged +%llu KiB\n", what,
           res_before >> 10, res_after >> 10, rss_before >> 10, rss_after >> 10,
           (unsigned long long)(purged_by_all(&c1) - purged_before) >> 10);
    CCHECK(res_before >= len * 9 / 10, "%s: the block was not resident before", what);
    CCHECK(res_after <= len / 16, "%s: %zu KiB of the freed block still resident", what,
           res_after >> 10);
    CCHECK(rss_after + len / 2 <= rss_before, "%s: RSS did not fall (%zu -> %zu KiB)", what,
           rss_before >> 10, rss_after >> 10);
    CCHECK(purged_by_all(&c1) >= purged_before + len * 3 / 4,
           "%s: the stats count no purge of the block", what);
}

/* The reclaim thread has opened its backend once it has ticked. */
static struct lull_counters stats_after_start(void) {
    CCHECK(lull_reclaim_now(), "no reclaim thread");
    return stats_now();
}

/* ---- the scenarios ------------------------------------------------------ */

/* io_uring unusable from the start (LULL_FAULT=uring_setup, uring_submit:1
 * or uring_cqe:1, the last two failing the probe at open). */
static void scenario_uring_at_open(void) {
    struct lull_counters c = stats_after_start();
    printf("backend %s, fallbacks %llu, flags %#llx\n", lull_counters_backend_name(c.backend),
           (unsigned long long)c.backend_fallbacks, (unsigned long long)c.flags);
    CCHECK(c.backend == LULL_COUNTERS_BACKEND_PROCESS_MADVISE ||
               c.backend == LULL_COUNTERS_BACKEND_MADVISE,
           "backend %s", lull_counters_backend_name(c.backend));
    CCHECK(c.flags & LULL_COUNTERS_F_DEGRADED, "DEGRADED not set");
    CCHECK(c.flags & LULL_COUNTERS_F_RECLAIM_THREAD, "no reclaim thread");
    CCHECK(c.backend_fallbacks >= 1, "no fallback counted");
    check_purging_works("after io_uring failed at open");
    struct lull_counters d = stats_now();
    CCHECK(d.purge_bytes[LULL_COUNTERS_BACKEND_URING] == 0, "io_uring purged %llu bytes",
           (unsigned long long)d.purge_bytes[LULL_COUNTERS_BACKEND_URING]);
    CCHECK(d.purge_bytes[d.backend] > 0, "the backend in use purged nothing");
}

/* io_uring works at start, then a submit or a completion fails in the
 * middle of a run (armed here, after the reclaim thread opened its ring). */
static void scenario_uring_mid_run(lull_fault_point point) {
    struct lull_counters c = stats_after_start();
    if (c.backend != LULL_COUNTERS_BACKEND_URING) {
        printf("skip: the backend is %s here, not io_uring\n",
               lull_counters_backend_name(c.backend));
        fflush(stdout);
        _exit(CHILD_SKIP);
    }
    CCHECK(!(c.flags & LULL_COUNTERS_F_DEGRADED), "DEGRADED before any fault");
    lull_fault_arm(point, 1);
    check_purging_works("a uring fault in the middle of a run");
    struct lull_counters d = stats_now();
    printf("backend %s, fallbacks %llu -> %llu, flags %#llx, errors %llu\n",
           lull_counters_backend_name(d.backend), (unsigned long long)c.backend_fallbacks,
           (unsigned long long)d.backend_fallbacks, (unsigned long long)d.flags,
           (unsigned long long)d.purge_errors);
    CCHECK(lull_fault_armed[point] == 0, "the armed fault was never hit");
    CCHECK(d.backend_fallbacks > c.backend_fallbacks, "no fallback counted");
    CCHECK(d.backend != LULL_COUNTERS_BACKEND_URING, "still on the failed ring");
    CCHECK(d.flags & LULL_COUNTERS_F_DEGRADED, "DEGRADED not set");
    /* the next purge uses the new mechanism */
    check_purging_works("after the fallback");
}

/* Neither io_uring nor process_madvise: plain madvise. */
static void scenario_madvise_only(void) {
    struct lull_counters c = stats_after_start();
    CCHECK(c.backend == LULL_COUNTERS_BACKEND_MADVISE, "backend %s",
           lull_counters_backend_name(c.backend));
    CCHECK(c.flags & LULL_COUNTERS_F_DEGRADED, "DEGRADED not set");
    check_purging_works("madvise only");
    struct lull_counters d = stats_now();
    CCHECK(d.purge_bytes[LULL_COUNTERS_BACKEND_MADVISE] > 0, "madvise purged nothing");
    CCHECK(d.purge_bytes[LULL_COUNTERS_BACKEND_PROCESS_MADVISE] == 0, "process_madvise used");
}

/* More freed runs in one tick than the ring has entries: blocks of 576 KiB
 * (large spans of 9 slices), every other one freed, so each freed block is
 * a run of its own. Every freed block must leave memory, every kept block
 * stay intact and resident. */
#define RING_BLOCKS 640 /* 320 freed runs > 256 ring entries */
static void scenario_full_ring(void) {
    const size_t size = 576 * KiB;
    static char *blocks[RING_BLOCKS];
    struct lull_counters c = stats_after_start();
    for (int i = 0; i < RING_BLOCKS; i++) {
        blocks[i] = lull_malloc(size);
        CCHECK(blocks[i] != NULL, "malloc %d", i);
        if (!blocks[i]) return;
        /* one page per 64 KiB slice: every slice has something to purge */
        for (size_t off = 0; off < size; off += 64 * KiB)
            blocks[i][off] = (char)(i | 1);
    }
    /* freed all at once, so a single tick finds them all */
    lull_set_purge_delay_ms(-1);
    for (int i = 0; i < RING_BLOCKS; i += 2)
        lull_free(blocks[i]);
    lull_set_purge_delay_ms(0);
    CCHECK(lull_reclaim_now(), "no reclaim thread");
    lull_reclaim_now();
    struct lull_counters d = stats_now();
    size_t still = 0;
    int bad = 0;
    for (int i = 0; i < RING_BLOCKS; i++) {
        if (i % 2 == 0) {
            still += resident_bytes(blocks[i], size);
            continue;
        }
        for (size_t off = 0; off < size; off += 64 * KiB)
            if (blocks[i][off] != (char)(i | 1)) bad++;
    }
    uint64_t ranges = 0;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        ranges += d.purge_calls[k] - c.purge_calls[k];
    printf("backend %s: %llu ranges purged, %zu KiB of freed blocks resident, %d bad pages\n",
           lull_counters_backend_name(d.backend), (unsigned long long)ranges, still >> 10, bad);
    CCHECK(still == 0, "%zu KiB of the freed blocks still resident", still >> 10);
    CCHECK(bad == 0, "%d pages of live blocks changed", bad);
    CCHECK(ranges >= RING_BLOCKS / 2, "only %llu ranges purged", (unsigned long long)ranges);
    for (int i = 1; i < RING_BLOCKS; i += 2)
        lull_free(blocks[i]);
}

/* refault_monitor=on but userfaultfd is denied. */
static void scenario_uffd_denied(void) {
    struct lull_counters c = stats_after_start();
    printf("refault mechanism %s\n", lull_counters_refault_name(c.refault_mechanism));
    CCHECK(c.refault_mechanism != LULL_COUNTERS_REFAULT_UFFD_WP, "userfaultfd in use");
    CCHECK(c.refault_mechanism == LULL_COUNTERS_REFAULT_PAGEMAP_SCAN ||
               c.refault_mechanism == LULL_COUNTERS_REFAULT_ACCOUNTING,
           "refault mechanism %s", lull_counters_refault_name(c.refault_mechanism));
    check_purging_works("without userfaultfd");
    /* purged memory that is used again is still seen, by the fallback */
    char *p = lull_malloc(12 * MiB);
    CCHECK(p != NULL, "malloc");
    if (p) {
        touch(p, 12 * MiB, 1);
        lull_free(p);
    }
    lull_reclaim_now();
}

/* The mechanism on this machine without the fault, for comparison. */
static void scenario_uffd_control(void) {
    struct lull_counters c = stats_after_start();
    printf("refault mechanism %s\n", lull_counters_refault_name(c.refault_mechanism));
}

/* No counter page (shm_open fails): the page opens a second after the
 * reclaim thread starts, so run past that, working all the while. */
static void scenario_shm_denied(void) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rounds = 0;
    do {
        void *p[64];
        for (int i = 0; i < 64; i++) {
            p[i] = lull_malloc(16 + (size_t)i * 100);
            CCHECK(p[i] != NULL, "malloc");
        }
        for (int i = 0; i < 64; i++)
            lull_free(p[i]);
        CCHECK(lull_reclaim_now(), "no reclaim thread");
        struct timespec s = {0, 20000000};
        nanosleep(&s, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
        rounds++;
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < 2500);
    char name[64];
    snprintf(name, sizeof name, "/dev/shm/lull.%d", (int)getpid());
    struct stat st;
    CCHECK(stat(name, &st) != 0, "%s exists although shm_open failed", name);
    check_purging_works("without a counter page");
    printf("%d rounds\n", rounds);
}

/* No reclaim thread. Small and large blocks (and huge ones, if `huge`) are
 * freed and allocated again many times: memory is reused, RSS stays
 * bounded. */
static void scenario_no_thread(bool inline_purge, bool huge_too) {
    CCHECK(!lull_reclaim_now(), "lull_reclaim_now() true without a reclaim thread");
    struct lull_counters c = stats_now();
    printf("flags %#llx, backend %s\n", (unsigned long long)c.flags,
           lull_counters_backend_name(c.backend));
    CCHECK(!(c.flags & LULL_COUNTERS_F_RECLAIM_THREAD), "RECLAIM_THREAD set");
    CCHECK(c.flags & LULL_COUNTERS_F_DEGRADED, "DEGRADED not set");
    CCHECK(c.backend == LULL_COUNTERS_BACKEND_NONE, "backend %s",
           lull_counters_backend_name(c.backend));
    CCHECK(!!(c.flags & LULL_COUNTERS_F_INLINE_PURGE) == inline_purge, "INLINE_PURGE flag %d",
           !!(c.flags & LULL_COUNTERS_F_INLINE_PURGE));

    /* large blocks come back from the same slices */
    char *a = lull_malloc(8 * MiB);
    CCHECK(a != NULL, "malloc 8 MiB");
    if (!a) return;
    touch(a, 8 * MiB, 3);
    lull_free(a);
    char *b = lull_malloc(8 * MiB);
    CCHECK(b == a, "a freed 8 MiB block was not reused (%p, then %p)", (void *)a, (void *)b);
    lull_free(b);

    size_t rss0 = rss_bytes();
    for (int round = 0; round < 30; round++) {
        void *small[256];
        for (int i = 0; i < 256; i++) {
            small[i] = lull_malloc(64 + (size_t)(i % 16) * 512);
            CCHECK(small[i] != NULL, "malloc small");
            if (small[i]) memset(small[i], i, 64);
        }
        char *large = lull_malloc(6 * MiB);
        char *huge = huge_too ? lull_malloc(20 * MiB) : NULL;
        CCHECK(large && (huge || !huge_too), "malloc large %p huge %p", (void *)large,
               (void *)huge);
        if (large) touch(large, 6 * MiB, (unsigned char)round);
        if (huge) touch(huge, 20 * MiB, (unsigned char)round);
        if (large) CCHECK(touched_with(large, 6 * MiB, (unsigned char)round), "large changed");
        if (huge) CCHECK(touched_with(huge, 20 * MiB, (unsigned char)round), "huge changed");
        for (int i = 0; i < 256; i++)
            lull_free(small[i]);
        lull_free(large);
        lull_free(huge);
        if (huge && inline_purge && round == 0) {
            /* unmapped by free() itself, on this thread */
            CCHECK(!lull_owns(huge), "lull still owns a freed huge block");
            CCHECK(resident_bytes(huge, 20 * MiB) == 0, "the freed huge block is still resident");
        }
    }
    size_t rss1 = rss_bytes();
    printf("RSS %zu -> %zu KiB over 30 rounds of 6 MiB%s + small blocks\n", rss0 >> 10, rss1 >> 10,
           huge_too ? " + 20 MiB" : "");
    /* 30 rounds keep 180 MiB (780 MiB with the huge blocks) busy in turn:
     * without reuse RSS would grow by that much */
    CCHECK(rss1 < rss0 + 64 * MiB, "RSS grew from %zu to %zu KiB: freed memory not reused",
           rss0 >> 10, rss1 >> 10);
}

/* The parent's side runs a scenario here, before Criterion starts. */
__attribute__((constructor(200))) static void fault_child(void) {
    const char *s = getenv("LULL_FI_CHILD");
    if (!s) return;
    alarm(300); /* a hang is a failure, not a stuck test run */
    if (!strcmp(s, "uring_at_open"))
        scenario_uring_at_open();
    else if (!strcmp(s, "uring_submit_mid_run"))
        scenario_uring_mid_run(LULL_FAULT_URING_SUBMIT);
    else if (!strcmp(s, "uring_cqe_mid_run"))
        scenario_uring_mid_run(LULL_FAULT_URING_CQE);
    else if (!strcmp(s, "madvise_only"))
        scenario_madvise_only();
    else if (!strcmp(s, "full_ring"))
        scenario_full_ring();
    else if (!strcmp(s, "uffd_denied"))
        scenario_uffd_denied();
    else if (!strcmp(s, "uffd_control"))
        scenario_uffd_control();
    else if (!strcmp(s, "shm_denied"))
        scenario_shm_denied();
    else if (!strcmp(s, "no_thread"))
        scenario_no_thread(false, false);
    else if (!strcmp(s, "no_thread_huge"))
        scenario_no_thread(false, true);
    else if (!strcmp(s, "no_thread_inline_purge"))
        scenario_no_thread(true, true);
    else
        child_fail("scenario", __LINE__, "unknown scenario %s", s);
    fflush(stdout);
    _exit(child_failures ? 1 : 0);
}

/* ---- the parent's side -------------------------------------------------- */

typedef struct {
    int status;
    char out[16384];
    char err[16384];
} child_result;

/* Read both pipes to their end (poll: neither can fill up and block). */
static void read_both(int fo, int fe, child_result *r) {
    size_t no = 0, ne = 0;
    struct pollfd p[2] = {{fo, POLLIN, 0}, {fe, POLLIN, 0}};
    int open_fds = 2;
    while (open_fds) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char *buf = i ? r->err : r->out;
            size_t *n = i ? &ne : &no;
            char scratch[4096];
            size_t room = sizeof r->out - 1 - *n;
            ssize_t k = read(p[i].fd, room ? buf + *n : scratch, room ? room : sizeof scratch);
            if (k <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
            } else if (room) {
                *n += (size_t)k;
            }
        }
    }
    r->out[no] = 0;
    r->err[ne] = 0;
}

/* Run this program again with LULL_FI_CHILD=scenario and the given
 * variables (every other LULL_ variable of ours is dropped). */
static void run_child(const char *scenario, const char *const *vars, child_result *r) {
    char *envp[256];
    size_t n = 0;
    static char self[64];
    snprintf(self, sizeof self, "LULL_FI_CHILD=%s", scenario);
    envp[n++] = self;
    for (const char *const *v = vars; v && *v; v++)
        envp[n++] = (char *)*v;
    for (char **e = environ; *e && n < 250; e++)
        if (strncmp(*e, "LULL_", 5) != 0) envp[n++] = *e;
    envp[n] = NULL;
    int o[2], e[2];
    cr_assert_eq(pipe2(o, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(e, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(o[1], STDOUT_FILENO);
        dup2(e[1], STDERR_FILENO);
        char *const argv[] = {"test_fault_injection", NULL};
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(o[1]);
    close(e[1]);
    read_both(o[0], e[0], r);
    cr_assert_eq(waitpid(pid, &r->status, 0), pid);
    cr_log_info("child %s:\n--- stdout\n%s--- stderr\n%s", scenario, r->out, r->err);
}

static void expect_success(const char *scenario, const child_result *r) {
    if (WIFEXITED(r->status) && WEXITSTATUS(r->status) == CHILD_SKIP)
        cr_skip_test("%s: %s", scenario, r->out);
    cr_assert(WIFEXITED(r->status), "%s: child died of signal %d\nstdout:\n%s\nstderr:\n%s",
              scenario, WIFSIGNALED(r->status) ? WTERMSIG(r->status) : 0, r->out, r->err);
    cr_assert_eq(WEXITSTATUS(r->status), 0, "%s: child exit %d\nstdout:\n%s\nstderr:\n%s", scenario,
                 WEXITSTATUS(r->status), r->out, r->err);
}

/* Lines of s that start with prefix. */
static int lines_starting(const char *s, const char *prefix) {
    int n = 0;
    for (const char *l = s; l && *l;) {
        if (!strncmp(l, prefix, strlen(prefix))) n++;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return n;
}

/* The children purge at once, all the way (dontneed), keep nothing warm and
 * publish no counter page unless a test asks for one. */
#define BASE_CONF "purge_delay_ms=0,purge_mode=dontneed,warm_reserve_mb=0,refault_monitor=off"

/* Runs the child `scenario` with LULL_CONF=conf, LULL_FAULT=fault (none if
 * NULL) and no counter page, and asserts that it passed (it skips the test
 * when the machine lacks the mechanism); `label` names the case in the
 * messages. */
static void child_passes(const char *label, const char *scenario, const char *conf,
                         const char *fault, child_result *r) {
    char conf_var[512], fault_var[256];
    snprintf(conf_var, sizeof conf_var, "LULL_CONF=%s", conf);
    snprintf(fault_var, sizeof fault_var, "LULL_FAULT=%s", fault ? fault : "");
    const char *vars[] = {conf_var, "LULL_COUNTER_PAGE=off", fault ? fault_var : NULL, NULL};
    run_child(scenario, vars, r);
    expect_success(label, r);
}

/* lull said one thing on stderr (one "lull:" line), and it was about
 * `about`. */
static void expect_one_message(const child_result *r, const char *about) {
    cr_assert_eq(lines_starting(r->err, "lull:"), 1, "one message expected; stderr: %s", r->err);
    cr_assert_not_null(strstr(r->err, about), "no \"%s\" on stderr: %s", about, r->err);
}

/* ---- mmap (in this process) ---------------------------------------------- */

static void quiet(void) {
    /* no purges while a test counts on its blocks' state */
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(16);
    lull_free(p);
}

TestSuite(fault_injection, .init = quiet);

Test(fault_injection, mmap_enomem_for_huge_and_segments) {
    /* blocks that exist before the fault, of every kind */
    size_t sizes[] = {24, 3000, 100 * KiB, 700 * KiB, 5 * MiB, 20 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    char *keep[N];
    for (int i = 0; i < N; i++) {
        keep[i] = lull_malloc(sizes[i]);
        cr_assert_not_null(keep[i]);
        touch(keep[i], sizes[i], (unsigned char)(0x30 + i));
    }
    char *huge_keep = keep[N - 1];

    lull_fault_arm(LULL_FAULT_MMAP, -1);
    /* huge: every way of asking gives NULL and ENOMEM */
    errno = 0;
    void *h1 = lull_malloc(40 * MiB);
    int e1 = errno;
    errno = 0;
    void *h2 = lull_calloc(1, 17 * MiB);
    int e2 = errno;
    errno = 0;
    void *h3 = lull_aligned_alloc(64 * MiB, MiB);
    int e3 = errno;
    void *h4 = NULL;
    int e4 = lull_posix_memalign(&h4, 4096, 30 * MiB);
    errno = 0;
    /* growing a huge block past its mapping needs an mmap (in place) or a
     * new huge block (a copy): neither works, the block stays */
    void *h5 = lull_realloc(huge_keep, 60 * MiB);
    int e5 = errno;
    /* a small block that would have to become huge */
    errno = 0;
    void *h6 = lull_realloc(keep[0], 25 * MiB);
    int e6 = errno;
    /* segments: 16 MiB blocks need a segment each (256 of its 511 free
     * slices) until none is left */
    void *large[64];
    int n_large = 0, large_errno = 0;
    while (n_large < 64) {
        errno = 0;
        void *p = lull_malloc(16 * MiB);
        if (!p) {
            large_errno = errno;
            break;
        }
        touch(p, 16 * MiB, 7);
        large[n_large++] = p;
    }
    lull_fault_arm(LULL_FAULT_MMAP, 0);

    cr_assert_null(h1);
    cr_assert_eq(e1, ENOMEM);
    cr_assert_null(h2);
    cr_assert_eq(e2, ENOMEM);
    cr_assert_null(h3);
    cr_assert_eq(e3, ENOMEM);
    cr_assert_null(h4);
    cr_assert_eq(e4, ENOMEM);
    cr_assert_null(h5);
    cr_assert_eq(e5, ENOMEM);
    cr_assert_null(h6);
    cr_assert_eq(e6, ENOMEM);
    cr_assert_lt(n_large, 64, "16 MiB blocks kept coming although mmap fails");
    cr_assert_eq(large_errno, ENOMEM);

    /* the blocks from before are intact and still usable */
    for (int i = 0; i < N; i++) {
        cr_assert(touched_with(keep[i], sizes[i], (unsigned char)(0x30 + i)), "block %d changed",
                  i);
        cr_assert_geq(lull_usable_size(keep[i]), sizes[i]);
    }
    for (int i = 0; i < n_large; i++)
        cr_assert(touched_with(large[i], 16 * MiB, 7));

    /* disarmed: everything works again, also a new segment */
    void *again[8];
    for (int i = 0; i < 8; i++) {
        again[i] = lull_malloc(16 * MiB);
        cr_assert_not_null(again[i], "16 MiB block %d after the fault", i);
        touch(again[i], 16 * MiB, 9);
    }
    void *h = lull_malloc(40 * MiB);
    cr_assert_not_null(h);
    touch(h, 40 * MiB, 1);
    char *grown = lull_realloc(huge_keep, 60 * MiB);
    cr_assert_not_null(grown);
    cr_assert(touched_with(grown, 20 * MiB, 0x30 + N - 1), "realloc lost the huge block's data");
    keep[N - 1] = grown;
    void *al = lull_aligned_alloc(64 * MiB, MiB);
    cr_assert_not_null(al);
    cr_assert_eq((uintptr_t)al % (64 * MiB), 0);

    lull_free(al);
    lull_free(h);
    for (int i = 0; i < 8; i++)
        lull_free(again[i]);
    for (int i = 0; i < n_large; i++)
        lull_free(large[i]);
    for (int i = 0; i < N; i++)
        lull_free(keep[i]);
}

/* The fault counts down: exactly the next n mappings fail. */
Test(fault_injection, mmap_fault_with_a_count) {
    lull_fault_arm(LULL_FAULT_MMAP, 2);
    errno = 0;
    void *a = lull_malloc(20 * MiB);
    int ea = errno;
    void *b = lull_malloc(20 * MiB);
    void *c = lull_malloc(20 * MiB);
    int left = lull_fault_armed[LULL_FAULT_MMAP];
    lull_fault_arm(LULL_FAULT_MMAP, 0);
    cr_assert_null(a);
    cr_assert_eq(ea, ENOMEM);
    cr_assert_null(b);
    cr_assert_not_null(c, "the third mapping failed too");
    cr_assert_eq(left, 0);
    touch(c, 20 * MiB, 1);
    lull_free(c);
}

/* Threads that allocate while mmap fails get NULL, never a crash, and the
 * others' blocks stay intact. */
static void *mmap_fault_thread(void *arg) {
    (void)arg;
    int nulls = 0;
    for (int i = 0; i < 200; i++) {
        size_t size = (size_t)(i % 7 + 1) * 3 * MiB; /* large and huge */
        char *p = lull_malloc(size);
        if (!p) {
            nulls++;
            continue;
        }
        touch(p, size, 0x11);
        if (!touched_with(p, size, 0x11)) return (void *)(intptr_t)-1;
        lull_free(p);
    }
    return (void *)(intptr_t)nulls;
}

Test(fault_injection, mmap_fault_while_threads_allocate) {
    char *mine = lull_malloc(5000);
    cr_assert_not_null(mine);
    memset(mine, 0x77, 5000);
    lull_fault_arm(LULL_FAULT_MMAP, -1);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, mmap_fault_thread, NULL), 0);
    long nulls = 0;
    for (int i = 0; i < 3; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_neq((intptr_t)r, -1, "a block changed under a thread");
        nulls += (intptr_t)r;
    }
    lull_fault_arm(LULL_FAULT_MMAP, 0);
    cr_assert_gt(nulls, 0, "no allocation failed although mmap did");
    for (int i = 0; i < 5000; i++)
        cr_assert_eq((unsigned char)mine[i], 0x77);
    lull_free(mine);
    void *p = lull_malloc(30 * MiB);
    cr_assert_not_null(p);
    lull_free(p);
}

/* ---- purge backends (children) ------------------------------------------ */

Test(fault_injection, uring_setup_fails_backend_falls_back, .timeout = 300) {
    child_result r;
    child_passes("uring_setup", "uring_at_open", BASE_CONF, "uring_setup", &r);
}

Test(fault_injection, uring_submit_fails_at_open, .timeout = 300) {
    child_result r;
    child_passes("uring_submit:1", "uring_at_open", BASE_CONF, "uring_submit:1", &r);
}

Test(fault_injection, uring_completion_fails_at_open, .timeout = 300) {
    child_result r;
    child_passes("uring_cqe:1", "uring_at_open", BASE_CONF, "uring_cqe:1", &r);
}

Test(fault_injection, uring_submit_fails_mid_run, .timeout = 300) {
    child_result r;
    child_passes("uring_submit mid-run", "uring_submit_mid_run", BASE_CONF, NULL, &r);
    cr_assert_not_null(strstr(r.err, "given up"), "no message about the fallback: %s", r.err);
}

Test(fault_injection, uring_completion_fails_mid_run, .timeout = 300) {
    child_result r;
    child_passes("uring_cqe mid-run", "uring_cqe_mid_run", BASE_CONF, NULL, &r);
    cr_assert_not_null(strstr(r.err, "given up"), "no message about the fallback: %s", r.err);
}

Test(fault_injection, process_madvise_fails_madvise_remains, .timeout = 300) {
    child_result r;
    child_passes("uring_setup,process_madvise", "madvise_only", BASE_CONF,
                 "uring_setup,process_madvise", &r);
}

/* Asked for process_madvise by name: falls back to madvise, and says so. */
Test(fault_injection, process_madvise_asked_for_and_failing, .timeout = 300) {
    child_result r;
    child_passes("backend=process_madvise + fault", "madvise_only",
                 BASE_CONF ",backend=process_madvise", "process_madvise", &r);
    expect_one_message(&r, "process_madvise");
}

Test(fault_injection, more_ranges_than_the_ring_all_purged, .timeout = 300) {
    child_result r;
    child_passes("full ring", "full_ring", BASE_CONF, NULL, &r);
}

Test(fault_injection, more_ranges_than_the_ring_all_purged_by_madvise, .timeout = 300) {
    child_result r;
    child_passes("full ring, madvise", "full_ring", BASE_CONF, "uring_setup,process_madvise", &r);
}

/* ---- refault monitor ----------------------------------------------------- */

#define UFFD_CONF "purge_delay_ms=0,purge_mode=dontneed,warm_reserve_mb=0,refault_monitor=on"

Test(fault_injection, userfaultfd_denied_monitor_falls_back, .timeout = 300) {
    child_result ctl;
    child_passes("uffd control", "uffd_control", UFFD_CONF, NULL, &ctl);

    child_result r;
    child_passes("uffd denied", "uffd_denied", UFFD_CONF ",verbose=on", "uffd", &r);
    /* verbose: the reason is reported */
    cr_assert_not_null(strstr(r.err, "userfaultfd not permitted"), "stderr: %s", r.err);
}

/* ---- counter page ---------------------------------------------------------- */

/* The one case with a counter page asked for: its own variables. */
Test(fault_injection, shm_open_denied_no_page_program_goes_on, .timeout = 300) {
    child_result r;
    const char *vars[] = {"LULL_CONF=" BASE_CONF, "LULL_FAULT=shm_open", "LULL_COUNTER_PAGE=on",
                          NULL};
    run_child("shm_denied", vars, &r);
    expect_success("shm_open", &r);
    expect_one_message(&r, "counter page");
}

/* ---- reclaim thread --------------------------------------------------------- */

Test(fault_injection, reclaim_thread_cannot_start, .timeout = 300) {
    child_result r;
    child_passes("thread_create", "no_thread", BASE_CONF, "thread_create", &r);
    expect_one_message(&r, "reclaim thread");
    cr_assert_eq(lines_starting(r.err, ""), 1, "nothing else on stderr: %s", r.err);
    cr_assert_not_null(strstr(r.err, "inline_purge"), "the message names no remedy: %s", r.err);
}

/* Huge blocks need a reclaim thread to unmap them: without one (and
 * without inline_purge) a freed huge block must still not be lost for good,
 * or a program that allocates and frees 20 MiB buffers grows without
 * bound. */
Test(fault_injection, reclaim_thread_cannot_start_huge_blocks_do_not_pile_up, .timeout = 300) {
    child_result r;
    child_passes("thread_create, huge blocks", "no_thread_huge", BASE_CONF, "thread_create", &r);
}

Test(fault_injection, reclaim_thread_cannot_start_inline_purge, .timeout = 300) {
    child_result r;
    child_passes("thread_create + inline_purge", "no_thread_inline_purge",
                 BASE_CONF ",inline_purge=on", "thread_create", &r);
    expect_one_message(&r, "reclaim thread");
}
