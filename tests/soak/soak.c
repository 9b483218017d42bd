/* Soak test: lull under a long mixed load, with every block checked.
 *
 *   make soak && ./tests/soak/soak --minutes N [--threads T] [--max-live-mb M]
 *       [--grace-s S] [--seed X] [--strict-rss 0|1] [--phases 0|1] [--print-s S]
 *
 * T threads (4) allocate and free through the lull_* API: mostly small
 * blocks, some medium (1-64 KiB) and large (to 4 MiB) ones, now and then a
 * huge one (17-40 MiB), with calloc, realloc and aligned_alloc among them.
 * Every block carries a pattern (every 4 KiB page of it is written) that is
 * checked before it is freed or reallocated; one free in eight goes to the
 * next thread, which checks and frees the block (a remote free). The live
 * target moves through phases of 20 s (M MiB, a tenth of it, a third, M, 2 %)
 * so that lull has to give memory back and take it again (--phases 0 holds
 * it at M).
 *
 * Five times a second the main thread compares RSS with the live bytes (the
 * bytes the threads asked for and hold): RSS above live * 1.5 + 64 MiB for
 * longer than the grace time (15 s) is a failure, as is any pattern mismatch,
 * a failed allocation, a broken accounting identity in lull_stats(), or RSS
 * not falling under 64 MiB within 20 s of the end. Pages given back with
 * MADV_FREE stay in RSS (as LazyFree) until the kernel needs memory; they are
 * left out of the comparison unless --strict-rss 1. Every 10 s a line of
 * figures (--print-s), at the end a summary. Exit status 0 when all held. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/mem_check.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
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
#define MAX_THREADS 16
#define SLOTS 4096 /* live blocks per thread at most */
#define RING 1024

typedef struct {
    void *p;
    size_t size;
    uint64_t seed;
} item;

/* Per-thread figures, written by their thread (relaxed), summed by main. */
typedef struct {
    _Atomic uint64_t ops, allocs, frees, remote_frees, reallocs, huge, bytes_in, bytes_out;
    char pad[64];
} counters;

/* Ring from thread i to thread i + 1. */
typedef struct {
    item slot[RING];
    _Atomic size_t head, tail;
    size_t cached_head;
} ring;

static struct {
    int threads;
    double minutes;
    size_t max_live;
    double grace_s;
    uint64_t seed;
    bool strict_rss; /* bound the whole RSS, LazyFree pages included */
    double print_s;  /* seconds between progress lines */
    bool phases;     /* move the live target (else hold it at max_live) */
} opt = {4, 1.0, 512 * MiB, 15.0, 1, false, 10.0, true};

static counters C[MAX_THREADS];
static ring rings[MAX_THREADS];
static _Atomic size_t target_live; /* all threads together */
static atomic_bool stop;
static atomic_int failures;

__attribute__((format(printf, 1, 2))) static void failure(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "soak: FAILURE: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    atomic_fetch_add(&failures, 1);
    atomic_store(&stop, true);
}

/* A failure that does not stop the run (the RSS bound). */
__attribute__((format(printf, 1, 2))) static void failure_go_on(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "soak: FAILURE: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    atomic_fetch_add(&failures, 1);
}

/* The pattern (tests/support/mem_check.h) of a block, checked before it is
 * freed or reallocated. */
static bool check(const item *it, const char *when) {
    size_t bad = pat_first_bad(it->p, it->size, it->seed);
    if (bad == SIZE_MAX) return true;
    const uint8_t *b = it->p;
    failure("%s: block %p of %zu bytes: byte %zu is %#x, expected %#x", when, it->p, it->size, bad,
            b[bad], pat_byte(b, it->seed, bad));
    return false;
}

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 10000;
    if (k < 7500) return 1 + (r >> 16) % 1024;
    if (k < 9890) return 1024 + (r >> 16) % (64 * KiB);
    if (k < 9990) return 64 * KiB + (r >> 16) % (4 * MiB); /* 1 %: large */
    return 17 * MiB + (r >> 16) % (23 * MiB);              /* 0.1 %: huge */
}

static bool ring_push(ring *q, item it) {
    size_t t = atomic_load_explicit(&q->tail, memory_order_relaxed);
    if (t - q->cached_head == RING) {
        q->cached_head = atomic_load_explicit(&q->head, memory_order_acquire);
        if (t - q->cached_head == RING) return false;
    }
    q->slot[t % RING] = it;
    atomic_store_explicit(&q->tail, t + 1, memory_order_release);
    return true;
}

static bool ring_pop(ring *q, item *out) {
    size_t h = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (h == atomic_load_explicit(&q->tail, memory_order_acquire)) return false;
    *out = q->slot[h % RING];
    atomic_store_explicit(&q->head, h + 1, memory_order_release);
    return true;
}

#define ADD(c, field, v) atomic_fetch_add_explicit(&(c)->field, (v), memory_order_relaxed)

static void free_item(counters *c, const item *it, bool remote) {
    if (!check(it, remote ? "remote free" : "free")) return;
    lull_free(it->p);
    ADD(c, frees, 1);
    ADD(c, bytes_out, it->size);
    if (remote) ADD(c, remote_frees, 1);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    counters *c = &C[id];
    ring *out = &rings[id], *in = &rings[(id + opt.threads - 1) % opt.threads];
    uint64_t rng = opt.seed * 0x9E3779B97F4A7C15ULL + (uint64_t)id + 1;
    item *live = calloc(SLOTS, sizeof *live); /* the system's (or lull's) malloc */
    if (!live) {
        failure("calloc");
        return NULL;
    }
    int n = 0;
    size_t mine = 0; /* bytes of my live blocks */
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int burst = 0; burst < 256; burst++) {
            uint64_t r = rng_next(&rng);
            size_t target =
                atomic_load_explicit(&target_live, memory_order_relaxed) / (size_t)opt.threads;
            bool grow = n == 0 || (mine < target && n < SLOTS && r % 100 < 60) ||
                        (mine >= target && n < SLOTS && r % 100 < 30);
            if (grow) {
                size_t size = pick_size(rng_next(&rng));
                if (size >= 17 * MiB && mine + size > target + target / 2) size = 4 * KiB;
                uint64_t kind = (r >> 8) % 100;
                void *p;
                if (kind < 5)
                    p = lull_calloc(1, size);
                else if (kind < 8)
                    p = lull_aligned_alloc((size_t)64 << ((r >> 20) % 8), size);
                else
                    p = lull_malloc(size);
                if (!p) {
                    failure("allocation of %zu bytes failed: %s", size, strerror(errno));
                    break;
                }
                if (kind < 5) {
                    const uint8_t *z = p;
                    for (size_t off = 0; off < size; off += 4096)
                        if (z[off]) {
                            failure("calloc(%zu) = %p: byte %zu not zero", size, p, off);
                            break;
                        }
                }
                item it = {p, size, rng_next(&rng)};
                pat_fill(p, size, it.seed);
                live[n++] = it;
                mine += size;
                ADD(c, allocs, 1);
                ADD(c, bytes_in, size);
                if (size >= 17 * MiB) ADD(c, huge, 1);
            } else {
                int i = (int)(rng_next(&rng) % (uint64_t)n);
                item it = live[i];
                uint64_t what = (r >> 8) % 100;
                if (what < 8) { /* realloc */
                    if (!check(&it, "realloc")) break;
                    size_t ns = pick_size(rng_next(&rng));
                    if (ns >= 17 * MiB) ns = 1000;
                    void *q = lull_realloc(it.p, ns);
                    if (!q) {
                        failure("realloc(%p, %zu) failed", it.p, ns);
                        break;
                    }
                    live[i] = (item){q, ns, rng_next(&rng)};
                    pat_fill(q, ns, live[i].seed);
                    mine = mine - it.size + ns;
                    ADD(c, reallocs, 1);
                    ADD(c, bytes_in, ns);
                    ADD(c, bytes_out, it.size);
                } else {
                    live[i] = live[--n];
                    mine -= it.size;
                    if (what < 20 && opt.threads > 1 && ring_push(out, it)) {
                        /* the next thread frees it (and counts it) */
                    } else {
                        free_item(c, &it, false);
                    }
                }
            }
            ADD(c, ops, 1);
            item got;
            if (ring_pop(in, &got)) {
                free_item(c, &got, true);
                ADD(c, ops, 1);
            }
        }
    }
    for (int i = 0; i < n; i++)
        free_item(c, &live[i], false);
    free(live);
    return NULL;
}

/* LazyFree bytes (pages given back with MADV_FREE that the kernel has not
 * taken yet: counted in RSS, reclaimed without I/O the moment memory is
 * short), from /proc/self/smaps_rollup. */
static size_t lazyfree_bytes(void) {
    char buf[4096];
    if (!read_proc("/proc/self/smaps_rollup", buf, sizeof buf)) return 0;
    const char *l = strstr(buf, "LazyFree:");
    unsigned long kb = 0;
    if (l && sscanf(l, "LazyFree: %lu kB", &kb) != 1) kb = 0;
    return (size_t)kb * 1024;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    uint64_t ops, allocs, frees, remote_frees, reallocs, huge, bytes_in, bytes_out;
} totals;

static totals sum(void) {
    totals t = {0};
    for (int i = 0; i < opt.threads; i++) {
        t.ops += atomic_load(&C[i].ops);
        t.allocs += atomic_load(&C[i].allocs);
        t.frees += atomic_load(&C[i].frees);
        t.remote_frees += atomic_load(&C[i].remote_frees);
        t.reallocs += atomic_load(&C[i].reallocs);
        t.huge += atomic_load(&C[i].huge);
        t.bytes_in += atomic_load(&C[i].bytes_in);
        t.bytes_out += atomic_load(&C[i].bytes_out);
    }
    return t;
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--minutes N] [--threads T] [--max-live-mb M] [--grace-s S] [--seed X] "
            "[--strict-rss 0|1] [--print-s S] [--phases 0|1]\n",
            argv0);
    exit(2);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) usage(argv[0]);
        if (!strcmp(a, "--minutes"))
            opt.minutes = atof(v);
        else if (!strcmp(a, "--threads"))
            opt.threads = atoi(v);
        else if (!strcmp(a, "--max-live-mb"))
            opt.max_live = (size_t)atol(v) * MiB;
        else if (!strcmp(a, "--grace-s"))
            opt.grace_s = atof(v);
        else if (!strcmp(a, "--seed"))
            opt.seed = strtoull(v, NULL, 0);
        else if (!strcmp(a, "--strict-rss"))
            opt.strict_rss = atoi(v) != 0;
        else if (!strcmp(a, "--print-s"))
            opt.print_s = atof(v);
        else if (!strcmp(a, "--phases"))
            opt.phases = atoi(v) != 0;
        else
            usage(argv[0]);
        i++;
    }
    if (opt.threads < 1 || opt.threads > MAX_THREADS || opt.minutes <= 0) usage(argv[0]);
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("soak: %d threads, %.2f minutes, up to %zu MiB live, grace %.0f s, seed %llu, lull %s\n",
           opt.threads, opt.minutes, opt.max_live >> 20, opt.grace_s, (unsigned long long)opt.seed,
           lull_version());

    atomic_store(&target_live, opt.max_live);
    pthread_t t[MAX_THREADS];
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }

    const double start = now_s(), end = start + opt.minutes * 60.0;
    const double bound_ratio = 1.5;
    const size_t bound_slack = 64 * MiB;
    double over_since = -1, over_longest = 0, worst_ratio = 0, last_print = start;
    size_t peak_rss = 0, peak_lazy = 0, peak_live = 0, rss_at_worst = 0, live_at_worst = 0;
    uint64_t samples = 0, samples_over = 0, bound_failures = 0;
    bool over_reported = false;
    /* phases of 20 s: grow to max, shrink to a tenth, hold at a third */
    static const double phase_frac[] = {1.0, 0.1, 0.33, 1.0, 0.02};
    int phase = -1;
    while (!atomic_load(&stop)) {
        double now = now_s();
        if (now >= end) break;
        int ph = opt.phases ? (int)((now - start) / 20.0) % 5 : 0;
        if (ph != phase) {
            phase = ph;
            atomic_store(&target_live, (size_t)((double)opt.max_live * phase_frac[ph]));
        }
        struct timespec d = {0, 200 * 1000000L};
        nanosleep(&d, NULL);
        totals s = sum();
        size_t live = (size_t)(s.bytes_in - s.bytes_out);
        size_t rss_all = rss_bytes(), lazy = lazyfree_bytes();
        /* MADV_FREE'd pages stay in RSS until the kernel needs memory: by
         * default the bound is on the rest (--strict-rss 1: on all of it) */
        size_t rss = opt.strict_rss || lazy > rss_all ? rss_all : rss_all - lazy;
        samples++;
        if (rss_all > peak_rss) peak_rss = rss_all;
        if (lazy > peak_lazy) peak_lazy = lazy;
        if (live > peak_live) peak_live = live;
        double ratio = (double)rss / (double)(live + bound_slack);
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            rss_at_worst = rss;
            live_at_worst = live;
        }
        bool over = (double)rss > (double)live * bound_ratio + (double)bound_slack;
        now = now_s();
        if (over) {
            samples_over++;
            if (over_since < 0) over_since = now;
            if (now - over_since > over_longest) over_longest = now - over_since;
            /* reported once per episode; the run goes on, so that the
             * summary covers all of it */
            if (now - over_since > opt.grace_s && !over_reported) {
                over_reported = true;
                bound_failures++;
                failure_go_on("RSS%s %zu MiB above live %zu MiB * %.1f + %zu MiB for %.1f s "
                              "(at %.0f s)",
                              opt.strict_rss ? "" : " - LazyFree", rss >> 20, live >> 20,
                              bound_ratio, bound_slack >> 20, now - over_since, now - start);
            }
        } else {
            over_since = -1;
            over_reported = false;
        }
        struct lull_counters lc;
        if (lull_stats(&lc) == 0 && lull_counters_accounting_sum(&lc.total) != lc.total.mapped)
            failure("accounting identity broken: terms %llu, mapped %llu",
                    (unsigned long long)lull_counters_accounting_sum(&lc.total),
                    (unsigned long long)lc.total.mapped);
        if (now - last_print >= opt.print_s) {
            last_print = now;
            uint64_t purged = 0;
            for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
                purged += lc.purge_bytes[k];
            uint64_t huge_cache = 0;
            for (uint64_t k = 0; k < lc.node_count && k < LULL_COUNTERS_MAX_NODES; k++)
                huge_cache += lc.nodes[k].huge_cache_bytes;
            const struct lull_counters_accounting *a = &lc.total;
            printf("soak: %4.0f s %6.2f M ops | live %4zu MiB, RSS %4zu (LazyFree %3zu) | lull: "
                   "live %4llu span_free %3llu dirty %3llu warm %3llu purged %4llu MiB, of "
                   "which huge cache %3llu | purged %6llu MiB so far, delay %lld ms, %s\n",
                   now - start, (double)s.ops / 1e6, live >> 20, rss_all >> 20, lazy >> 20,
                   (unsigned long long)a->live >> 20, (unsigned long long)a->span_free >> 20,
                   (unsigned long long)a->dirty >> 20, (unsigned long long)a->warm >> 20,
                   (unsigned long long)a->purged >> 20, (unsigned long long)huge_cache >> 20,
                   (unsigned long long)purged >> 20,
                   lc.purge_delay_ms == LULL_COUNTERS_DELAY_NEVER ? -1LL
                                                                  : (long long)lc.purge_delay_ms,
                   lull_counters_purge_mode_name(lc.purge_mode));
        }
    }
    atomic_store(&stop, true);
    for (int i = 0; i < opt.threads; i++)
        pthread_join(t[i], NULL);
    /* what the rings still hold */
    for (int i = 0; i < opt.threads; i++) {
        item it;
        while (ring_pop(&rings[i], &it))
            free_item(&C[(i + 1) % opt.threads], &it, true);
    }
    double secs = now_s() - start;
    totals s = sum();
    size_t rss_end = rss_bytes();
    /* idle: the purge delay passes and the memory goes back */
    double idle_start = now_s(), settled = -1;
    while (now_s() - idle_start < 20.0) {
        lull_reclaim_now();
        if (rss_bytes() <= bound_slack) {
            settled = now_s() - idle_start;
            break;
        }
        struct timespec d = {0, 100 * 1000000L};
        nanosleep(&d, NULL);
    }
    struct lull_counters lc;
    lull_stats(&lc);
    uint64_t purged = 0;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        purged += lc.purge_bytes[k];
    printf("soak: summary after %.1f s\n", secs);
    printf("  operations      %llu (%.2f M/s): %llu allocations, %llu frees (%llu remote), "
           "%llu reallocs, %llu huge blocks\n",
           (unsigned long long)s.ops, (double)s.ops / secs / 1e6, (unsigned long long)s.allocs,
           (unsigned long long)s.frees, (unsigned long long)s.remote_frees,
           (unsigned long long)s.reallocs, (unsigned long long)s.huge);
    printf("  bytes           %llu MiB allocated, %llu MiB freed, live at the end %lld bytes\n",
           (unsigned long long)s.bytes_in >> 20, (unsigned long long)s.bytes_out >> 20,
           (long long)(s.bytes_in - s.bytes_out));
    const char *measured = opt.strict_rss ? "RSS" : "RSS - LazyFree";
    printf("  memory          peak live %zu MiB, peak RSS %zu MiB, peak LazyFree %zu MiB; worst "
           "(%s)/(live+64 MiB) %.2f (%zu MiB, live %zu MiB)\n",
           peak_live >> 20, peak_rss >> 20, peak_lazy >> 20, measured, worst_ratio,
           rss_at_worst >> 20, live_at_worst >> 20);
    printf("  bound           %s <= live * %.1f + %zu MiB: %llu of %llu samples over, longest "
           "%.1f s (grace %.0f s): %llu failure(s)\n",
           measured, bound_ratio, bound_slack >> 20, (unsigned long long)samples_over,
           (unsigned long long)samples, over_longest, opt.grace_s,
           (unsigned long long)bound_failures);
    printf("  lull            backend %s, purged %llu MiB, %llu huge unmapped, reclaim CPU "
           "%.2f s, purge mode %s, delay %lld ms\n",
           lull_counters_backend_name(lc.backend), (unsigned long long)purged >> 20,
           (unsigned long long)lc.huge_unmapped, (double)lc.reclaim_cpu_ns / 1e9,
           lull_counters_purge_mode_name(lc.purge_mode),
           lc.purge_delay_ms == LULL_COUNTERS_DELAY_NEVER ? -1LL : (long long)lc.purge_delay_ms);
    const struct lull_counters_accounting *a = &lc.total;
    printf("  accounting      mapped %llu MiB = live %llu + rounding %llu + span_free %llu + "
           "dirty %llu + purging %llu + purged %llu + warm %llu + metadata %llu MiB\n",
           (unsigned long long)a->mapped >> 20, (unsigned long long)a->live >> 20,
           (unsigned long long)a->rounding >> 20, (unsigned long long)a->span_free >> 20,
           (unsigned long long)a->dirty >> 20, (unsigned long long)a->purging >> 20,
           (unsigned long long)a->purged >> 20, (unsigned long long)a->warm >> 20,
           (unsigned long long)a->metadata >> 20);
    if (settled >= 0)
        printf("  idle            RSS %zu MiB when the threads stopped, under %zu MiB %.1f s "
               "later\n",
               rss_end >> 20, bound_slack >> 20, settled);
    else
        failure("RSS still %zu MiB 20 s after every block was freed", rss_bytes() >> 20);
    if (s.bytes_in != s.bytes_out) failure("bytes allocated and freed differ");
    int f = atomic_load(&failures);
    printf("soak: %s\n", f ? "FAILED" : "passed");
    return f ? 1 : 0;
}
