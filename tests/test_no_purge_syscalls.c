/* Invariant 2 of design.md, proved: request threads never execute madvise,
 * munmap, mremap, process_madvise or io_uring_*, even under a workload of
 * small, large and huge blocks, bulk frees of hundreds of MiB and realloc;
 * and the memory still goes back (RSS falls to near the live bytes once the
 * reclaim thread has run). The watch is a per-thread seccomp filter
 * (tests/support/syscall_watch.c) installed after the reclaim thread
 * exists, so only the request threads are watched. */
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/syscall_watch.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static size_t rss_bytes(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i += 4096)
        c[i] = (unsigned char)(seed + i / 4096);
    if (n) c[n - 1] = (unsigned char)seed;
}

static int check(const void *p, size_t n, unsigned seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i += 4096)
        if (c[i] != (unsigned char)(seed + i / 4096)) return 0;
    return n == 0 || c[n - 1] == (unsigned char)seed;
}

typedef struct {
    unsigned seed;
    int ok;
    int installed;
} worker_arg;

#define BULK (4096) /* 4096 x 64 KiB = 256 MiB per thread */

static void *request_thread(void *argp) {
    worker_arg *a = argp;
    a->installed = syscall_watch_install_on_this_thread() == 0;
    a->ok = 1;
    for (int round = 0; round < 2; round++) {
        /* bulk: 256 MiB in 64 KiB blocks, touched, then freed */
        void **bulk = lull_malloc(BULK * sizeof *bulk);
        for (int i = 0; i < BULK; i++) {
            bulk[i] = lull_malloc(65536);
            fill(bulk[i], 65536, a->seed + (unsigned)i);
        }
        for (int i = 0; i < BULK; i++) {
            if (!check(bulk[i], 65536, a->seed + (unsigned)i)) a->ok = 0;
            lull_free(bulk[i]);
        }
        lull_free(bulk);
        /* huge: 96 MiB touched and freed, and a realloc that moves one */
        char *huge = lull_malloc((size_t)96 << 20);
        fill(huge, (size_t)96 << 20, a->seed);
        if (!check(huge, (size_t)96 << 20, a->seed)) a->ok = 0;
        lull_free(huge);
        char *r = lull_malloc(100);
        fill(r, 100, 7);
        for (size_t n = 1000; n <= ((size_t)40 << 20); n *= 4) {
            r = lull_realloc(r, n);
            if (!check(r, 1, 7)) a->ok = 0;
            fill(r, n, 7);
        }
        lull_free(r);
        /* large and small mixed */
        void *ptrs[2000];
        for (int i = 0; i < 2000; i++) {
            size_t n = (i % 10 == 0) ? (size_t)(600 + i) << 10 : (size_t)(i * 37 % 3000 + 1);
            ptrs[i] = lull_malloc(n);
            fill(ptrs[i], n, (unsigned)i);
        }
        for (int i = 0; i < 2000; i++)
            lull_free(ptrs[i]);
    }
    syscall_watch_thread_done();
    return NULL;
}

Test(no_purge_syscalls, request_threads_never_purge_and_memory_returns) {
    /* the reclaim thread exists (library constructor) and purges at once */
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "the reclaim thread must be running");
    cr_assert_eq(syscall_watch_start(), 0, "seccomp user notification unavailable");
    struct lull_counters c;
    lull_stats(&c);
    uint64_t lull_resident_before = lull_counters_resident_bound(&c.total);
    size_t before = rss_bytes();

    pthread_t t[2];
    worker_arg args[2] = {{.seed = 11}, {.seed = 97}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, request_thread, &args[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_assert(args[i].installed, "the watch was not installed on request thread %d", i);
        cr_assert(args[i].ok, "a block's content changed under request thread %d", i);
    }

    size_t n = syscall_watch_count();
    if (n) {
        struct syscall_watch_event ev[16];
        size_t got = syscall_watch_get(ev, 16);
        for (size_t i = 0; i < got; i++)
            cr_log_error("request thread %d called %s(0x%llx, %llu)", (int)ev[i].tid,
                         syscall_watch_name(ev[i].nr), (unsigned long long)ev[i].args[0],
                         (unsigned long long)ev[i].args[1]);
    }
    cr_assert_eq(n, 0, "%zu purge/unmap/io_uring calls on request threads", n);

    /* and the memory went back: a tick or two of the reclaim thread */
    lull_reclaim_now();
    lull_reclaim_now();
    /* lull's own view: nothing left dirty, the freed memory is purged */
    lull_stats(&c);
    cr_assert_leq(c.total.dirty + c.total.purging, (uint64_t)8 << 20,
                  "%llu KiB still dirty after the reclaim ticks",
                  (unsigned long long)(c.total.dirty + c.total.purging) >> 10);
    cr_assert_geq(c.purged_pages * 4096, (uint64_t)256 << 20, "only %llu KiB purged",
                  (unsigned long long)c.purged_pages * 4);
#ifndef LULL_SANITIZED /* a sanitizer's own memory would dominate RSS */
    /* The kernel agrees: RSS grew by no more than what lull still counts
     * as possibly resident (its warm reserve, free blocks in spans and
     * metadata grow with the workload) plus 4 MiB of thread stacks and
     * test machinery. The 300+ MiB the threads touched are not in RSS. */
    size_t after = rss_bytes();
    uint64_t lull_resident_after = lull_counters_resident_bound(&c.total);
    uint64_t lull_growth =
        lull_resident_after > lull_resident_before ? lull_resident_after - lull_resident_before : 0;
    size_t bound = before + (size_t)lull_growth + ((size_t)4 << 20);
    cr_assert_leq(
        after, bound,
        "RSS %zu KiB after the workload, bound %zu KiB (before %zu KiB; lull's "
        "resident bound %llu KiB before, %llu KiB after: warm %llu, span_free %llu, "
        "metadata %llu, dirty %llu)",
        after >> 10, bound >> 10, before >> 10, (unsigned long long)lull_resident_before >> 10,
        (unsigned long long)lull_resident_after >> 10, (unsigned long long)c.total.warm >> 10,
        (unsigned long long)c.total.span_free >> 10, (unsigned long long)c.total.metadata >> 10,
        (unsigned long long)c.total.dirty >> 10);
#else
    (void)before;
    (void)lull_resident_before;
#endif
}

/* On a thread of its own: a watch on the process's main thread would be
 * inherited by LeakSanitizer's exit-time tracer, which then waits for the
 * supervisor it has stopped. */
static void *purging_thread(void *arg) {
    size_t *seen = arg;
    if (syscall_watch_install_on_this_thread() != 0) return NULL;
    char *p = lull_malloc((size_t)1 << 20);
    memset(p, 1, (size_t)1 << 20);
    uintptr_t page = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    if (madvise((void *)page, 4096, MADV_DONTNEED) == 0) *seen = syscall_watch_count();
    lull_free(p);
    syscall_watch_thread_done();
    return NULL;
}

Test(no_purge_syscalls, the_watch_sees_a_purge_when_one_is_made) {
    /* the counter-test: a watched thread that does purge is caught, so the
     * zero above means something */
    cr_assert_eq(syscall_watch_start(), 0);
    syscall_watch_reset();
    size_t seen = 0;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, purging_thread, &seen), 0);
    pthread_join(t, NULL);
    cr_assert_geq(seen, 1, "the watch missed a madvise made by a watched thread");
}

/* ---- huge blocks in steady state: no system call at all ------------------ */

/* A request thread that churns huge blocks takes the mapping it freed back
 * from the reclaim thread's cache: after the first iterations (the first
 * mmap, the thread's heap), no mmap, munmap or madvise, and in fact no
 * system call at all, for malloc, calloc, aligned_alloc and a realloc into
 * a huge block. The purge delay is long here, so no purge is running when
 * a malloc comes (a mapping being purged is never handed out: that malloc
 * would map a new one). */

#define CHURN_SIZE ((size_t)40 << 20)
#define CHURN_WARM 3
#define CHURN_STEADY 60

typedef struct {
    bool all_but; /* watch every call (except the vDSO clock fallbacks) */
    int rounds;   /* in steady state */
    int installed;
    int ok;
    size_t warm_events, steady_events;
    uint64_t hits, misses;
} churn_arg;

static void cache_counts(uint64_t *hits, uint64_t *misses) {
    struct lull_counters c;
    lull_stats(&c);
    *hits = *misses = 0;
    for (uint64_t n = 0; n < c.node_count; n++) {
        *hits += c.nodes[n].huge_cache_hits;
        *misses += c.nodes[n].huge_cache_misses;
    }
}

/* One round: every huge entry point once, each block touched page by page
 * and checked. */
static int churn_round(unsigned seed) {
    int ok = 1;
    char *p = lull_malloc(CHURN_SIZE);
    fill(p, CHURN_SIZE, seed);
    ok &= check(p, CHURN_SIZE, seed);
    lull_free(p);
    char *z = lull_calloc(1, CHURN_SIZE);
    for (size_t i = 0; i < CHURN_SIZE; i += 4096)
        ok &= z[i] == 0 && z[i + 4095] == 0;
    fill(z, CHURN_SIZE, seed + 1);
    lull_free(z);
    char *a = lull_aligned_alloc(65536, CHURN_SIZE);
    ok &= ((uintptr_t)a & 65535) == 0;
    fill(a, CHURN_SIZE, seed + 2);
    ok &= check(a, CHURN_SIZE, seed + 2);
    lull_free(a);
    char *r = lull_malloc(100000);
    fill(r, 100000, seed + 3);
    r = lull_realloc(r, CHURN_SIZE);
    ok &= check(r, 100000, seed + 3);
    fill(r, CHURN_SIZE, seed + 4);
    lull_free(r);
    return ok;
}

static void *churn_thread(void *argp) {
    churn_arg *a = argp;
    static const long extra[] = {SYS_mmap, SYS_mprotect, SYS_brk};
    /* the clock calls fall back to the kernel only where the vDSO cannot
     * read the clock (a property of the machine, not of lull) */
    static const long clocks[] = {SYS_clock_gettime, SYS_gettimeofday, SYS_time, SYS_getcpu};
    a->installed = (a->all_but ? syscall_watch_install_all_but(clocks, 4)
                               : syscall_watch_install_also(extra, 3)) == 0;
    a->ok = 1;
    size_t n0 = syscall_watch_count();
    for (int i = 0; i < CHURN_WARM; i++)
        a->ok &= churn_round((unsigned)i);
    size_t n1 = syscall_watch_count();
    uint64_t h0, m0;
    cache_counts(&h0, &m0);
    size_t n2 = syscall_watch_count(); /* (lull_stats makes no call either) */
    for (int i = 0; i < a->rounds; i++)
        a->ok &= churn_round((unsigned)i * 7);
    size_t n3 = syscall_watch_count();
    uint64_t h1, m1;
    cache_counts(&h1, &m1);
    syscall_watch_thread_done();
    a->warm_events = n1 - n0;
    a->steady_events = n3 - n2;
    a->hits = h1 - h0;
    a->misses = m1 - m0;
    return NULL;
}

static void run_churn(bool all_but) {
    lull_set_purge_delay_ms(60000);
    cr_assert(lull_configure("huge_cache_idle_ms", "60000"));
    cr_assert(lull_reclaim_now(), "the reclaim thread must be running");
    cr_assert_eq(syscall_watch_start(), 0, "seccomp user notification unavailable");
    syscall_watch_reset();
    churn_arg a = {.all_but = all_but, .rounds = CHURN_STEADY};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, churn_thread, &a), 0);
    pthread_join(t, NULL);
    cr_assert(a.installed, "the watch was not installed");
    cr_assert(a.ok, "a huge block's content was wrong");
    cr_log_info("%s: %zu watched calls in the first %d rounds, %zu in the next %d; cache %llu "
                "hits, %llu misses",
                all_but ? "every call" : "mmap/munmap/madvise/...", a.warm_events, CHURN_WARM,
                a.steady_events, CHURN_STEADY, (unsigned long long)a.hits,
                (unsigned long long)a.misses);
    if (a.steady_events) syscall_watch_dump(0);
    cr_assert_eq(a.steady_events, 0, "%zu system calls in steady state", a.steady_events);
    /* every huge allocation of the steady rounds reused the cached mapping */
    cr_assert_eq(a.hits, 4 * CHURN_STEADY);
    cr_assert_eq(a.misses, 0);
    lull_set_purge_delay_ms(-2);
}

Test(no_purge_syscalls, huge_block_churn_makes_no_mmap_munmap_or_madvise, .timeout = 120) {
    run_churn(false);
}

Test(no_purge_syscalls, huge_block_churn_makes_no_system_call_at_all, .timeout = 120) {
    run_churn(true);
}

/* The counter-test: the same churn with a cache bound of 0 maps and unmaps
 * every block, and the watch sees the mmaps. */
Test(no_purge_syscalls, without_the_cache_the_churn_maps_every_block, .timeout = 120) {
    cr_assert(lull_configure("huge_cache_mb", "0"));
    lull_set_purge_delay_ms(60000);
    cr_assert(lull_reclaim_now());
    cr_assert_eq(syscall_watch_start(), 0);
    syscall_watch_reset();
    churn_arg a = {.all_but = false, .rounds = 8}; /* each block faults in anew: slow */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, churn_thread, &a), 0);
    pthread_join(t, NULL);
    cr_assert(a.installed && a.ok);
    cr_assert_geq(a.steady_events, (size_t)a.rounds, "only %zu mmap calls seen", a.steady_events);
    cr_assert_eq(a.hits, 0);
    lull_set_purge_delay_ms(-2);
}
