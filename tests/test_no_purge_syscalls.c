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
    for (size_t i = 0; i < n; i += 4096) c[i] = (unsigned char)(seed + i / 4096);
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
        for (int i = 0; i < 2000; i++) lull_free(ptrs[i]);
    }
    syscall_watch_thread_done();
    return NULL;
}

Test(no_purge_syscalls, request_threads_never_purge_and_memory_returns) {
    /* the reclaim thread exists (library constructor) and purges at once */
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "the reclaim thread must be running");
    cr_assert_eq(syscall_watch_start(), 0, "seccomp user notification unavailable");
    size_t before = rss_bytes();

    pthread_t t[2];
    worker_arg args[2] = {{.seed = 11}, {.seed = 97}};
    for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&t[i], NULL, request_thread, &args[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
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
    struct lull_counters c;
    lull_stats(&c);
    cr_assert_leq(c.total.dirty + c.total.purging, (uint64_t)8 << 20,
                  "%llu KiB still dirty after the reclaim ticks",
                  (unsigned long long)(c.total.dirty + c.total.purging) >> 10);
    cr_assert_geq(c.purged_pages * 4096, (uint64_t)256 << 20, "only %llu KiB purged",
                  (unsigned long long)c.purged_pages * 4);
#ifndef LULL_SANITIZED /* a sanitizer's own memory would dominate RSS */
    size_t after = rss_bytes();
    size_t bound = before + before / 20 + ((size_t)8 << 20);
    cr_assert_leq(after, bound, "RSS %zu MiB after the workload, bound %zu MiB (before %zu MiB)",
                  after >> 20, bound >> 20, before >> 20);
#else
    (void)before;
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
