/* What a userfaultfd registration costs the rest of the process.
 *
 * On 6.18 MADV_DONTNEED takes only the per-VMA lock, except on a VMA
 * registered with userfaultfd, where it takes the process-wide mmap_lock
 * (read): another thread's mmap/munmap (mmap_lock write) then waits for the
 * whole madvise call. This measures that wait.
 *
 *   thread A (CPU 0): over a 1 GiB region, chunk by chunk: write one byte
 *                     per page, madvise(MADV_DONTNEED) the chunk, and in the
 *                     "registered+arm" case write-protect it again
 *                     (UFFDIO_WRITEPROTECT, what the refault monitor does).
 *   thread B (CPU 1): mmap 64 KiB, write its 16 pages, munmap; the latency
 *                     of each such call is recorded, and the part of it B
 *                     spent blocked (wall - CLOCK_THREAD_CPUTIME_ID - the
 *                     run-queue wait of /proc/thread-self/schedstat): on a
 *                     busy 2-CPU machine CPU contention dominates the wall
 *                     time, the blocked time is the mmap_lock wait.
 *
 * Cases: A idle; region not registered; registered (WP_ASYNC |
 * WP_UNPOPULATED, nothing armed); registered + arm after each purge; with
 * 16 MiB and 2 MiB purge chunks. Then "scan+rearm": the region registered
 * and armed, A writes one page in 64 of a chunk and runs one PAGEMAP_SCAN
 * (PAGE_IS_WRITTEN, WP_MATCHING) over it, chunk 1 GiB and 64 MiB: the scan
 * holds mmap_lock (read) for its whole walk. Printed: B's p50 / p99 /
 * p99.9 / max and call count; A's operations (purges or scans) and the
 * time of one (madvise or scan ioctl), and of the arm ioctl. Last, the
 * control "faults only": the region registered, purged and armed before B
 * starts; A only writes to it (WP_ASYNC faults on armed holes), no madvise
 * or uffd ioctl: does a fault on a registered VMA block B?
 *
 * Second table (--costs, or always first): the refault monitor's own costs
 * (register, arm, scan per GiB).
 *
 * Standalone: gcc -O2 -pthread bench/uffd_mmap_lock.c -o uffd_mmap_lock
 * Options: --seconds N (per case, default 3), --thp (MADV_HUGEPAGE on the
 * region instead of MADV_NOHUGEPAGE), --no-costs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Newer than the Linux 6.1 headers (same values as base/linux_compat.h). */
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef PAGEMAP_SCAN
#define PAGE_IS_WRITTEN (1 << 1)
#define PAGE_IS_PRESENT (1 << 3)
#define PAGE_IS_SWAPPED (1 << 4)
#define PAGE_IS_PFNZERO (1 << 5)
struct page_region {
    __u64 start, end, categories;
};
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
struct pm_scan_arg {
    __u64 size, flags, start, end, walk_end, vec, vec_len, max_pages;
    __u64 category_inverted, category_mask, category_anyof_mask, return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#endif

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
#define REGION GiB
#define B_LEN (64 * KiB)
#define MAX_SAMPLES (4u << 20)

static size_t ps;
static bool thp;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "uffd_mmap_lock: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu % (int)sysconf(_SC_NPROCESSORS_ONLN), &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static int open_uffd(void) {
    int fd = (int)syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0) die("userfaultfd");
    struct uffdio_api api = {.api = UFFD_API,
                             .features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED};
    if (ioctl(fd, UFFDIO_API, &api)) die("UFFDIO_API (WP_ASYNC | WP_UNPOPULATED)");
    return fd;
}

static void uffd_register(int uffd, void *p, size_t len) {
    struct uffdio_register r = {.range = {(uintptr_t)p, len}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &r)) die("UFFDIO_REGISTER");
}

static void uffd_wp(int uffd, void *p, size_t len) {
    struct uffdio_writeprotect w = {.range = {(uintptr_t)p, len},
                                    .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(uffd, UFFDIO_WRITEPROTECT, &w)) die("UFFDIO_WRITEPROTECT");
}

static long pm_scan(int pm, void *p, size_t len, __u64 flags, __u64 anyof, __u64 inv, __u64 mask,
                    struct page_region *v, size_t n) {
    struct pm_scan_arg a = {.size = sizeof a,
                            .flags = flags,
                            .start = (uintptr_t)p,
                            .end = (uintptr_t)p + len,
                            .vec = (uintptr_t)v,
                            .vec_len = n,
                            .category_inverted = inv,
                            .category_mask = mask,
                            .category_anyof_mask = anyof,
                            .return_mask = anyof};
    long r = ioctl(pm, PAGEMAP_SCAN, &a);
    if (r < 0) die("PAGEMAP_SCAN");
    return r;
}

static void touch(char *p, size_t len) {
    for (size_t i = 0; i < len; i += ps)
        ((volatile char *)p)[i] = 1;
}

/* Populate a range in one call where the kernel can (5.14+): much faster
 * than a fault per page. */
static void populate(char *p, size_t len) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
    if (madvise(p, len, MADV_POPULATE_WRITE) != 0) touch(p, len);
}

static char *map_region(size_t len) {
    char *raw = mmap(NULL, len + 2 * MiB, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) die("mmap region");
    char *p = (char *)(((uintptr_t)raw + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    munmap(p + len, (size_t)(raw + len + 2 * MiB - (p + len)));
    madvise(p, len, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    return p;
}

/* ---- the mmap_lock experiment ---- */

enum a_mode { A_IDLE, A_PLAIN, A_REGISTERED, A_REGISTERED_ARM, A_SCAN, A_FAULTS };
static const char *const a_mode_name[] = {"A idle",         "not registered", "registered",
                                          "registered+arm", "scan+rearm",     "faults only"};

struct run {
    enum a_mode mode;
    size_t chunk;
    char *region;
    int uffd;
    int pagemap;
    atomic_bool stop;
    atomic_bool a_ready;
    /* A's figures */
    uint64_t purges, madv_ns, madv_max_ns, arm_ns;
    /* B's samples: wall latency, and the part of it B spent blocked */
    uint64_t *lat;
    uint64_t *blk;
    size_t n;
};

static void *thread_a(void *arg) {
    struct run *r = arg;
    pin(0);
    size_t off = 0;
    atomic_store(&r->a_ready, true);
    static struct page_region v[4096];
    if (r->mode == A_FAULTS) {
        /* one pass of write faults over the purged, armed region: no
         * madvise, no uffd ioctl while B runs */
        for (off = 0; off < REGION && !atomic_load(&r->stop); off += r->chunk) {
            touch(r->region + off, r->chunk);
            r->purges++;
        }
        atomic_store(&r->stop, true);
        return NULL;
    }
    while (r->mode == A_SCAN && !atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        /* write 1 page in 64, then one scan + rearm ioctl over the chunk */
        char *c = r->region + off;
        for (size_t i = 0; i < r->chunk; i += 64 * ps)
            c[i] = 2;
        uint64_t t0 = now_ns();
        pm_scan(r->pagemap, c, r->chunk, PM_SCAN_CHECK_WPASYNC | PM_SCAN_WP_MATCHING,
                PAGE_IS_WRITTEN, 0, 0, v, 4096);
        uint64_t t1 = now_ns();
        r->purges++;
        r->madv_ns += t1 - t0;
        if (t1 - t0 > r->madv_max_ns) r->madv_max_ns = t1 - t0;
        off = (off + r->chunk) % REGION;
    }
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        char *c = r->region + off;
        touch(c, r->chunk);
        uint64_t t0 = now_ns();
        if (madvise(c, r->chunk, MADV_DONTNEED)) die("madvise");
        uint64_t t1 = now_ns();
        if (r->mode == A_REGISTERED_ARM) {
            uffd_wp(r->uffd, c, r->chunk);
            r->arm_ns += now_ns() - t1;
        }
        r->purges++;
        r->madv_ns += t1 - t0;
        if (t1 - t0 > r->madv_max_ns) r->madv_max_ns = t1 - t0;
        off = (off + r->chunk) % REGION;
    }
    return NULL;
}

/* B's run-queue wait so far (ns): /proc/thread-self/schedstat, field 2. It
 * changes only when B is switched in, so it is exact while B runs. */
static uint64_t run_delay(int fd) {
    char buf[128];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = '\0';
    unsigned long long cpu = 0, delay = 0;
    if (sscanf(buf, "%llu %llu", &cpu, &delay) != 2) return 0;
    return delay;
}

static uint64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *thread_b(void *arg) {
    struct run *r = arg;
    pin(1);
    int sfd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed) && r->n < MAX_SAMPLES) {
        uint64_t d0 = sfd >= 0 ? run_delay(sfd) : 0;
        uint64_t c0 = thread_cpu_ns();
        uint64_t t0 = now_ns();
        char *p = mmap(NULL, B_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("mmap B");
        for (size_t i = 0; i < B_LEN; i += ps)
            p[i] = 1;
        munmap(p, B_LEN);
        uint64_t t1 = now_ns();
        uint64_t c1 = thread_cpu_ns();
        uint64_t d1 = sfd >= 0 ? run_delay(sfd) : 0;
        /* wall = on CPU + waiting for a CPU + blocked (asleep: here the
         * mmap_lock, as B does no I/O). The CPU is contended on a small
         * machine; the blocked part is what another thread's lock costs. */
        uint64_t wall = t1 - t0, other = (c1 - c0) + (d1 - d0);
        r->lat[r->n] = wall;
        r->blk[r->n] = wall > other ? wall - other : 0;
        r->n++;
    }
    if (sfd >= 0) close(sfd);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *s, size_t n, double p) {
    size_t i = (size_t)(p * (double)(n - 1));
    return (double)s[i] / 1000.0;
}

static void run_case(enum a_mode mode, size_t chunk, double seconds, uint64_t *lat, uint64_t *blk) {
    struct run r = {
        .mode = mode, .chunk = chunk, .uffd = -1, .pagemap = -1, .lat = lat, .blk = blk};
    r.region = map_region(REGION);
    if (mode == A_REGISTERED || mode == A_REGISTERED_ARM || mode == A_SCAN || mode == A_FAULTS) {
        r.uffd = open_uffd();
        uffd_register(r.uffd, r.region, REGION);
    }
    populate(r.region, REGION); /* the region starts populated, as a heap does */
    if (mode == A_FAULTS) {
        madvise(r.region, REGION, MADV_DONTNEED);
        uffd_wp(r.uffd, r.region, REGION);
    }
    if (mode == A_SCAN) {
        uffd_wp(r.uffd, r.region, REGION);
        r.pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
        if (r.pagemap < 0) die("open /proc/self/pagemap");
    }
    pthread_t a, b;
    if (mode != A_IDLE) {
        if (pthread_create(&a, NULL, thread_a, &r)) die("pthread_create");
        while (!atomic_load(&r.a_ready))
            sched_yield();
    }
    if (pthread_create(&b, NULL, thread_b, &r)) die("pthread_create");
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    while (!atomic_load(&r.stop) && now_ns() < end)
        usleep(1000);
    atomic_store(&r.stop, true);
    pthread_join(b, NULL);
    if (mode != A_IDLE) pthread_join(a, NULL);
    munmap(r.region, REGION);
    if (r.uffd >= 0) close(r.uffd);
    if (r.pagemap >= 0) close(r.pagemap);

    size_t over = 0;
    uint64_t blk_sum = 0;
    for (size_t i = 0; i < r.n; i++) {
        over += blk[i] > 50000;
        blk_sum += blk[i];
    }
    qsort(lat, r.n, sizeof *lat, cmp_u64);
    qsort(blk, r.n, sizeof *blk, cmp_u64);
    char chunk_s[24];
    if (mode == A_IDLE)
        snprintf(chunk_s, sizeof chunk_s, "-");
    else
        snprintf(chunk_s, sizeof chunk_s, "%zu MiB", chunk / MiB);
    printf("%-15s %8s | %7.1f %8.1f %8.1f | %7.1f %8.1f %8.1f %6zu %7.1f | %6zu | %6lu %7.1f %8.1f "
           "%6.1f\n",
           a_mode_name[mode], chunk_s, pct(lat, r.n, 0.5), pct(lat, r.n, 0.99),
           (double)lat[r.n - 1] / 1000.0, pct(blk, r.n, 0.99), pct(blk, r.n, 0.999),
           (double)blk[r.n - 1] / 1000.0, over, (double)blk_sum / 1e6 / seconds, r.n,
           (unsigned long)r.purges, r.purges ? (double)r.madv_ns / (double)r.purges / 1000.0 : 0.0,
           (double)r.madv_max_ns / 1000.0,
           r.purges ? (double)r.arm_ns / (double)r.purges / 1000.0 : 0.0);
    fflush(stdout);
}

/* ---- the monitor's own costs ---- */

static double us_since(uint64_t t0) {
    return (double)(now_ns() - t0) / 1000.0;
}

static void costs(void) {
    static struct page_region v[4096];
    int uffd = open_uffd();
    int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pm < 0) die("open /proc/self/pagemap");
    char *g = map_region(GiB);
    populate(g, GiB);
    madvise(g, GiB, MADV_DONTNEED);

    printf("refault monitor costs, 1 GiB region, %s\n",
           thp ? "THP (MADV_HUGEPAGE)" : "4 KiB pages");
    uint64_t t = now_ns();
    uffd_register(uffd, g, GiB);
    printf("  %-58s %10.1f us\n", "UFFDIO_REGISTER 1 GiB (one VMA)", us_since(t));

    populate(g, GiB);
    t = now_ns();
    pm_scan(pm, g, GiB, PM_SCAN_CHECK_WPASYNC, PAGE_IS_WRITTEN, 0, 0, v, 4096);
    printf("  %-58s %10.1f us\n", "scan WRITTEN, 1 GiB present, unprotected (all written)",
           us_since(t));
    t = now_ns();
    uffd_wp(uffd, g, GiB);
    printf("  %-58s %10.1f us\n", "arm (UFFDIO_WRITEPROTECT) 1 GiB present", us_since(t));
    t = now_ns();
    pm_scan(pm, g, GiB, PM_SCAN_CHECK_WPASYNC, PAGE_IS_WRITTEN, 0, 0, v, 4096);
    printf("  %-58s %10.1f us\n", "scan WRITTEN, 1 GiB present, protected, none written",
           us_since(t));
    for (size_t i = 0; i < GiB; i += 64 * ps)
        g[i] = 2;
    t = now_ns();
    long n = pm_scan(pm, g, GiB, PM_SCAN_CHECK_WPASYNC | PM_SCAN_WP_MATCHING, PAGE_IS_WRITTEN, 0, 0,
                     v, 4096);
    printf("  %-58s %10.1f us\n", "scan+rearm WRITTEN, 1 GiB, 1/64 pages written", us_since(t));
    (void)n;

    t = now_ns();
    madvise(g, GiB, MADV_DONTNEED);
    printf("  %-58s %10.1f us\n", "(MADV_DONTNEED 1 GiB, registered)", us_since(t));
    t = now_ns();
    uffd_wp(uffd, g, GiB);
    printf("  %-58s %10.1f us\n", "arm (UFFDIO_WRITEPROTECT) 1 GiB purged", us_since(t));
    t = now_ns();
    pm_scan(pm, g, GiB, PM_SCAN_CHECK_WPASYNC, PAGE_IS_WRITTEN, 0, 0, v, 4096);
    printf("  %-58s %10.1f us\n", "scan WRITTEN, 1 GiB purged + armed, none written", us_since(t));
    madvise(g, GiB, MADV_DONTNEED);
    t = now_ns();
    pm_scan(pm, g, GiB, PM_SCAN_CHECK_WPASYNC | PM_SCAN_WP_MATCHING, 0, 0, 0, NULL, 0);
    printf("  %-58s %10.1f us\n", "arm (PAGEMAP_SCAN WP_MATCHING) 1 GiB purged", us_since(t));

    /* arm per purge chunk, both ways */
    for (size_t chunk = 2 * MiB; chunk <= 16 * MiB; chunk *= 8) {
        uint64_t wp_ns = 0, scan_ns = 0;
        size_t k = 0;
        for (size_t off = 0; off < GiB; off += chunk, k++) {
            char *c = g + off;
            touch(c, chunk);
            madvise(c, chunk, MADV_DONTNEED);
            t = now_ns();
            uffd_wp(uffd, c, chunk);
            wp_ns += now_ns() - t;
            madvise(c, chunk, MADV_DONTNEED);
            t = now_ns();
            pm_scan(pm, c, chunk, PM_SCAN_CHECK_WPASYNC | PM_SCAN_WP_MATCHING, 0, 0, 0, NULL, 0);
            scan_ns += now_ns() - t;
        }
        char what[80];
        snprintf(what, sizeof what, "arm one purged %zu MiB chunk: UFFDIO_WRITEPROTECT",
                 chunk / MiB);
        printf("  %-58s %10.1f us\n", what, (double)wp_ns / (double)k / 1000.0);
        snprintf(what, sizeof what, "arm one purged %zu MiB chunk: PAGEMAP_SCAN WP_MATCHING",
                 chunk / MiB);
        printf("  %-58s %10.1f us\n", what, (double)scan_ns / (double)k / 1000.0);
    }
    munmap(g, GiB);
    close(uffd);

    /* PRESENT_SCAN: an unregistered purged GiB */
    g = map_region(GiB);
    populate(g, GiB);
    madvise(g, GiB, MADV_DONTNEED);
    for (size_t i = 0; i < GiB; i += 64 * ps)
        g[i] = 2;
    t = now_ns();
    pm_scan(pm, g, GiB, 0, PAGE_IS_PRESENT | PAGE_IS_SWAPPED, PAGE_IS_PFNZERO, PAGE_IS_PFNZERO, v,
            4096);
    printf("  %-58s %10.1f us\n", "scan PRESENT (fallback), 1 GiB purged, 1/64 touched",
           us_since(t));
    munmap(g, GiB);
    close(pm);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    double seconds = 3;
    bool do_costs = true;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--thp"))
            thp = true;
        else if (!strcmp(argv[i], "--no-costs"))
            do_costs = false;
        else {
            fprintf(stderr, "usage: %s [--seconds N] [--thp] [--no-costs]\n", argv[0]);
            return 2;
        }
    }
    ps = (size_t)sysconf(_SC_PAGESIZE);
    if (do_costs) costs();

    uint64_t *lat = mmap(NULL, 2 * MAX_SAMPLES * sizeof *lat, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (lat == MAP_FAILED) die("mmap samples");
    uint64_t *blk = lat + MAX_SAMPLES;
    printf(
        "thread B: mmap + touch + munmap of 64 KiB per call (us): wall time, and the part of it\n"
        "B was blocked (wall - on-CPU - run-queue wait), calls blocked > 50 us, blocked ms/s.\n"
        "thread A over a 1 GiB region (%s): purge ops or scans, op time (us). %.1f s per case\n",
        thp ? "THP" : "4 KiB pages", seconds);
    printf("%-15s %8s | %7s %8s %8s | %7s %8s %8s %6s %7s | %6s | %6s %7s %8s %6s\n", "A", "chunk",
           "p50", "p99", "max", "blk p99", "blk p999", "blk max", ">50us", "ms/s", "calls", "A ops",
           "op avg", "op max", "arm");
    run_case(A_IDLE, 0, seconds, lat, blk);
    static const size_t chunks[] = {16 * MiB, 2 * MiB};
    for (size_t c = 0; c < 2; c++)
        for (enum a_mode m = A_PLAIN; m <= A_REGISTERED_ARM; m++)
            run_case(m, chunks[c], seconds, lat, blk);
    run_case(A_SCAN, REGION, seconds, lat, blk);
    run_case(A_SCAN, 64 * MiB, seconds, lat, blk);
    run_case(A_FAULTS, 16 * MiB, seconds, lat, blk);
    return 0;
}
