/* Shared helpers of the ThreadSanitizer programs (tests/tsan/tsan_*.c): plain
 * multi-threaded stress programs that the TSan build runs besides the
 * Criterion suite. Each program exits 0 when every check passed, 1
 * when a check failed; a TSan report makes the process exit with
 * TSAN_OPTIONS' exitcode (66 as ctest runs them). RSS and the content
 * pattern (mix64, rng_next, rss_bytes, pat_fill, pat_check) come from
 * tests/support/mem_check.h. */
#ifndef LULL_TSAN_COMMON_H
#define LULL_TSAN_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "lull.h"
#include "tests/support/mem_check.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static atomic_int tsan_failures;

/* A failed check: report it and remember; the program exits 1 at the end. */
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) tsan_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)

__attribute__((format(printf, 4, 5), unused)) static void
tsan_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d: check failed: %s: %s\n", file, line, cond, msg);
    /* the first few failures are enough to debug; do not flood */
    if (atomic_fetch_add(&tsan_failures, 1) > 20) _exit(1);
}

__attribute__((unused)) static int tsan_finish(const char *name) {
    int f = atomic_load(&tsan_failures);
    if (f)
        fprintf(stderr, "%s: %d check(s) failed\n", name, f);
    else
        printf("%s: ok\n", name);
    return f ? 1 : 0;
}

/* A block handed between threads. */
typedef struct {
    void *p;
    size_t size;
    uint64_t seed;
} tsan_item;

/* Single-producer single-consumer ring. The producer re-reads the
 * consumer's position only when the ring looks full, and the consumer frees
 * a block only after publishing that it took it: the ring itself orders
 * little, so a missing happens-before inside lull (a remote free against
 * the owner's reuse of the block) is still visible to TSan. */
#define SPSC_SLOTS 1024
typedef struct {
    tsan_item slot[SPSC_SLOTS];
    _Atomic size_t head, tail; /* consumer reads at head, producer writes at tail */
    size_t cached_head;        /* producer's */
    _Atomic bool closed;
} spsc;

__attribute__((unused)) static bool spsc_push(spsc *q, tsan_item it) {
    size_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (t - q->cached_head == SPSC_SLOTS) {
        q->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
        if (t - q->cached_head == SPSC_SLOTS) return false;
    }
    q->slot[t % SPSC_SLOTS] = it;
    atomic_store_explicit(&q->tail, t + 1, memory_order_release);
    return true;
}

__attribute__((unused)) static bool spsc_pop(spsc *q, tsan_item *out) {
    size_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (h == atomic_load_explicit(&q->tail, memory_order_acquire)) return false;
    *out = q->slot[h % SPSC_SLOTS];
    atomic_store_explicit(&q->head, h + 1, memory_order_release);
    return true;
}

static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Resident bytes of the program's own memory: /proc/self/smaps less TSan's
 * shadow and meta memory, which on x86-64 lie between the low application
 * range (below 0x0080_0000_0000) and the PIE one (from 0x5500_0000_0000).
 * The shadow of memory that lull purges with madvise (through io_uring by
 * default, which TSan does not see) stays resident: for huge mappings kept
 * in the reclaim thread's cache that is twice their touched size, and not
 * lull's. */
__attribute__((unused)) static size_t app_rss_bytes(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[512];
    unsigned long start = 0, kb, total_kb = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            start = a;
        else if (sscanf(line, "Rss: %lu kB", &kb) == 1 &&
                 (start < 0x008000000000ul || start >= 0x550000000000ul))
            total_kb += kb;
    }
    fclose(f);
    return (size_t)total_kb << 10;
}

__attribute__((unused)) static void start_thread(pthread_t *t, void *(*fn)(void *), void *arg) {
    int err = pthread_create(t, NULL, fn, arg);
    if (err) {
        fprintf(stderr, "pthread_create: %s\n", strerror(err));
        exit(1);
    }
}

#endif
