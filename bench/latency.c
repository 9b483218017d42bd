/*
 * latency.c: per-call latency of small malloc/free on a request thread while
 * another thread keeps allocating, touching and freeing 64 MiB blocks.
 *
 * The request thread (main) does random replacements in a working set of
 * small objects (16-1024 B) for --duration-ms and times every malloc and
 * every free with rdtsc into fixed log-linear histograms (no allocation while
 * measuring). It reports p50, p99, p99.9, p99.99, max and mean of malloc, of
 * free and of both together, in ns. The background thread's own free() of
 * each 64 MiB block is timed too (it is a request thread as well).
 *
 * --cdf-csv PATH   the combined histogram as "ns,cumulative_fraction"
 * --rss-csv PATH   RSS sampled every --sample-ms (10 ms): "t_s,rss_mib"
 */
#include "bench_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define SC "latency"
#define MAX_SAMPLES 100000

static struct {
    uint64_t duration_ms, live, hog_mib, sample_ms;
    const char *cdf_csv, *rss_csv;
} cfg = {.duration_ms = 3000, .live = 1000, .hog_mib = 64, .sample_ms = 10};

static _Atomic int stop;
static hist_t h_malloc, h_free, h_all, h_hog_free;
static uint64_t hog_iterations;

static void *hog(void *arg) {
    (void)arg;
    size_t n = (size_t)cfg.hog_mib << 20;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        char *p = malloc(n);
        if (!p) {
            fprintf(stderr, "hog: malloc failed\n");
            exit(1);
        }
        touch_pages(p, n);
        uint64_t t0 = now_ns();
        free(p);
        hist_add(&h_hog_free, now_ns() - t0);
        hog_iterations++;
    }
    return NULL;
}

static float *rss_samples;
static uint32_t nsamples;

static void *sampler(void *arg) {
    uint64_t t0 = *(uint64_t *)arg;
    while (!atomic_load(&stop) && nsamples < MAX_SAMPLES) {
        rss_samples[2 * nsamples] = (float)((double)(now_ns() - t0) / 1e9);
        rss_samples[2 * nsamples + 1] = (float)rss_mib();
        nsamples++;
        sleep_ms(cfg.sample_ms);
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            cfg.duration_ms = 800;
        } else if (!arg_u64(argc, argv, &i, "--duration-ms", &cfg.duration_ms) &&
                   !arg_u64(argc, argv, &i, "--live", &cfg.live) &&
                   !arg_u64(argc, argv, &i, "--hog-mib", &cfg.hog_mib) &&
                   !arg_u64(argc, argv, &i, "--sample-ms", &cfg.sample_ms) &&
                   !arg_value(argc, argv, &i, "--cdf-csv", &cfg.cdf_csv) &&
                   !arg_value(argc, argv, &i, "--rss-csv", &cfg.rss_csv)) {
            fprintf(stderr, "usage: latency [--quick] [--duration-ms N] [--live N] [--hog-mib N]\n"
                            "               [--sample-ms N] [--cdf-csv PATH] [--rss-csv PATH]\n");
            return 2;
        }
    }
    if (!cfg.live || !cfg.sample_ms || !cfg.hog_mib) return 2;
    bench_check_preload(SC);
    printf("INFO %s config duration_ms=%llu live=%llu hog_mib=%llu\n", SC,
           (unsigned long long)cfg.duration_ms, (unsigned long long)cfg.live,
           (unsigned long long)cfg.hog_mib);
    fflush(stdout);
    double ns_per_tick = tsc_calibrate();

    rss_samples = mmap(NULL, sizeof(float) * 2 * MAX_SAMPLES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void **slots = mmap(NULL, cfg.live * sizeof(void *), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rss_samples == MAP_FAILED || slots == MAP_FAILED) return 1;
    uint64_t rng = 3;
    for (size_t i = 0; i < cfg.live; i++) {
        slots[i] = malloc(16 + rng_next(&rng) % 1009);
        if (!slots[i]) return 1;
    }
    /* Warm up: the request thread reaches its steady state first. */
    for (int i = 0; i < 100000; i++) {
        size_t s = rng_next(&rng) % cfg.live;
        free(slots[s]);
        slots[s] = malloc(16 + rng_next(&rng) % 1009);
    }

    uint64_t t_start = now_ns();
    pthread_t th_hog, th_sampler;
    if (pthread_create(&th_sampler, NULL, sampler, &t_start) ||
        pthread_create(&th_hog, NULL, hog, NULL)) {
        perror("pthread_create");
        return 1;
    }
    long flt0 = thread_minflt();
    uint64_t end = t_start + cfg.duration_ms * 1000000ull, ops = 0;
    for (;;) {
        for (int k = 0; k < 1024; k++) {
            size_t s = rng_next(&rng) % cfg.live;
            size_t sz = 16 + rng_next(&rng) % 1009;
            uint64_t a = tsc_now();
            free(slots[s]);
            uint64_t b = tsc_now();
            char *p = malloc(sz);
            uint64_t e = tsc_now();
            if (!p) return 1;
            p[0] = 1;
            p[sz - 1] = 1;
            slots[s] = p;
            hist_add(&h_free, b - a);
            hist_add(&h_malloc, e - b);
        }
        ops += 1024;
        if (now_ns() >= end) break;
    }
    long flt1 = thread_minflt();
    atomic_store(&stop, 1);
    pthread_join(th_hog, NULL);
    pthread_join(th_sampler, NULL);

    /* timer overhead: an empty fenced window */
    uint64_t ovh = UINT64_MAX;
    for (int i = 0; i < 1000; i++) {
        uint64_t a = tsc_now(), b = tsc_now();
        if (b - a < ovh) ovh = b - a;
    }
    hist_merge(&h_all, &h_malloc);
    hist_merge(&h_all, &h_free);
    hist_report(&h_malloc, SC, "malloc", ns_per_tick, "ns");
    hist_report(&h_free, SC, "free", ns_per_tick, "ns");
    hist_report(&h_all, SC, "op", ns_per_tick, "ns");
    result(SC, "ops", (double)ops, "pairs");
    result(SC, "request_minflt", (double)(flt1 - flt0), "faults");
    result(SC, "hog_iterations", (double)hog_iterations, "blocks");
    result(SC, "hog_free_max_us", (double)h_hog_free.max / 1e3, "us");
    result(SC, "hog_free_p50_us", (double)hist_quantile(&h_hog_free, 0.5) / 1e3, "us");
    double rss_max = 0, rss_sum = 0;
    for (uint32_t i = 0; i < nsamples; i++) {
        double r = rss_samples[2 * i + 1];
        rss_sum += r;
        if (r > rss_max) rss_max = r;
    }
    result(SC, "rss_max_mib", rss_max, "MiB");
    result(SC, "rss_mean_mib", nsamples ? rss_sum / nsamples : 0, "MiB");
    printf("INFO %s timer overhead %.1f ns (included in every figure)\n", SC,
           (double)ovh * ns_per_tick);
    if (cfg.cdf_csv && hist_write_cdf(&h_all, cfg.cdf_csv, ns_per_tick, "ns,cdf") != 0)
        perror(cfg.cdf_csv);
    if (cfg.rss_csv) {
        FILE *f = fopen(cfg.rss_csv, "w");
        if (f) {
            fprintf(f, "t_s,rss_mib\n");
            for (uint32_t i = 0; i < nsamples; i++)
                fprintf(f, "%.3f,%.2f\n", rss_samples[2 * i], rss_samples[2 * i + 1]);
            fclose(f);
        } else {
            perror(cfg.rss_csv);
        }
    }
    for (size_t i = 0; i < cfg.live; i++)
        free(slots[i]);
    return 0;
}
