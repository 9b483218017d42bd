/*
 * buffer_cycle.c: a request that takes a large buffer, every --gap-ms.
 *
 * Each request mallocs a buffer of --mib MiB (32; sizes cycle through +0,
 * +4 and +8 KiB, as a server's buffers differ a little), writes all of it
 * and frees it; then the thread waits --gap-ms (100). Another thread churns
 * blocks of 256-768 KiB the whole time (one replaced every 200 us), which
 * is what drives an adaptive purge delay short. Per request: its time and
 * the page faults it took (RUSAGE_THREAD). Results: the median and p90 of
 * both over the requests after the first --warmup (10), RSS after the last
 * request, and peak RSS.
 *
 * An allocator that purges the freed buffer before the next request makes
 * that request fault every page back in (8,193 faults for 32 MiB): the
 * stall lull exists to avoid. One that keeps every freed buffer keeps its
 * memory. Session 20 found lull's huge-block cache on both sides of this
 * line as its purge policy was changed (docs/status.md).
 *
 *   buffer_cycle [--quick] [--gap-ms N] [--mib N] [--requests N]
 */
#include "bench_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define SC "buffer_cycle"

static struct { uint64_t gap_ms, mib, requests, warmup; } cfg = {100, 32, 40, 10};

static atomic_bool stop;

/* Blocks of 256-768 KiB, one replaced every 200 us: each a span of its own
 * in lull, freed and taken again within milliseconds. */
static void *churn(void *arg) {
    (void)arg;
    void *keep[8] = {0};
    uint64_t rng = 42;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        unsigned i = (unsigned)(rng_next(&rng) % 8);
        free(keep[i]);
        keep[i] = malloc((256 << 10) + (rng_next(&rng) % 8) * (64 << 10));
        if (!keep[i]) abort();
        memset(keep[i], 1, BENCH_PAGE);
        sleep_ns(200000);
    }
    for (unsigned i = 0; i < 8; i++)
        free(keep[i]);
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            cfg.requests = 20;
            cfg.warmup = 5;
        } else if (!arg_u64(argc, argv, &i, "--gap-ms", &cfg.gap_ms) &&
                   !arg_u64(argc, argv, &i, "--mib", &cfg.mib) &&
                   !arg_u64(argc, argv, &i, "--requests", &cfg.requests)) {
            fprintf(stderr, "usage: buffer_cycle [--quick] [--gap-ms N] [--mib N] "
                            "[--requests N]\n");
            return 2;
        }
    }
    if (cfg.requests <= cfg.warmup || !cfg.mib) return 2;
    bench_check_preload(SC);
    pthread_t th;
    if (pthread_create(&th, NULL, churn, NULL) != 0) return 1;
    uint64_t n = cfg.requests - cfg.warmup;
    double *ms = calloc(n, sizeof *ms), *faults = calloc(n, sizeof *faults);
    if (!ms || !faults) return 1;
    for (uint64_t r = 0; r < cfg.requests; r++) {
        size_t size = (size_t)(cfg.mib << 20) + (r % 3) * BENCH_PAGE;
        long f0 = thread_minflt();
        uint64_t t0 = now_ns();
        char *p = malloc(size);
        if (!p) return 1;
        memset(p, (int)r, size);
        __asm__ volatile("" ::"r"(p) : "memory"); /* the writes happen */
        free(p);
        if (r >= cfg.warmup) {
            ms[r - cfg.warmup] = (double)(now_ns() - t0) / 1e6;
            faults[r - cfg.warmup] = (double)(thread_minflt() - f0);
        }
        sleep_ms(cfg.gap_ms);
    }
    double rss = rss_mib();
    atomic_store(&stop, true);
    pthread_join(th, NULL);
    sort_doubles(ms, n);
    sort_doubles(faults, n);
    printf("INFO %s config gap_ms=%llu mib=%llu requests=%llu warmup=%llu\n", SC,
           (unsigned long long)cfg.gap_ms, (unsigned long long)cfg.mib,
           (unsigned long long)cfg.requests, (unsigned long long)cfg.warmup);
    result(SC, "request_ms_median", quantile_sorted(ms, n, 0.5), "ms");
    result(SC, "request_ms_p90", quantile_sorted(ms, n, 0.9), "ms");
    result(SC, "request_faults_median", quantile_sorted(faults, n, 0.5), "faults");
    result(SC, "request_faults_p90", quantile_sorted(faults, n, 0.9), "faults");
    result(SC, "rss_end_mib", rss, "MiB");
    result(SC, "peak_rss_mib", peak_rss_mib(), "MiB");
    free(ms);
    free(faults);
    return 0;
}
