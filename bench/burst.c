/*
 * burst.c: refault churn between bursts of a transient working set.
 *
 * Each burst allocates ~--mib MiB (200) of mixed sizes, touches every page,
 * then frees all of it in random order. Between bursts the thread is idle
 * for a gap; --gaps lists the gaps (ms), and --bursts bursts run with each.
 * After the last one the process idles --idle-ms (5 s), then runs one more
 * burst. Per burst: the minor faults the burst thread took (getrusage
 * RUSAGE_THREAD), the burst's duration, and RSS when the working set is
 * live, right after it is freed and at the end of the gap.
 *
 * An allocator that purges during the gap makes the next burst fault its
 * working set back in (slow, and paid by the request thread); one that keeps
 * everything has a large RSS between bursts. The RSS after the long idle
 * shows whether the memory is given back eventually.
 *
 * --bursts-csv PATH  one row per burst; --rss-csv PATH  RSS every 20 ms.
 */
#include "bench_common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define SC "burst"
#define MAX_GAPS 8
#define MAX_BURSTS 256
#define MAX_SAMPLES 100000

static struct {
    uint64_t mib, bursts, idle_ms, sample_ms;
    uint64_t gaps[MAX_GAPS];
    int ngaps;
    const char *bursts_csv, *rss_csv;
} cfg = {.mib = 200, .bursts = 4, .idle_ms = 5000, .sample_ms = 20, .gaps = {50, 500}, .ngaps = 2};

struct burst_rec {
    long gap_ms; /* -1: the burst after the long idle */
    long faults;
    double ms, rss_live, rss_after_free, rss_gap_end;
};

static struct burst_rec recs[MAX_BURSTS];
static int nrecs;

static size_t *sizes;
static void **ptrs;
static uint32_t *perm;
static size_t nobj;

/* The working set: sizes drawn by count from four classes until the total
 * reaches the target:
 *   60 % 16-512 B, 30 % 512 B-16 KiB, 9 % 16-256 KiB, 1 % 256 KiB-2 MiB. */
static void make_working_set(void) {
    size_t target = (size_t)cfg.mib << 20, total = 0, cap = 1 << 16;
    sizes =
        mmap(NULL, cap * sizeof *sizes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (sizes == MAP_FAILED) exit(1);
    uint64_t rng = 11;
    while (total < target) {
        if (nobj == cap) {
            size_t *n = mremap(sizes, cap * sizeof *sizes, 2 * cap * sizeof *sizes, MREMAP_MAYMOVE);
            if (n == MAP_FAILED) exit(1);
            sizes = n;
            cap *= 2;
        }
        unsigned r = (unsigned)(rng_next(&rng) % 100);
        size_t lo, hi;
        if (r < 60)
            lo = 16, hi = 512;
        else if (r < 90)
            lo = 512, hi = 16 << 10;
        else if (r < 99)
            lo = 16 << 10, hi = 256 << 10;
        else
            lo = 256 << 10, hi = 2 << 20;
        size_t s = lo + rng_next(&rng) % (hi - lo + 1);
        sizes[nobj++] = s;
        total += s;
    }
    ptrs =
        mmap(NULL, nobj * sizeof *ptrs, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    perm =
        mmap(NULL, nobj * sizeof *perm, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptrs == MAP_FAILED || perm == MAP_FAILED) exit(1);
    for (size_t i = 0; i < nobj; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = nobj - 1; i > 0; i--) {
        size_t j = rng_next(&rng) % (i + 1);
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    printf("INFO %s working set %zu objects, %.1f MiB\n", SC, nobj, (double)total / BENCH_MIB);
}

static void burst(long gap_ms, uint64_t gap_after_ms) {
    if (nrecs >= MAX_BURSTS) return;
    struct burst_rec *r = &recs[nrecs++];
    long f0 = thread_minflt();
    uint64_t t0 = now_ns();
    for (size_t i = 0; i < nobj; i++) {
        ptrs[i] = malloc(sizes[i]);
        if (!ptrs[i]) {
            fprintf(stderr, "malloc(%zu) failed\n", sizes[i]);
            exit(1);
        }
        touch_pages(ptrs[i], sizes[i]);
    }
    double live = rss_mib();
    for (size_t i = 0; i < nobj; i++)
        free(ptrs[perm[i]]);
    uint64_t t1 = now_ns();
    long f1 = thread_minflt();
    r->gap_ms = gap_ms;
    r->faults = f1 - f0;
    r->ms = (double)(t1 - t0) / 1e6;
    r->rss_live = live;
    r->rss_after_free = rss_mib();
    sleep_ms(gap_after_ms);
    r->rss_gap_end = rss_mib();
}

static _Atomic int stop;
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

static double median(double *v, int n) {
    if (n <= 0) return 0;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void parse_gaps(const char *s) {
    cfg.ngaps = 0;
    while (*s && cfg.ngaps < MAX_GAPS) {
        char *end;
        cfg.gaps[cfg.ngaps++] = strtoull(s, &end, 10);
        if (end == s) {
            fprintf(stderr, "bad --gaps\n");
            exit(2);
        }
        s = *end == ',' ? end + 1 : end;
    }
}

int main(int argc, char **argv) {
    const char *gaps = NULL;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            cfg.mib = 50;
            cfg.bursts = 3;
            cfg.idle_ms = 1000;
        } else if (!arg_u64(argc, argv, &i, "--mib", &cfg.mib) &&
                   !arg_u64(argc, argv, &i, "--bursts", &cfg.bursts) &&
                   !arg_u64(argc, argv, &i, "--idle-ms", &cfg.idle_ms) &&
                   !arg_u64(argc, argv, &i, "--sample-ms", &cfg.sample_ms) &&
                   !arg_value(argc, argv, &i, "--gaps", &gaps) &&
                   !arg_value(argc, argv, &i, "--bursts-csv", &cfg.bursts_csv) &&
                   !arg_value(argc, argv, &i, "--rss-csv", &cfg.rss_csv)) {
            fprintf(stderr, "usage: burst [--quick] [--mib N] [--bursts N] [--gaps MS,MS,...]\n"
                            "             [--idle-ms N] [--sample-ms N] [--bursts-csv PATH]\n"
                            "             [--rss-csv PATH]\n");
            return 2;
        }
    }
    if (gaps) parse_gaps(gaps);
    if (!cfg.mib || !cfg.bursts || !cfg.ngaps || !cfg.sample_ms ||
        cfg.bursts * (uint64_t)cfg.ngaps + 1 > MAX_BURSTS)
        return 2;
    bench_check_preload(SC);
    printf("INFO %s config mib=%llu bursts=%llu idle_ms=%llu gaps=", SC,
           (unsigned long long)cfg.mib, (unsigned long long)cfg.bursts,
           (unsigned long long)cfg.idle_ms);
    for (int g = 0; g < cfg.ngaps; g++)
        printf("%s%llu", g ? "," : "", (unsigned long long)cfg.gaps[g]);
    printf("\n");
    make_working_set();
    fflush(stdout);

    rss_samples = mmap(NULL, sizeof(float) * 2 * MAX_SAMPLES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (rss_samples == MAP_FAILED) return 1;
    uint64_t t_start = now_ns();
    pthread_t th;
    if (pthread_create(&th, NULL, sampler, &t_start) != 0) return 1;

    for (int g = 0; g < cfg.ngaps; g++)
        for (uint64_t b = 0; b < cfg.bursts; b++) {
            /* the gap after the last burst of all is the long idle */
            int last = g == cfg.ngaps - 1 && b == cfg.bursts - 1;
            burst((long)cfg.gaps[g], last ? cfg.idle_ms : cfg.gaps[g]);
        }
    double rss_idle = recs[nrecs - 1].rss_gap_end;
    burst(-1, 0);

    atomic_store(&stop, 1);
    pthread_join(th, NULL);

    /* Medians per gap; the very first burst (cold start) is left out. */
    for (int g = 0; g < cfg.ngaps; g++) {
        double f[MAX_BURSTS], ms[MAX_BURSTS], rg[MAX_BURSTS], rl[MAX_BURSTS];
        int n = 0;
        for (int i = 1; i < nrecs; i++) {
            if (recs[i].gap_ms != (long)cfg.gaps[g]) continue;
            f[n] = (double)recs[i].faults;
            ms[n] = recs[i].ms;
            /* the last burst's gap is the long idle: not a gap of this kind */
            rg[n] = recs[i].rss_gap_end;
            rl[n] = recs[i].rss_live;
            n++;
        }
        int ng = g == cfg.ngaps - 1 ? n - 1 : n;
        char m[64];
        snprintf(m, sizeof m, "gap%llu_faults", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median(f, n), "faults");
        snprintf(m, sizeof m, "gap%llu_burst_ms", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median(ms, n), "ms");
        snprintf(m, sizeof m, "gap%llu_rss_gap_end_mib", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median(rg, ng > 0 ? ng : n), "MiB");
        snprintf(m, sizeof m, "gap%llu_rss_live_mib", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median(rl, n), "MiB");
    }
    result(SC, "first_burst_faults", (double)recs[0].faults, "faults");
    result(SC, "rss_after_idle_mib", rss_idle, "MiB");
    result(SC, "after_idle_faults", (double)recs[nrecs - 1].faults, "faults");
    result(SC, "after_idle_burst_ms", recs[nrecs - 1].ms, "ms");

    if (cfg.bursts_csv) {
        FILE *f = fopen(cfg.bursts_csv, "w");
        if (f) {
            fprintf(f, "seq,gap_ms,faults,burst_ms,rss_live_mib,rss_after_free_mib,"
                       "rss_gap_end_mib\n");
            for (int i = 0; i < nrecs; i++)
                fprintf(f, "%d,%ld,%ld,%.2f,%.1f,%.1f,%.1f\n", i + 1, recs[i].gap_ms,
                        recs[i].faults, recs[i].ms, recs[i].rss_live, recs[i].rss_after_free,
                        recs[i].rss_gap_end);
            fclose(f);
        } else {
            perror(cfg.bursts_csv);
        }
    }
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
    return 0;
}
