/* Refault monitor (reclaim/uffd.c): each mechanism gives the right answer,
 * the fallbacks are taken when the kernel says no, a writer never waits for
 * the monitor, registration does not split VMAs, and fork is handled. */
#define _GNU_SOURCE
#include "reclaim/uffd.h"
#include "base/fault.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define SEG (32 * MiB)

static size_t ps;

static void setup(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    for (int p = 0; p < LULL_FAULT_COUNT; p++)
        lull_fault_arm((lull_fault_point)p, 0);
}

static void teardown(void) {
    for (int p = 0; p < LULL_FAULT_COUNT; p++)
        lull_fault_arm((lull_fault_point)p, 0);
}

TestSuite(uffd, .init = setup, .fini = teardown, .timeout = 120);

/* Kernel at least major.minor? */
static bool kernel_at_least(int major, int minor) {
    struct utsname u;
    if (uname(&u) != 0) return false;
    int a = 0, b = 0;
    if (sscanf(u.release, "%d.%d", &a, &b) != 2) return false;
    return a > major || (a == major && b >= minor);
}

/* A segment of SEG bytes, 2 MiB aligned, 4 KiB pages unless thp. */
static char *map_segment(size_t len, bool thp) {
    size_t align = 2 * MiB;
    char *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(raw, MAP_FAILED);
    char *p = (char *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + len + align > p + len) munmap(p + len, (size_t)(raw + len + align - (p + len)));
    cr_assert_eq(madvise(p, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE), 0);
    return p;
}

static void touch(char *p, size_t len) {
    for (size_t i = 0; i < len; i += ps)
        ((volatile char *)p)[i] = 1;
}

/* Pages of a purged range that the test writes again (page indexes). */
static const size_t subset[] = {0, 1, 2, 100, 511, 512, 513, 1000, 1001, 1002, 1003, 2047};
#define NSUBSET (sizeof subset / sizeof subset[0])
#define PURGE_LEN (8 * MiB) /* 2048 pages */

/* The regions must cover exactly the pages of subset[] in base. */
static void expect_exactly_subset(const char *base, const struct page_region *v, long n) {
    static unsigned char want[PURGE_LEN / 4096], got[PURGE_LEN / 4096];
    size_t npages = PURGE_LEN / ps;
    memset(want, 0, sizeof want);
    memset(got, 0, sizeof got);
    for (size_t i = 0; i < NSUBSET; i++)
        want[subset[i]] = 1;
    for (long r = 0; r < n; r++) {
        cr_assert_geq(v[r].start, (uintptr_t)base);
        cr_assert_leq(v[r].end, (uintptr_t)base + PURGE_LEN);
        for (uintptr_t a = v[r].start; a < v[r].end; a += ps)
            got[(a - (uintptr_t)base) / ps] = 1;
    }
    for (size_t i = 0; i < npages; i++)
        cr_expect_eq(got[i], want[i], "page %zu of the purged range: reported %d, written %d", i,
                     got[i], want[i]);
}

/* The scenario every mechanism must answer the same way: a registered
 * 32 MiB segment, all touched; ranges A and B purged and armed; a subset
 * of A written again (and a few pages of B only read); the scan of A says
 * exactly that subset, the scan of B says nothing. */
static void purged_subset_scenario(refault_monitor *m, bool thp) {
    char *seg = map_segment(SEG, thp);
    cr_assert_eq(refault_register(m, seg, SEG), 0);
    touch(seg, SEG);
    char *a = seg + 4 * MiB, *b = seg + 16 * MiB;
    cr_assert_eq(madvise(a, PURGE_LEN, MADV_DONTNEED), 0);
    cr_assert_eq(madvise(b, PURGE_LEN, MADV_DONTNEED), 0);
    cr_assert_eq(refault_arm(m, a, PURGE_LEN), 0);
    cr_assert_eq(refault_arm(m, b, PURGE_LEN), 0);
    for (size_t i = 0; i < NSUBSET; i++)
        a[subset[i] * ps] = 7;

    struct page_region v[64];
    size_t pages = 99;
    long n = refault_scan(m, a, PURGE_LEN, v, 64, false, &pages);
    cr_assert_geq(n, 1, "scan of A: %ld", n);
    cr_assert_eq(pages, NSUBSET);
    cr_assert_eq(m->scan_end, (uintptr_t)a + PURGE_LEN);
    expect_exactly_subset(a, v, n);

    n = refault_scan(m, b, PURGE_LEN, v, 64, false, &pages);
    cr_assert_eq(n, 0, "scan of B (left alone) found %ld regions", n);
    cr_assert_eq(pages, 0);
    munmap(seg, SEG);
}

Test(uffd, open_picks_wp_async_on_this_kernel) {
    refault_monitor m;
    refault_mechanism k = refault_monitor_open(&m, false);
    if (!kernel_at_least(6, 7))
        cr_skip_test("kernel before 6.7: no WP_ASYNC / PAGEMAP_SCAN (got %s)",
                     refault_mechanism_name(k));
    cr_assert_eq(k, REFAULT_WP_ASYNC, "got %s: %s", refault_mechanism_name(k), m.reason);
    cr_assert_eq(m.kind, k);
    cr_assert_str_eq(m.reason, "");
    cr_assert_geq(m.uffd, 0);
    cr_assert_geq(m.pagemap, 0);
    cr_assert(!m.uffd_from_dev, "userfaultfd(2) with UFFD_USER_MODE_ONLY is tried first");
    cr_assert(m.uffd_features & UFFD_FEATURE_WP_ASYNC);
    cr_assert_str_eq(refault_mechanism_name(k), "wp_async");
    refault_monitor_close(&m);
    cr_assert_eq(m.uffd, -1);
    cr_assert_eq(m.kind, REFAULT_OFF);
}

static void need_wp_async(refault_monitor *m) {
    if (refault_monitor_open(m, false) != REFAULT_WP_ASYNC)
        cr_skip_test("no WP_ASYNC here: %s", m->reason);
}

Test(uffd, wp_async_reports_exactly_the_written_purged_pages) {
    refault_monitor m;
    need_wp_async(&m);
    purged_subset_scenario(&m, false);
    refault_monitor_close(&m);
}

Test(uffd, wp_async_reports_exactly_the_written_purged_pages_thp) {
    refault_monitor m;
    need_wp_async(&m);
    purged_subset_scenario(&m, true);
    refault_monitor_close(&m);
}

/* MADV_DONTNEED drops the markers: an armed range that is purged again
 * reads as all written until it is armed again; re-arming works, and a
 * scan with rearm protects what it found. */
Test(uffd, dontneed_drops_markers_and_rearm_works) {
    refault_monitor m;
    need_wp_async(&m);
    char *seg = map_segment(SEG, false);
    cr_assert_eq(refault_register(&m, seg, SEG), 0);
    touch(seg, SEG);
    struct page_region v[64];
    size_t pages;

    /* registered but never armed: everything reads as written */
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 1);
    cr_assert_eq(pages, SEG / ps);

    cr_assert_eq(refault_arm(&m, seg, SEG), 0); /* present pages protected */
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 0);

    cr_assert_eq(madvise(seg, 4 * MiB, MADV_DONTNEED), 0);
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 1);
    cr_assert_eq(pages, 4 * MiB / ps, "purging drops the markers of exactly the purged range");
    cr_assert_eq(v[0].start, (uintptr_t)seg);

    cr_assert_eq(refault_arm(&m, seg, 4 * MiB), 0);
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 0);

    /* a read of an armed hole is not a write */
    for (size_t i = 0; i < 4 * MiB; i += 16 * ps)
        (void)((volatile char *)seg)[i];
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 0);

    /* rearm in the scan: the second scan sees only newer writes */
    seg[0] = 1;
    seg[8 * MiB] = 1;
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, true, &pages), 2);
    cr_assert_eq(pages, 2);
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 0);
    seg[8 * MiB] = 2;
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 1);
    cr_assert_eq(v[0].start, (uintptr_t)seg + 8 * MiB);

    /* the same again and again */
    for (int round = 0; round < 5; round++) {
        cr_assert_eq(madvise(seg, SEG, MADV_DONTNEED), 0);
        cr_assert_eq(refault_arm(&m, seg, SEG), 0);
        seg[(size_t)round * ps] = 1;
        cr_assert_eq(refault_scan(&m, seg, SEG, v, 64, false, &pages), 1);
        cr_assert_eq(pages, 1);
    }
    munmap(seg, SEG);
    refault_monitor_close(&m);
}

/* A scan over a range the monitor never registered must not pass for
 * "all written". */
Test(uffd, wp_async_scan_of_unregistered_range_fails) {
    refault_monitor m;
    need_wp_async(&m);
    char *p = map_segment(4 * MiB, false);
    touch(p, 4 * MiB);
    struct page_region v[4];
    size_t pages = 5;
    cr_assert_eq(refault_scan(&m, p, 4 * MiB, v, 4, false, &pages), -EPERM);
    cr_assert_eq(pages, 0);
    cr_assert_eq(refault_arm(&m, p, 4 * MiB), -ENOENT);
    cr_assert_eq(refault_register(&m, p + 1, ps), -EINVAL);
    munmap(p, 4 * MiB);
    refault_monitor_close(&m);
}

/* The out array fills: the walk stops, scan_end says where, and a second
 * call from there finds the rest. */
Test(uffd, scan_continues_where_the_array_filled) {
    refault_monitor m;
    need_wp_async(&m);
    char *seg = map_segment(SEG, false);
    cr_assert_eq(refault_register(&m, seg, SEG), 0);
    cr_assert_eq(refault_arm(&m, seg, SEG), 0);
    for (size_t i = 0; i < 10; i++)
        seg[i * 2 * MiB] = 1; /* 10 separate regions */
    struct page_region v[4];
    size_t pages, total = 0;
    long regions = 0;
    char *at = seg;
    int calls = 0;
    while (at < seg + SEG) {
        long n = refault_scan(&m, at, (size_t)(seg + SEG - at), v, 4, true, &pages);
        cr_assert_geq(n, 0);
        cr_assert_leq(n, 4);
        regions += n;
        total += pages;
        cr_assert_gt(m.scan_end, (uintptr_t)at);
        at = (char *)m.scan_end;
        cr_assert_lt(++calls, 10);
    }
    cr_assert_eq(regions, 10);
    cr_assert_eq(total, 10);
    cr_assert_geq(calls, 3);
    /* rearm protected each page once found, and none was lost */
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 4, false, &pages), 0);
    munmap(seg, SEG);
    refault_monitor_close(&m);
}

/* userfaultfd(2) denied: /dev/userfaultfd is the second way. */
Test(uffd, dev_userfaultfd_when_the_syscall_is_denied) {
    if (access("/dev/userfaultfd", R_OK | W_OK) != 0) cr_skip_test("/dev/userfaultfd not usable");
    if (!kernel_at_least(6, 7)) cr_skip_test("kernel before 6.7");
    lull_fault_arm(LULL_FAULT_UFFD, 1);
    refault_monitor m;
    cr_assert_eq(refault_monitor_open(&m, false), REFAULT_WP_ASYNC, "%s", m.reason);
    cr_assert(m.uffd_from_dev);
    purged_subset_scenario(&m, false);
    refault_monitor_close(&m);
}

Test(uffd, present_scan_when_uffd_is_denied_gives_the_same_answer) {
    if (!kernel_at_least(6, 7)) cr_skip_test("kernel before 6.7: no PAGEMAP_SCAN");
    lull_fault_arm(LULL_FAULT_UFFD, -1);
    refault_monitor m;
    cr_assert_eq(refault_monitor_open(&m, false), REFAULT_PRESENT_SCAN, "got %s",
                 refault_mechanism_name(m.kind));
    cr_assert_str_eq(refault_mechanism_name(m.kind), "present_scan");
    cr_assert_neq(m.reason[0], '\0');
    cr_assert_eq(m.uffd, -1);
    cr_assert_geq(m.pagemap, 0);
    purged_subset_scenario(&m, false);
    cr_assert_eq(m.registered_bytes, 0, "register is a no-op without userfaultfd");
    refault_monitor_close(&m);
}

Test(uffd, accounting_when_pagemap_scan_is_denied_too) {
    lull_fault_arm(LULL_FAULT_UFFD, -1);
    lull_fault_arm(LULL_FAULT_PAGEMAP_SCAN, -1);
    refault_monitor m;
    cr_assert_eq(refault_monitor_open(&m, false), REFAULT_ACCOUNTING, "got %s",
                 refault_mechanism_name(m.kind));
    cr_assert_str_eq(refault_mechanism_name(m.kind), "accounting");
    cr_assert_neq(m.reason[0], '\0');
    cr_assert_eq(m.uffd, -1);
    cr_assert_eq(m.pagemap, -1);
    char *p = map_segment(4 * MiB, false);
    cr_assert_eq(refault_register(&m, p, 4 * MiB), 0);
    cr_assert_eq(refault_arm(&m, p, 4 * MiB), 0);
    struct page_region v[4];
    size_t pages = 3;
    cr_assert_eq(refault_scan(&m, p, 4 * MiB, v, 4, false, &pages), -EOPNOTSUPP);
    cr_assert_eq(pages, 0);
    munmap(p, 4 * MiB);
    refault_monitor_close(&m);
}

/* Without PAGEMAP_SCAN a userfaultfd alone cannot be read back. */
Test(uffd, accounting_when_only_pagemap_scan_is_denied) {
    lull_fault_arm(LULL_FAULT_PAGEMAP_SCAN, -1);
    refault_monitor m;
    cr_assert_eq(refault_monitor_open(&m, false), REFAULT_ACCOUNTING);
    cr_assert_eq(m.uffd, -1);
    refault_monitor_close(&m);
}

/* PAGEMAP_SCAN failing after open: the scan says so, nothing crashes. */
Test(uffd, scan_error_is_returned) {
    refault_monitor m;
    need_wp_async(&m);
    char *p = map_segment(4 * MiB, false);
    cr_assert_eq(refault_register(&m, p, 4 * MiB), 0);
    lull_fault_arm(LULL_FAULT_PAGEMAP_SCAN, 1);
    struct page_region v[4];
    size_t pages;
    cr_assert_eq(refault_scan(&m, p, 4 * MiB, v, 4, false, &pages), -EINVAL);
    cr_assert_eq(refault_scan(&m, p, 4 * MiB, v, 4, false, &pages), 1);
    munmap(p, 4 * MiB);
    refault_monitor_close(&m);
}

Test(uffd, off_by_configuration) {
    refault_monitor m;
    cr_assert_eq(refault_monitor_open(&m, true), REFAULT_OFF);
    cr_assert_str_eq(refault_mechanism_name(m.kind), "off");
    cr_assert_neq(m.reason[0], '\0');
    cr_assert_eq(m.uffd, -1);
    cr_assert_eq(m.pagemap, -1);
    char *p = map_segment(4 * MiB, false);
    cr_assert_eq(refault_register(&m, p, 4 * MiB), 0);
    cr_assert_eq(refault_arm(&m, p, 4 * MiB), 0);
    struct page_region v[4];
    cr_assert_eq(refault_scan(&m, p, 4 * MiB, v, 4, false, NULL), -EOPNOTSUPP);
    /* and it stays off in a forked child */
    cr_assert_not(refault_monitor_after_fork_child(&m));
    cr_assert_eq(m.kind, REFAULT_OFF);
    munmap(p, 4 * MiB);
}

/* PRESENT_SCAN over THP memory: a write to an (unarmed) purged 2 MiB
 * extent brings the whole extent back as a huge page, and the scan reports
 * the whole extent: what came back in memory, not what was written. The
 * answer covers the written pages and stays inside their extents. */
Test(uffd, present_scan_with_thp_reports_whole_extents) {
    if (!kernel_at_least(6, 7)) cr_skip_test("kernel before 6.7");
    refault_monitor m;
    cr_assert_eq(refault_monitor_open_at_most(&m, REFAULT_PRESENT_SCAN), REFAULT_PRESENT_SCAN);
    char *seg = map_segment(SEG, true);
    touch(seg, SEG);
    char *a = seg + 4 * MiB;
    cr_assert_eq(madvise(a, PURGE_LEN, MADV_DONTNEED), 0);
    for (size_t i = 0; i < NSUBSET; i++)
        a[subset[i] * ps] = 7;
    struct page_region v[64];
    size_t pages;
    long n = refault_scan(&m, a, PURGE_LEN, v, 64, false, &pages);
    cr_assert_geq(n, 1);
    size_t per_extent = 2 * MiB / ps;
    bool extent_written[PURGE_LEN / (2 * MiB)] = {false};
    for (size_t i = 0; i < NSUBSET; i++)
        extent_written[subset[i] / per_extent] = true;
    size_t covered = 0;
    for (long r = 0; r < n; r++)
        for (uintptr_t p = v[r].start; p < v[r].end; p += ps) {
            size_t page = (p - (uintptr_t)a) / ps;
            cr_assert(extent_written[page / per_extent], "page %zu reported, extent untouched",
                      page);
            covered++;
        }
    for (size_t i = 0; i < NSUBSET; i++) {
        bool found = false;
        for (long r = 0; r < n; r++)
            found |= (uintptr_t)a + subset[i] * ps >= v[r].start &&
                     (uintptr_t)a + subset[i] * ps < v[r].end;
        cr_assert(found, "written page %zu not reported", subset[i]);
    }
    cr_assert_eq(covered, pages);
    munmap(seg, SEG);
    refault_monitor_close(&m);
}

/* A configured limit: present_scan keeps userfaultfd out (and stays so in a
 * forked child); accounting keeps PAGEMAP_SCAN out too. */
Test(uffd, open_at_most_respects_the_limit) {
    if (!kernel_at_least(6, 7)) cr_skip_test("kernel before 6.7");
    refault_monitor m;
    cr_assert_eq(refault_monitor_open_at_most(&m, REFAULT_PRESENT_SCAN), REFAULT_PRESENT_SCAN);
    cr_assert_eq(m.uffd, -1);
    cr_assert_str_eq(m.reason, "present_scan chosen by configuration");
    purged_subset_scenario(&m, false);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        bool rereg = refault_monitor_after_fork_child(&m);
        _exit(!rereg && m.kind == REFAULT_PRESENT_SCAN && m.uffd == -1 ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    refault_monitor_close(&m);

    cr_assert_eq(refault_monitor_open_at_most(&m, REFAULT_ACCOUNTING), REFAULT_ACCOUNTING);
    cr_assert_eq(m.pagemap, -1);
    cr_assert_str_eq(m.reason, "accounting chosen by configuration");
    refault_monitor_close(&m);
    cr_assert_eq(refault_monitor_open_at_most(&m, REFAULT_OFF), REFAULT_OFF);
}

/* A request thread writing to protected pages, present and purged, from
 * user mode and from kernel mode (read(2) into the page), while nobody
 * reads the userfaultfd: every write completes, no event is queued, and
 * all of them are counted. With a synchronous WP mode the writer would
 * wait forever; the timeout turns that into a failure. */
struct writer {
    char *p;
    size_t len;
    int pipe_rd;
    size_t kernel_writes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
};

static void *writer_main(void *arg) {
    struct writer *w = arg;
    for (size_t i = 0; i < w->len; i += ps)
        w->p[i] = 3;
    /* kernel-mode writes into the first bytes of every 16th page */
    for (size_t i = ps / 2; i < w->len; i += 16 * ps) {
        ssize_t r = read(w->pipe_rd, w->p + i, 1);
        if (r == 1) w->kernel_writes++;
    }
    pthread_mutex_lock(&w->mu);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

Test(uffd, writer_never_blocks_without_a_reader) {
    refault_monitor m;
    need_wp_async(&m);
    size_t len = 16 * MiB;
    char *seg = map_segment(len, false);
    cr_assert_eq(refault_register(&m, seg, len), 0);
    touch(seg, len);
    cr_assert_eq(madvise(seg, len / 2, MADV_DONTNEED), 0); /* half purged, half present */
    cr_assert_eq(refault_arm(&m, seg, len), 0);
    struct page_region v[8];
    size_t pages;
    cr_assert_eq(refault_scan(&m, seg, len, v, 8, false, &pages), 0);

    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    size_t nk = 0;
    for (size_t i = ps / 2; i < len; i += 16 * ps)
        nk++;
    for (size_t i = 0; i < nk; i++)
        cr_assert_eq(write(fds[1], "k", 1), 1);

    struct writer w = {.p = seg, .len = len, .pipe_rd = fds[0]};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, writer_main, &w), 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 20;
    pthread_mutex_lock(&w.mu);
    int rc = 0;
    while (!w.done && rc == 0)
        rc = pthread_cond_timedwait(&w.cv, &w.mu, &deadline);
    bool done = w.done;
    pthread_mutex_unlock(&w.mu);
    cr_assert(done, "the writer blocked on a write-protected page (nobody reads the uffd)");
    pthread_join(t, NULL);
    cr_assert_eq(w.kernel_writes, nk);

    struct pollfd pfd = {.fd = m.uffd, .events = POLLIN};
    cr_assert_eq(poll(&pfd, 1, 0), 0, "no fault was queued for a handler");

    cr_assert_eq(refault_scan(&m, seg, len, v, 8, false, &pages), 1);
    cr_assert_eq(pages, len / ps, "every write, user or kernel mode, was tracked");
    close(fds[0]);
    close(fds[1]);
    munmap(seg, len);
    refault_monitor_close(&m);
}

/* Lines of /proc/self/maps that overlap [p, p+len), read without stdio. */
static int vmas_in(const void *p, size_t len) {
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    static char buf[1 << 20];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    buf[n] = '\0';
    int count = 0;
    uintptr_t lo = (uintptr_t)p, hi = lo + len;
    for (char *line = buf; *line;) {
        unsigned long s, e;
        if (sscanf(line, "%lx-%lx", &s, &e) == 2 && s < hi && e > lo) count++;
        char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return count;
}

Test(uffd, registration_covers_the_whole_segment_in_one_vma) {
    refault_monitor m;
    need_wp_async(&m);
    char *seg = map_segment(SEG, false);
    cr_assert_eq(vmas_in(seg, SEG), 1);
    cr_assert_eq(refault_register(&m, seg, SEG), 0);
    touch(seg, SEG);
    for (size_t off = 0; off < SEG; off += 3 * MiB) {
        size_t l = off + MiB <= SEG ? MiB : SEG - off;
        cr_assert_eq(madvise(seg + off, l, MADV_DONTNEED), 0);
        cr_assert_eq(refault_arm(&m, seg + off, l), 0);
    }
    struct page_region v[64];
    size_t pages;
    cr_assert_geq(refault_scan(&m, seg, SEG, v, 64, true, &pages), 0);
    cr_assert_eq(vmas_in(seg, SEG), 1, "register/arm/purge/scan split the segment's VMA");

    /* The check can fail: registering part of a VMA does split it. */
    char *other = map_segment(4 * MiB, false);
    cr_assert_eq(refault_register(&m, other + MiB, MiB), 0);
    cr_assert_eq(vmas_in(other, 4 * MiB), 3);
    munmap(other, 4 * MiB);
    munmap(seg, SEG);
    refault_monitor_close(&m);
}

static bool is_userfaultfd(int fd) {
    char path[64], target[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) return false;
    target[n] = 0;
    return strstr(target, "userfaultfd") != NULL;
}

/* Fork: the child's memory is not registered, the inherited descriptors
 * belong to the parent; after refault_monitor_after_fork_child() the child
 * has its own working monitor, and the parent's is untouched. */
Test(uffd, fork_child_reopens_and_reregisters) {
    refault_monitor m;
    need_wp_async(&m);
    char *seg = map_segment(SEG, false);
    cr_assert_eq(refault_register(&m, seg, SEG), 0);
    touch(seg, SEG);
    cr_assert_eq(refault_arm(&m, seg, SEG), 0);
    int parent_uffd = m.uffd;

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct page_region v[8];
        size_t pages;
        int step = 1;
        seg[0] = 9; /* the child's copy; not registered in the child */
        if (refault_scan(&m, seg, SEG, v, 8, false, &pages) != -ECHILD) _exit(step);
        step++;
        if (refault_arm(&m, seg, SEG) != -ECHILD) _exit(step);
        step++;
        if (!refault_monitor_after_fork_child(&m)) _exit(step);
        step++;
        if (m.kind != REFAULT_WP_ASYNC || m.uffd < 0) _exit(step);
        step++;
        /* the parent's descriptor is closed: its number may be taken again
         * (the child's lull reclaim thread opens files too), but not by
         * another userfaultfd than the child's own */
        if (parent_uffd != m.uffd && is_userfaultfd(parent_uffd)) _exit(step);
        step++;
        if (refault_scan(&m, seg, SEG, v, 8, false, &pages) != -EPERM) _exit(step);
        step++;
        if (refault_register(&m, seg, SEG) != 0) _exit(step);
        step++;
        if (refault_arm(&m, seg, SEG) != 0) _exit(step);
        step++;
        seg[5 * ps] = 1;
        if (refault_scan(&m, seg, SEG, v, 8, false, &pages) != 1 || pages != 1 ||
            v[0].start != (uintptr_t)seg + 5 * ps)
            _exit(step);
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status));
    cr_assert_eq(WEXITSTATUS(status), 0, "child failed at step %d", WEXITSTATUS(status));

    /* the parent's monitor still works and saw none of the child's writes */
    struct page_region v[8];
    size_t pages;
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 8, false, &pages), 0);
    seg[7 * ps] = 1;
    cr_assert_eq(refault_scan(&m, seg, SEG, v, 8, false, &pages), 1);
    cr_assert_eq(v[0].start, (uintptr_t)seg + 7 * ps);
    munmap(seg, SEG);
    refault_monitor_close(&m);
}

/* THP: arming a purged range puts PTE-level markers there, so the refault
 * comes back as 4 KiB pages (and only the written page is reported). */
Test(uffd, armed_range_refaults_with_small_pages) {
    refault_monitor m;
    need_wp_async(&m);
    char *seg = map_segment(SEG, true);
    cr_assert_eq(refault_register(&m, seg, SEG), 0);
    touch(seg, SEG);
    cr_assert_eq(madvise(seg, 4 * MiB, MADV_DONTNEED), 0);
    cr_assert_eq(refault_arm(&m, seg, 4 * MiB), 0);
    seg[0] = 1;
    struct page_region v[4];
    size_t pages;
    cr_assert_eq(refault_scan(&m, seg, 4 * MiB, v, 4, false, &pages), 1);
    cr_assert_eq(pages, 1);
    /* PAGE_IS_HUGE of that page, asked directly */
    struct pm_scan_arg a = {.size = sizeof a,
                            .start = (uintptr_t)seg,
                            .end = (uintptr_t)seg + 2 * MiB,
                            .vec = (uintptr_t)v,
                            .vec_len = 4,
                            .category_anyof_mask = PAGE_IS_PRESENT,
                            .return_mask = PAGE_IS_PRESENT | PAGE_IS_HUGE};
    cr_assert_eq(ioctl(m.pagemap, PAGEMAP_SCAN, &a), 1);
    cr_assert_eq(v[0].end - v[0].start, ps);
    cr_assert_eq(v[0].categories & PAGE_IS_HUGE, 0);
    munmap(seg, SEG);
    refault_monitor_close(&m);
}
