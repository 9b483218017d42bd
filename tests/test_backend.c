/* Purge backends (reclaim/backend_*.c): each mechanism really gives pages
 * back, MADV_FREE is accepted, every failure (setup, submit, completion,
 * process_madvise) degrades without leaving a range unpurged, bad ranges
 * report their errno without degrading, io-wq workers are pinned, and a
 * forked child never touches the parent's ring. */
#include "reclaim/purge_backend.h"
#include "base/fault.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define PAGE ((size_t)4096)

/* Fault points are process-wide: when lull itself is linked in, its reclaim
 * thread must not purge (and use up an armed fault) while a test runs. */
static void quiet_reclaim(void) {
    lull_config_set("purge_delay_ms", "never");
}
TestSuite(backend, .init = quiet_reclaim);

/* ---- helpers ------------------------------------------------------------ */

/* Anonymous region of 4 KiB pages, every page written (non-zero). */
static char *map_touched(size_t len) {
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    madvise(p, len, MADV_NOHUGEPAGE);
    memset(p, 0xa5, len);
    return p;
}

static size_t resident_pages(const void *p, size_t len) {
    size_t n = len / PAGE, count = 0;
    unsigned char *vec = malloc(n);
    cr_assert_not_null(vec);
    cr_assert_eq(mincore((void *)p, len, vec), 0);
    for (size_t i = 0; i < n; i++)
        count += vec[i] & 1;
    free(vec);
    return count;
}

static bool all_zero(const char *p, size_t len) {
    for (size_t i = 0; i < len; i += 64)
        if (p[i]) return false;
    return true;
}

/* smaps "LazyFree:" of the mapping that starts at p, in KiB (-1: not found). */
static long lazyfree_kb(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f);
    char line[512];
    bool in = false;
    long kb = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long start, end;
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = start == (unsigned long)p;
            continue;
        }
        if (in && sscanf(line, "LazyFree: %ld kB", &kb) == 1) break;
    }
    fclose(f);
    return kb;
}

/* Split [p, p+len) into ranges of `each` bytes. */
static size_t split(purge_range *r, char *p, size_t len, size_t each) {
    size_t n = 0;
    for (size_t off = 0; off < len; off += each) {
        r[n].addr = p + off;
        r[n].len = len - off < each ? len - off : each;
        n++;
    }
    return n;
}

static bool uring_usable(void) {
    struct io_uring ring;
    if (io_uring_queue_init(4, &ring, 0) < 0) return false;
    io_uring_queue_exit(&ring);
    return true;
}

/* Open b as `want`, skipping the test if this kernel lacks it. */
static void open_forced(purge_backend *b, lull_backend_kind want) {
    lull_backend_kind k = purge_backend_open(b, want, NULL);
    if (k != want) {
        purge_backend_close(b);
        cr_skip_test("%s unavailable here: %s", purge_backend_name(want), b->fallback_reason);
    }
    cr_assert_str_empty(b->fallback_reason);
}

static size_t total_ranges(const purge_backend *b) {
    size_t t = 0;
    for (int k = 0; k < PURGE_KIND_COUNT; k++)
        t += b->per_kind[k].ranges;
    return t;
}

/* ---- every backend really purges ------------------------------------- */

static void check_dontneed(lull_backend_kind want, size_t each) {
    purge_backend b;
    open_forced(&b, want);
    const size_t len = 24 * MiB;
    char *p = map_touched(len);
    cr_assert_eq(resident_pages(p, len), len / PAGE);

    purge_range r[64];
    int res[64];
    size_t n = split(r, p, len, each);
    memset(res, 0x7f, sizeof res);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, res), n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], 0, "range %zu: %d", i, res[i]);

    cr_assert_eq(resident_pages(p, len), 0, "pages still resident after %s",
                 purge_backend_name(want));
    cr_assert(all_zero(p, len), "MADV_DONTNEED memory did not read back as zero");
    cr_assert_eq(purge_backend_kind(&b), want, "backend degraded");
    cr_assert_eq(b.per_kind[want].ranges, n);
    cr_assert_eq(b.per_kind[want].bytes, len);
    cr_assert_eq(total_ranges(&b), n, "another mechanism purged too");
    cr_assert_geq(b.per_kind[want].calls, 1);
    cr_assert_eq(b.errors, 0);
    cr_assert_eq(b.fallbacks, 0);
    cr_assert_eq(b.redone, 0);
    purge_backend_close(&b);
    munmap(p, len);
}

Test(backend, uring_dontneed_2m) {
    check_dontneed(LULL_BACKEND_URING, 2 * MiB);
}
Test(backend, uring_dontneed_16m) {
    check_dontneed(LULL_BACKEND_URING, 16 * MiB);
}
Test(backend, process_madvise_dontneed) {
    check_dontneed(LULL_BACKEND_PROCESS_MADVISE, 2 * MiB);
}
Test(backend, process_madvise_dontneed_16m) {
    check_dontneed(LULL_BACKEND_PROCESS_MADVISE, 16 * MiB);
}
Test(backend, madvise_dontneed) {
    check_dontneed(LULL_BACKEND_MADVISE, 2 * MiB);
}

static void check_free(lull_backend_kind want) {
    purge_backend b;
    open_forced(&b, want);
    const size_t len = 8 * MiB;
    char *p = map_touched(len);
    cr_assert_leq(lazyfree_kb(p), 0);
    purge_range r[8];
    int res[8];
    size_t n = split(r, p, len, 2 * MiB);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_FREE, res), n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], 0);
    cr_assert_eq(purge_backend_kind(&b), want, "MADV_FREE made the backend degrade");
    cr_assert_eq(b.per_kind[want].ranges, n);
    /* The kernel marks the pages lazily freeable (a few may sit in per-CPU
     * LRU batches for a while). */
    long kb = lazyfree_kb(p);
    cr_assert_geq(kb, (long)(len / 1024) * 9 / 10, "LazyFree %ld kB of %zu", kb, len / 1024);
    purge_backend_close(&b);
    munmap(p, len);
}

Test(backend, uring_free) {
    check_free(LULL_BACKEND_URING);
}
Test(backend, process_madvise_free) {
    check_free(LULL_BACKEND_PROCESS_MADVISE);
}
Test(backend, madvise_free) {
    check_free(LULL_BACKEND_MADVISE);
}

Test(backend, auto_picks_best) {
    if (!uring_usable()) cr_skip_test("io_uring unavailable here");
    purge_backend b;
    cr_assert_eq(purge_backend_open(&b, LULL_BACKEND_AUTO, NULL), LULL_BACKEND_URING);
    cr_assert_str_empty(b.fallback_reason);
    cr_assert(b.ring_open);
    cr_assert(b.ring_flags & IORING_SETUP_SINGLE_ISSUER);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].calls, 0, "probes must not be counted");
    purge_backend_close(&b);
    cr_assert(!b.ring_open);
    cr_assert_eq(b.pidfd, -1);
}

Test(backend, madvise_wanted_needs_no_probe) {
    purge_backend b;
    cr_assert_eq(purge_backend_open(&b, LULL_BACKEND_MADVISE, NULL), LULL_BACKEND_MADVISE);
    cr_assert_str_empty(b.fallback_reason);
    cr_assert(!b.ring_open);
    cr_assert_eq(b.pidfd, -1);
    purge_backend_close(&b);
}

Test(backend, names) {
    cr_assert_str_eq(purge_backend_name(LULL_BACKEND_URING), "uring");
    cr_assert_str_eq(purge_backend_name(LULL_BACKEND_PROCESS_MADVISE), "process_madvise");
    cr_assert_str_eq(purge_backend_name(LULL_BACKEND_MADVISE), "madvise");
    cr_assert_str_eq(purge_backend_name(LULL_BACKEND_AUTO), "auto");
}

/* ---- failures at open ---------------------------------------------------- */

Test(backend, uring_setup_failure_falls_back) {
    lull_fault_arm(LULL_FAULT_URING_SETUP, -1);
    purge_backend b;
    lull_backend_kind k = purge_backend_open(&b, LULL_BACKEND_AUTO, NULL);
    cr_assert_neq(k, LULL_BACKEND_URING);
    cr_assert(!b.ring_open);
    cr_assert_not_null(strstr(b.fallback_reason, "io_uring_setup: EPERM"), "reason: %s",
                       b.fallback_reason);
    cr_assert_eq(b.fallback_errno, EPERM);
    cr_assert_geq(b.fallbacks, 1);

    const size_t len = 4 * MiB;
    char *p = map_touched(len);
    purge_range r[2];
    size_t n = split(r, p, len, 2 * MiB);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, NULL), n);
    cr_assert_eq(resident_pages(p, len), 0);
    cr_assert_eq(b.per_kind[k].ranges, n);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 0);
    purge_backend_close(&b);
    munmap(p, len);
}

Test(backend, uring_and_process_madvise_failure_gives_madvise) {
    lull_fault_arm(LULL_FAULT_URING_SETUP, -1);
    lull_fault_arm(LULL_FAULT_PROCESS_MADVISE, -1);
    purge_backend b;
    cr_assert_eq(purge_backend_open(&b, LULL_BACKEND_URING, NULL), LULL_BACKEND_MADVISE);
    cr_assert_not_null(strstr(b.fallback_reason, "io_uring_setup"), "%s", b.fallback_reason);
    cr_assert_not_null(strstr(b.fallback_reason, "process_madvise"), "%s", b.fallback_reason);
    cr_assert_eq(b.fallbacks, 2);
    cr_assert_eq(b.pidfd, -1);
    purge_backend_close(&b);
}

Test(backend, process_madvise_probe_failure_falls_back) {
    lull_fault_arm(LULL_FAULT_PROCESS_MADVISE, -1);
    purge_backend b;
    cr_assert_eq(purge_backend_open(&b, LULL_BACKEND_PROCESS_MADVISE, NULL), LULL_BACKEND_MADVISE);
    cr_assert_not_null(strstr(b.fallback_reason, "process_madvise"), "%s", b.fallback_reason);
    cr_assert_eq(b.fallback_errno, EINVAL);
    cr_assert(!b.ring_open, "a process_madvise want must not set up a ring");
    purge_backend_close(&b);
}

Test(backend, uring_probe_completion_failure_falls_back) {
    lull_fault_arm(LULL_FAULT_URING_CQE, 1);
    purge_backend b;
    cr_assert_neq(purge_backend_open(&b, LULL_BACKEND_URING, NULL), LULL_BACKEND_URING);
    cr_assert(!b.ring_open);
    cr_assert_not_null(strstr(b.fallback_reason, "io_uring madvise probe"), "%s",
                       b.fallback_reason);
    purge_backend_close(&b);
}

/* ---- failures at run time: every range still purged -------------------- */

#define MANY 600 /* three batches of the 256-entry ring */

static void check_all_purged(char *p, size_t len, const int *res, size_t n) {
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(res[i], 0, "range %zu: %d", i, res[i]);
    cr_assert_eq(resident_pages(p, len), 0, "a range was left unpurged");
    cr_assert(all_zero(p, len));
}

Test(backend, uring_submit_failure_purges_everything) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    /* A first run works through the ring. */
    char *q = map_touched(4 * MiB);
    purge_range r0[2];
    cr_assert_eq(purge_backend_run(&b, r0, split(r0, q, 4 * MiB, 2 * MiB), MADV_DONTNEED, NULL), 2);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 2);

    const size_t each = 64 * 1024, len = MANY * each;
    char *p = map_touched(len);
    static purge_range r[MANY];
    static int res[MANY];
    cr_assert_eq(split(r, p, len, each), MANY);
    lull_fault_arm(LULL_FAULT_URING_SUBMIT, 1);
    cr_assert_eq(purge_backend_run(&b, r, MANY, MADV_DONTNEED, res), MANY);
    check_all_purged(p, len, res, MANY);

    cr_assert_neq(purge_backend_kind(&b), LULL_BACKEND_URING, "still on the failed ring");
    cr_assert(!b.ring_open);
    cr_assert_eq(b.fallbacks, 1);
    cr_assert_eq(b.redone, 256, "the unsubmitted batch is redone");
    cr_assert_not_null(strstr(b.fallback_reason, "submit"), "%s", b.fallback_reason);
    cr_assert_eq(b.fallback_errno, ENXIO);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 2);
    cr_assert_eq(total_ranges(&b), 2 + MANY);
    cr_assert_eq(b.errors, 0);

    /* Stays degraded, and keeps working. */
    memset(q, 1, 4 * MiB);
    cr_assert_eq(purge_backend_run(&b, r0, 2, MADV_DONTNEED, NULL), 2);
    cr_assert_eq(resident_pages(q, 4 * MiB), 0);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 2);
    purge_backend_close(&b);
}

Test(backend, uring_completion_failure_mid_run_purges_everything) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    const size_t each = 64 * 1024, len = MANY * each;
    char *p = map_touched(len);
    static purge_range r[MANY];
    static int res[MANY];
    split(r, p, len, each);
    lull_fault_arm(LULL_FAULT_URING_CQE, 1); /* one completion of the first batch fails */
    cr_assert_eq(purge_backend_run(&b, r, MANY, MADV_DONTNEED, res), MANY);
    check_all_purged(p, len, res, MANY);

    cr_assert_neq(purge_backend_kind(&b), LULL_BACKEND_URING);
    cr_assert_eq(b.fallbacks, 1);
    cr_assert_eq(b.redone, 1);
    cr_assert_eq(b.fallback_errno, EOPNOTSUPP);
    cr_assert_not_null(strstr(b.fallback_reason, "io_uring madvise failed"), "%s",
                       b.fallback_reason);
    /* 255 ranges of the first batch completed on the ring, the rest below. */
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 255);
    cr_assert_eq(total_ranges(&b), MANY);
    cr_assert_eq(b.errors, 0);
    purge_backend_close(&b);
}

Test(backend, process_madvise_failure_mid_run_purges_everything) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_PROCESS_MADVISE);
    const size_t each = 64 * 1024, len = MANY * each;
    char *p = map_touched(len);
    static purge_range r[MANY];
    static int res[MANY];
    split(r, p, len, each);
    /* First run fine, second one fails in process_madvise. */
    cr_assert_eq(purge_backend_run(&b, r, 300, MADV_DONTNEED, NULL), 300);
    lull_fault_arm(LULL_FAULT_PROCESS_MADVISE, 1);
    cr_assert_eq(purge_backend_run(&b, r + 300, MANY - 300, MADV_DONTNEED, res + 300), MANY - 300);
    memset(res, 0, 300 * sizeof res[0]);
    check_all_purged(p, len, res, MANY);
    cr_assert_eq(purge_backend_kind(&b), LULL_BACKEND_MADVISE);
    cr_assert_eq(b.fallbacks, 1);
    cr_assert_eq(b.redone, 1);
    cr_assert_eq(b.per_kind[LULL_BACKEND_PROCESS_MADVISE].ranges, 300);
    cr_assert_eq(b.per_kind[LULL_BACKEND_MADVISE].ranges, MANY - 300);
    cr_assert_not_null(strstr(b.fallback_reason, "process_madvise"), "%s", b.fallback_reason);
    purge_backend_close(&b);
}

/* ENOMEM from a mechanism is madvise's own (the kernel short of memory for
 * a moment, or a range not mapped): the range is redone one level down,
 * and the mechanism kept. A short spell of memory pressure gave io_uring
 * (or process_madvise) up for good, counted as a fallback. */
static void check_refused_keeps(lull_backend_kind want, lull_fault_point fault) {
    purge_backend b;
    open_forced(&b, want);
    const size_t each = 64 * 1024, len = MANY * each;
    char *p = map_touched(len);
    static purge_range r[MANY];
    static int res[MANY];
    split(r, p, len, each);
    lull_fault_arm(fault, 1); /* the first range's call fails */
    cr_assert_eq(purge_backend_run(&b, r, MANY, MADV_DONTNEED, res), MANY);
    check_all_purged(p, len, res, MANY);

    cr_assert_eq(purge_backend_kind(&b), want, "%s given up for a refusal of the moment: %s",
                 purge_backend_name(want), b.fallback_reason);
    cr_assert_eq(b.fallbacks, 0);
    cr_assert_str_empty(b.fallback_reason);
    cr_assert_eq(b.redone, 1, "the failed range is redone one level down");
    cr_assert_eq(b.per_kind[want].ranges, MANY - 1);
    cr_assert_eq(total_ranges(&b), MANY);
    cr_assert_eq(b.errors, 0);
    purge_backend_close(&b);
    munmap(p, len);
}

Test(backend, uring_enomem_keeps_uring) {
    check_refused_keeps(LULL_BACKEND_URING, LULL_FAULT_PURGE_NOMEM);
}
Test(backend, process_madvise_enomem_keeps_process_madvise) {
    check_refused_keeps(LULL_BACKEND_PROCESS_MADVISE, LULL_FAULT_PURGE_NOMEM);
}
/* ECANCELED: io-wq had no worker for the request and could start none (the
 * user at RLIMIT_NPROC, the cgroup at pids.max, the kernel short of memory;
 * seen on 6.18 with the last worker gone and the user at its limit): no
 * fault of io_uring's, and it passes when a worker can start again. */
Test(backend, uring_no_worker_keeps_uring) {
    check_refused_keeps(LULL_BACKEND_URING, LULL_FAULT_URING_NO_WORKER);
}

/* ENOMEM on every mechanism, madvise too: an error of the range, counted,
 * and no mechanism given up. */
Test(backend, enomem_everywhere_is_a_range_error) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    char *p = map_touched(4 * MiB);
    purge_range r[2];
    int res[2];
    split(r, p, 4 * MiB, 2 * MiB);
    lull_fault_arm(LULL_FAULT_PURGE_NOMEM, -1);
    size_t ok = purge_backend_run(&b, r, 2, MADV_DONTNEED, res);
    lull_fault_arm(LULL_FAULT_PURGE_NOMEM, 0);
    cr_assert_eq(ok, 0);
    cr_assert_eq(res[0], -ENOMEM);
    cr_assert_eq(res[1], -ENOMEM);
    cr_assert_eq(b.errors, 2);
    cr_assert_eq(purge_backend_kind(&b), LULL_BACKEND_URING, "%s", b.fallback_reason);
    cr_assert_eq(b.fallbacks, 0);
    purge_backend_close(&b);
    munmap(p, 4 * MiB);
}

static void *run_elsewhere(void *arg) {
    purge_backend *b = arg;
    char *p = map_touched(4 * MiB);
    purge_range r[2];
    size_t ok = purge_backend_run(b, r, split(r, p, 4 * MiB, 2 * MiB), MADV_DONTNEED, NULL);
    size_t left = resident_pages(p, 4 * MiB);
    munmap(p, 4 * MiB);
    return (void *)(uintptr_t)(ok == 2 && left == 0);
}

/* Misuse, but it must not lose a purge: another thread cannot enter the
 * ring (its registered index is per thread: EINVAL; SINGLE_ISSUER: EEXIST),
 * and the backend degrades instead. */
Test(backend, uring_from_wrong_thread_degrades_safely) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    pthread_t t;
    void *ok;
    cr_assert_eq(pthread_create(&t, NULL, run_elsewhere, &b), 0);
    pthread_join(t, &ok);
    cr_assert(ok, "ranges lost when run from another thread");
    cr_assert_neq(purge_backend_kind(&b), LULL_BACKEND_URING);
    cr_assert(b.fallback_errno == EINVAL || b.fallback_errno == EEXIST, "%s", b.fallback_reason);
    cr_assert_eq(b.fallbacks, 1);
    purge_backend_close(&b);
}

/* ---- bad ranges: errors in results[], no degradation --------------------- */

static void check_bad_ranges(lull_backend_kind want) {
    purge_backend b;
    open_forced(&b, want);
    char *p = map_touched(8 * MiB);
    char *locked = map_touched(PAGE * 16);
    /* the raw syscall: sanitizers turn mlock() into a no-op */
    cr_assert_eq(syscall(SYS_mlock, locked, PAGE * 16), 0);
    munmap(p + 4 * MiB, 2 * MiB); /* a hole: nothing may be mapped before the run */
    purge_range r[] = {
        {p, 2 * MiB},            /* fine */
        {p + 2 * MiB + 1, PAGE}, /* unaligned: EINVAL */
        {p + 4 * MiB, 2 * MiB},  /* unmapped: ENOMEM, from the kernel */
        {locked, PAGE * 16},     /* mlocked: EINVAL, from the kernel */
        {p + 6 * MiB, 2 * MiB},  /* fine */
        {p + 2 * MiB, 0},        /* empty: nothing to do */
    };
    int res[6];
    cr_assert_eq(purge_backend_run(&b, r, 6, MADV_DONTNEED, res), 3);
    cr_assert_eq(res[0], 0);
    cr_assert_eq(res[1], -EINVAL);
    cr_assert_eq(res[2], -ENOMEM);
    cr_assert_eq(res[3], -EINVAL);
    cr_assert_eq(res[4], 0);
    cr_assert_eq(res[5], 0);
    cr_assert_eq(resident_pages(p, 2 * MiB), 0);
    cr_assert_eq(resident_pages(p + 6 * MiB, 2 * MiB), 0);
    cr_assert_eq(resident_pages(p + 2 * MiB, 2 * MiB), 2 * MiB / PAGE, "untouched range purged");
    cr_assert_eq(resident_pages(locked, PAGE * 16), 16);
    cr_assert_eq(b.errors, 3);
    cr_assert_eq(purge_backend_kind(&b), want, "a bad range made %s degrade: %s",
                 purge_backend_name(want), b.fallback_reason);
    cr_assert_eq(b.fallbacks, 0);
    cr_assert_str_empty(b.fallback_reason);
    purge_backend_close(&b);
}

Test(backend, uring_bad_ranges) {
    check_bad_ranges(LULL_BACKEND_URING);
}
Test(backend, process_madvise_bad_ranges) {
    check_bad_ranges(LULL_BACKEND_PROCESS_MADVISE);
}
Test(backend, madvise_bad_ranges) {
    check_bad_ranges(LULL_BACKEND_MADVISE);
}

/* MADV_FREE on a shared mapping is refused by the kernel (EINVAL) on every
 * mechanism: an advice error, not a backend failure. */
Test(backend, uring_free_on_shared_is_a_range_error) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    char *s = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(s, MAP_FAILED);
    memset(s, 1, 2 * MiB);
    purge_range r = {s, 2 * MiB};
    int res;
    cr_assert_eq(purge_backend_run(&b, &r, 1, MADV_FREE, &res), 0);
    cr_assert_eq(res, -EINVAL);
    cr_assert_eq(purge_backend_kind(&b), LULL_BACKEND_URING);
    cr_assert_geq(b.redone, 1, "the ring's EINVAL was checked one level down");
    cr_assert_eq(b.fallbacks, 0);
    purge_backend_close(&b);
}

/* ---- batching, odd sizes ---------------------------------------------------- */

Test(backend, uring_many_small_ranges_in_batches) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    const size_t n = 1000, len = n * PAGE;
    char *p = map_touched(len);
    purge_range *r = malloc(n * sizeof *r);
    cr_assert_eq(split(r, p, len, PAGE), n);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, NULL), n);
    cr_assert_eq(resident_pages(p, len), 0);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, n);
    cr_assert_geq(b.per_kind[LULL_BACKEND_URING].calls, 4, "1000 SQEs need 4 batches");
    cr_assert_leq(b.per_kind[LULL_BACKEND_URING].calls, 16);
    free(r);
    purge_backend_close(&b);
}

Test(backend, process_madvise_batches_are_few_calls) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_PROCESS_MADVISE);
    const size_t n = 1000, len = n * PAGE;
    char *p = map_touched(len);
    purge_range *r = malloc(n * sizeof *r);
    split(r, p, len, PAGE);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, NULL), n);
    cr_assert_eq(resident_pages(p, len), 0);
    cr_assert_eq(b.per_kind[LULL_BACKEND_PROCESS_MADVISE].calls, 4);
    free(r);
    purge_backend_close(&b);
}

/* 256 ranges of 16 MiB are 4 GiB, but the kernel clamps an iovec total to
 * ~2 GiB: the batch must be split by bytes, or ranges past 2 GiB would be
 * cut short (and process_madvise wrongly given up). */
static void check_4g_batch(lull_backend_kind want) {
    purge_backend b;
    open_forced(&b, want);
    const size_t n = 256, len = n * PURGE_RANGE_MAX;
    char *p =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    madvise(p, len, MADV_NOHUGEPAGE);
    purge_range *r = malloc(n * sizeof *r);
    cr_assert_eq(split(r, p, len, PURGE_RANGE_MAX), n);
    for (size_t i = 0; i < n; i++) { /* first and last page of each range */
        ((char *)r[i].addr)[0] = 1;
        ((char *)r[i].addr)[r[i].len - 1] = 1;
    }
    cr_assert_eq(resident_pages(p, len), 2 * n);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, NULL), n);
    cr_assert_eq(resident_pages(p, len), 0);
    cr_assert_eq(purge_backend_kind(&b), want, "%s", b.fallback_reason);
    cr_assert_eq(b.per_kind[want].ranges, n);
    cr_assert_eq(b.per_kind[want].bytes, len);
    cr_assert_eq(b.redone, 0);
    if (want == LULL_BACKEND_PROCESS_MADVISE) /* at most 2 GiB per call */
        cr_assert_eq(b.per_kind[want].calls, 3);
    free(r);
    munmap(p, len);
    purge_backend_close(&b);
}

Test(backend, process_madvise_4g_batch) {
    check_4g_batch(LULL_BACKEND_PROCESS_MADVISE);
}
Test(backend, uring_4g_batch) {
    check_4g_batch(LULL_BACKEND_URING);
}

Test(backend, oversized_range_is_still_purged) {
    purge_backend b;
    purge_backend_open(&b, LULL_BACKEND_AUTO, NULL);
    const size_t len = 40 * MiB;
    char *p = map_touched(len);
    purge_range r = {p, len};
    int res = 1;
    cr_assert_eq(purge_backend_run(&b, &r, 1, MADV_DONTNEED, &res), 1);
    cr_assert_eq(res, 0);
    cr_assert_eq(resident_pages(p, len), 0);
    purge_backend_close(&b);
}

Test(backend, closed_backend_purges_with_madvise) {
    purge_backend b;
    purge_backend_open(&b, LULL_BACKEND_AUTO, NULL);
    purge_backend_close(&b);
    cr_assert_eq(purge_backend_kind(&b), LULL_BACKEND_MADVISE);
    char *p = map_touched(2 * MiB);
    purge_range r = {p, 2 * MiB};
    cr_assert_eq(purge_backend_run(&b, &r, 1, MADV_DONTNEED, NULL), 1);
    cr_assert_eq(resident_pages(p, 2 * MiB), 0);
    cr_assert_eq(b.per_kind[LULL_BACKEND_MADVISE].ranges, 1);
    cr_assert_eq(purge_backend_run(&b, &r, 0, MADV_DONTNEED, NULL), 0);
}

/* A zeroed struct (a static never opened: pidfd 0) must not close stdin
 * when closed or forgotten after fork, and still purges. */
Test(backend, never_opened_backend_touches_no_fd) {
    int devnull = open("/dev/null", O_RDONLY);
    cr_assert_geq(devnull, 0);
    cr_assert_eq(dup2(devnull, 0), 0);
    static purge_backend zero;
    purge_backend_forget_after_fork(&zero);
    cr_assert_neq(fcntl(0, F_GETFD), -1, "fd 0 closed by forget_after_fork");
    static purge_backend zero2;
    purge_backend_close(&zero2);
    cr_assert_neq(fcntl(0, F_GETFD), -1, "fd 0 closed by close");
    static purge_backend zero3;
    cr_assert_eq(purge_backend_kind(&zero3), LULL_BACKEND_MADVISE);
    char *p = map_touched(2 * MiB);
    purge_range r = {p, 2 * MiB};
    cr_assert_eq(purge_backend_run(&zero3, &r, 1, MADV_DONTNEED, NULL), 1);
    cr_assert_eq(resident_pages(p, 2 * MiB), 0);
    cr_assert_eq(zero3.per_kind[LULL_BACKEND_MADVISE].ranges, 1);
}

/* ---- io-wq affinity ---------------------------------------------------------- */

/* Affinity of every io-wq worker of the calling thread (named
 * iou-wrk-<tid>; a linked-in lull has its own reclaim thread and workers);
 * returns how many. */
static int check_workers(int cpu) {
    char mine[32];
    snprintf(mine, sizeof mine, "iou-wrk-%d\n", gettid());
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    struct dirent *e;
    int workers = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], comm[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
        fclose(f);
        if (strcmp(comm, mine) != 0) continue;
        cpu_set_t s;
        cr_assert_eq(sched_getaffinity(atoi(e->d_name), sizeof s, &s), 0);
        cr_assert_eq(CPU_COUNT(&s), 1, "worker %s on %d CPUs", e->d_name, CPU_COUNT(&s));
        cr_assert(CPU_ISSET(cpu, &s), "worker %s not on CPU %d", e->d_name, cpu);
        workers++;
    }
    closedir(d);
    return workers;
}

Test(backend, iowq_affinity_pins_workers) {
    cpu_set_t allowed, set;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpu = -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed)) cpu = c; /* the last one */
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    purge_backend b;
    if (purge_backend_open(&b, LULL_BACKEND_URING, &set) != LULL_BACKEND_URING)
        cr_skip_test("io_uring unavailable here");
    cr_assert(b.iowq_pinned);
    cr_assert_eq(b.iowq_aff_err, 0);

    const size_t len = 32 * MiB;
    char *p = map_touched(len);
    purge_range r[16];
    size_t n = split(r, p, len, 2 * MiB);
    cr_assert_eq(purge_backend_run(&b, r, n, MADV_DONTNEED, NULL), n);
    cr_assert_eq(resident_pages(p, len), 0);
    cr_assert_geq(check_workers(cpu), 1, "no io-wq worker found");
    purge_backend_close(&b);
}

Test(backend, iowq_affinity_failure_is_reported) {
    cpu_set_t empty;
    CPU_ZERO(&empty);
    purge_backend b;
    if (purge_backend_open(&b, LULL_BACKEND_URING, &empty) != LULL_BACKEND_URING)
        cr_skip_test("io_uring unavailable here");
    cr_assert(!b.iowq_pinned);
    cr_assert_eq(b.iowq_aff_err, -EINVAL);
    /* The ring is still used. */
    char *p = map_touched(2 * MiB);
    purge_range r = {p, 2 * MiB};
    cr_assert_eq(purge_backend_run(&b, &r, 1, MADV_DONTNEED, NULL), 1);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 1);
    purge_backend_close(&b);
}

/* ---- fork --------------------------------------------------------------------- */

Test(backend, fork_child_forgets_ring_and_reopens) {
    purge_backend b;
    open_forced(&b, LULL_BACKEND_URING);
    void *ring_mem = b.ring.sq.ring_ptr;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fail = 0;
        /* MADV_DONTFORK: the parent's ring is not even mapped here. */
        unsigned char v;
        if (mincore(ring_mem, PAGE, &v) != -1 || errno != ENOMEM) fail |= 1;
        purge_backend_forget_after_fork(&b);
        if (b.ring_open || b.pidfd != -1 || purge_backend_kind(&b) != LULL_BACKEND_MADVISE)
            fail |= 2;
        char *p = map_touched(4 * MiB);
        purge_range r[2];
        split(r, p, 4 * MiB, 2 * MiB);
        if (purge_backend_run(&b, r, 2, MADV_DONTNEED, NULL) != 2 ||
            resident_pages(p, 4 * MiB) != 0)
            fail |= 4;
        if (purge_backend_open(&b, LULL_BACKEND_URING, NULL) != LULL_BACKEND_URING) fail |= 8;
        memset(p, 1, 4 * MiB);
        if (purge_backend_run(&b, r, 2, MADV_DONTNEED, NULL) != 2 ||
            resident_pages(p, 4 * MiB) != 0 || b.per_kind[LULL_BACKEND_URING].ranges != 2)
            fail |= 16;
        purge_backend_close(&b);
        _exit(fail);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st));
    cr_assert_eq(WEXITSTATUS(st), 0, "child failure bits %#x", WEXITSTATUS(st));

    /* The parent's ring is untouched by all that. */
    char *p = map_touched(4 * MiB);
    purge_range r[2];
    cr_assert_eq(purge_backend_run(&b, r, split(r, p, 4 * MiB, 2 * MiB), MADV_DONTNEED, NULL), 2);
    cr_assert_eq(resident_pages(p, 4 * MiB), 0);
    cr_assert_eq(purge_backend_kind(&b), LULL_BACKEND_URING);
    cr_assert_eq(b.per_kind[LULL_BACKEND_URING].ranges, 2);
    purge_backend_close(&b);
}
