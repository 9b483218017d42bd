/*
 * burst.c: refault churn between bursts of a transient working set.
 *
 * Each burst allocates ~--mib MiB (200) of mixed sizes, touches every page,
 * then frees all of it in random order. Between bursts the thread is idle
 * for a gap; --gaps lists the gaps (ms), and --bursts bursts (10) run with
 * each. After the last one the process idles --idle-ms (5 s), then runs one
 * more burst. Per burst: the minor faults the burst thread took (getrusage
 * RUSAGE_THREAD), the burst's duration, and RSS when the working set is
 * live, right after it is freed and at the end of the gap. And the minor
 * faults of the whole process from the burst's start to its gap's end
 * (gap<N>_faults_process): an allocator that prefaults on a thread of its
 * own (lull's warm reserve) takes the burst thread's faults there. On a
 * PVM guest, where a fault costs ~14 us, lull with purge_delay_ms=0 took
 * 22 faults a burst on the burst thread and 650,000 in all over a run,
 * its bursts 50 times slower than with the default delay.
 *
 * The per-gap figures are the steady state: medians over the bursts of the
 * gap after its first --warmup (2). Those are the cold start or the change
 * from the previous gap, and an adaptive allocator's settling (lull's
 * faults per burst fall from thousands to tens over its first few bursts);
 * every burst after the warm-up follows a gap of its own length.
 *
 * An allocator that purges during the gap makes the next burst fault its
 * working set back in (slow, and paid by the request thread); one that keeps
 * everything has a large RSS between bursts. The RSS after the long idle
 * shows whether the memory is given back eventually.
 *
 * --bursts-csv PATH  one row per burst; --rss-csv PATH  RSS every 20 ms.
 *
 * Under lull (a counter page /dev/shm/lull.<pid> of this process) it also
 * prints lull's configuration and purge delay in force at the end; with
 * BENCH_LULL_CONF=key=value,... in the environment (run.sh sets it for the
 * lull-delay0 variant) it exits with status 3, printing no results, unless
 * every one of those keys has that value there: the proof that the
 * configuration took effect, as bench_check_preload is for the library.
 */
#include "bench_common.h"

#include <lull/counters.h> /* the counter page ABI only: nothing links lull */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define SC "burst"
#define MAX_GAPS 8
#define MAX_BURSTS 256
#define MAX_SAMPLES 100000

static struct {
    uint64_t mib, bursts, warmup, idle_ms, sample_ms;
    uint64_t gaps[MAX_GAPS];
    int ngaps;
    const char *bursts_csv, *rss_csv;
} cfg = {.mib = 200,
         .bursts = 10,
         .warmup = 2,
         .idle_ms = 5000,
         .sample_ms = 20,
         .gaps = {50, 500},
         .ngaps = 2};

struct burst_rec {
    long gap_ms; /* -1: the burst after the long idle */
    long faults;
    long process_faults; /* every thread's, from the burst's start to its gap's end */
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
    shuffle_u32(perm, nobj, &rng);
    printf("INFO %s working set %zu objects, %.1f MiB\n", SC, nobj, (double)total / BENCH_MIB);
}

static void burst(long gap_ms, uint64_t gap_after_ms) {
    if (nrecs >= MAX_BURSTS) return;
    struct burst_rec *r = &recs[nrecs++];
    long f0 = thread_minflt(), p0 = process_minflt();
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
    r->process_faults = process_minflt() - p0;
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

/* Under lull, prints the configuration and the purge delay in force, read
 * from this process's counter page (include/lull/counters.h; lull opens it
 * about 1 s after start). With BENCH_LULL_CONF set, returns -1 (after an
 * ERROR line) unless each of its key=value items is in that configuration. */
static int lull_config_check(void) {
    const char *want = getenv("BENCH_LULL_CONF");
    char path[64];
    snprintf(path, sizeof path, LULL_COUNTERS_SHM_DIR LULL_COUNTERS_NAME_PREFIX "%d",
             (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    const volatile struct lull_counters *page = MAP_FAILED;
    struct stat st;
    /* (a page not yet sized would fault on access: SIGBUS) */
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof *page)
        page = mmap(NULL, sizeof *page, PROT_READ, MAP_SHARED, fd, 0);
    if (fd >= 0) close(fd);
    static struct lull_counters c; /* 1.8 KiB: not on the stack */
    if (page == MAP_FAILED || page->magic != LULL_COUNTERS_MAGIC ||
        page->abi_version != LULL_COUNTERS_ABI_VERSION || page->size < sizeof c ||
        lull_counters_snapshot(page, &c) != 0) {
        if (page != MAP_FAILED) munmap((void *)page, sizeof *page);
        if (!want) return 0; /* not lull, or nothing to check */
        printf("ERROR %s BENCH_LULL_CONF=%s but no readable lull counter page %s to check "
               "it against\n",
               SC, want, path);
        return -1;
    }
    munmap((void *)page, sizeof *page);
    c.config[sizeof c.config - 1] = '\0';
    printf("INFO %s lull_config %s\n", SC, c.config);
    char delay[24] = "never";
    if (c.purge_delay_ms != LULL_COUNTERS_DELAY_NEVER)
        snprintf(delay, sizeof delay, "%llu", (unsigned long long)c.purge_delay_ms);
    printf("INFO %s lull_at_end purge_delay_ms=%s purge_mode=%s purged_pages=%llu "
           "refault_pages=%llu\n",
           SC, delay, lull_counters_purge_mode_name(c.purge_mode),
           (unsigned long long)c.purged_pages, (unsigned long long)c.refault_pages);
    if (!want) return 0;
    /* every item of want, as a whole item of ",config," */
    char have[LULL_COUNTERS_CONFIG_LEN + 2], item[LULL_COUNTERS_CONFIG_LEN + 2];
    snprintf(have, sizeof have, ",%s,", c.config);
    for (const char *s = want; *s;) {
        size_t n = strcspn(s, ",");
        if (n > 0 && n < sizeof item - 2) {
            snprintf(item, sizeof item, ",%.*s,", (int)n, s);
            if (!strstr(have, item)) {
                printf("ERROR %s lull config: %.*s is not in force (%s)\n", SC, (int)n, s,
                       c.config);
                return -1;
            }
        }
        s += n;
        if (*s == ',') s++;
    }
    printf("INFO %s preload_ok lull config %s\n", SC, want);
    return 0;
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
            cfg.bursts = 4; /* 2 warm-up + 2 steady-state bursts per gap */
            cfg.idle_ms = 1000;
        } else if (!arg_u64(argc, argv, &i, "--mib", &cfg.mib) &&
                   !arg_u64(argc, argv, &i, "--bursts", &cfg.bursts) &&
                   !arg_u64(argc, argv, &i, "--warmup", &cfg.warmup) &&
                   !arg_u64(argc, argv, &i, "--idle-ms", &cfg.idle_ms) &&
                   !arg_u64(argc, argv, &i, "--sample-ms", &cfg.sample_ms) &&
                   !arg_value(argc, argv, &i, "--gaps", &gaps) &&
                   !arg_value(argc, argv, &i, "--bursts-csv", &cfg.bursts_csv) &&
                   !arg_value(argc, argv, &i, "--rss-csv", &cfg.rss_csv)) {
            fprintf(stderr, "usage: burst [--quick] [--mib N] [--bursts N] [--warmup N]\n"
                            "             [--gaps MS,MS,...] [--idle-ms N] [--sample-ms N]\n"
                            "             [--bursts-csv PATH] [--rss-csv PATH]\n");
            return 2;
        }
    }
    if (gaps) parse_gaps(gaps);
    if (!cfg.mib || !cfg.bursts || !cfg.ngaps || !cfg.sample_ms ||
        cfg.bursts * (uint64_t)cfg.ngaps + 1 > MAX_BURSTS)
        return 2;
    bench_check_preload(SC);
    /* warm-up bursts left out of each gap's medians: at least one is kept */
    uint64_t skip = cfg.warmup < cfg.bursts ? cfg.warmup : cfg.bursts - 1;
    printf("INFO %s config mib=%llu bursts=%llu warmup=%llu idle_ms=%llu gaps=", SC,
           (unsigned long long)cfg.mib, (unsigned long long)cfg.bursts, (unsigned long long)skip,
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
    /* the program and its arrays: nothing of a burst is live */
    double rss_base = rss_mib();

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
    if (lull_config_check() != 0) return 3;

    /* Steady state per gap: medians over the bursts of the gap after the
     * first `skip` (recs are in order: cfg.bursts per gap). */
    printf("INFO %s steady_state per-gap figures are medians over bursts %llu-%llu of each gap "
           "(the first %llu of each gap are warm-up, left out)\n",
           SC, (unsigned long long)skip + 1, (unsigned long long)cfg.bursts,
           (unsigned long long)skip);
    for (int g = 0; g < cfg.ngaps; g++) {
        double f[MAX_BURSTS], ms[MAX_BURSTS], rg[MAX_BURSTS], rl[MAX_BURSTS], pf[MAX_BURSTS];
        int n = 0, ng = 0;
        for (uint64_t b = skip; b < cfg.bursts; b++) {
            const struct burst_rec *r = &recs[(uint64_t)g * cfg.bursts + b];
            f[n] = (double)r->faults;
            ms[n] = r->ms;
            rl[n] = r->rss_live;
            n++;
            /* the last burst's gap is the long idle: not a gap of this kind */
            if (g < cfg.ngaps - 1 || b < cfg.bursts - 1) {
                pf[ng] = (double)r->process_faults;
                rg[ng++] = r->rss_gap_end;
            }
        }
        char m[64];
        snprintf(m, sizeof m, "gap%llu_faults", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median_doubles(f, (size_t)n), "faults");
        snprintf(m, sizeof m, "gap%llu_burst_ms", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median_doubles(ms, (size_t)n), "ms");
        if (ng > 0) {
            snprintf(m, sizeof m, "gap%llu_rss_gap_end_mib", (unsigned long long)cfg.gaps[g]);
            result(SC, m, median_doubles(rg, (size_t)ng), "MiB");
            snprintf(m, sizeof m, "gap%llu_faults_process", (unsigned long long)cfg.gaps[g]);
            result(SC, m, median_doubles(pf, (size_t)ng), "faults");
        }
        snprintf(m, sizeof m, "gap%llu_rss_live_mib", (unsigned long long)cfg.gaps[g]);
        result(SC, m, median_doubles(rl, (size_t)n), "MiB");
    }
    result(SC, "first_burst_faults", (double)recs[0].faults, "faults");
    result(SC, "rss_base_mib", rss_base, "MiB");
    result(SC, "rss_after_idle_mib", rss_idle, "MiB");
    result(SC, "after_idle_faults", (double)recs[nrecs - 1].faults, "faults");
    result(SC, "after_idle_burst_ms", recs[nrecs - 1].ms, "ms");

    if (cfg.bursts_csv) {
        FILE *f = fopen(cfg.bursts_csv, "w");
        if (f) {
            fprintf(f, "seq,gap_ms,faults,burst_ms,rss_live_mib,rss_after_free_mib,"
                       "rss_gap_end_mib,process_faults\n");
            for (int i = 0; i < nrecs; i++)
                fprintf(f, "%d,%ld,%ld,%.2f,%.1f,%.1f,%.1f,%ld\n", i + 1, recs[i].gap_ms,
                        recs[i].faults, recs[i].ms, recs[i].rss_live, recs[i].rss_after_free,
                        recs[i].rss_gap_end, recs[i].process_faults);
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
