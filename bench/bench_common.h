/*
 * bench_common.h: helpers shared by the bench/ programs.
 *
 * Every program here is a plain executable that uses only the standard malloc
 * API; the allocator under test arrives by LD_PRELOAD. This header gives each
 * program the same clock, RSS reader, latency histogram, result format and
 * preload check, and none of these helpers calls malloc, so they add nothing
 * to what is being measured.
 *
 * Output format, one line per fact, parsed by bench/report.py:
 *   RESULT <scenario> <metric> <value> <unit>
 *   INFO <scenario> <key> <free text>
 */
#ifndef LULL_BENCH_COMMON_H
#define LULL_BENCH_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define BENCH_MIB (1024.0 * 1024.0)
#define BENCH_PAGE 4096u

/* ---- clocks ------------------------------------------------------------ */

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* rdtsc fenced on both sides so the timed call cannot drift out of the
 * window; the TSC here is constant and nonstop (checked in /proc/cpuinfo). */
static inline uint64_t tsc_now(void) {
    uint32_t lo, hi;
    __asm__ __volatile__("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi)::"memory");
    return ((uint64_t)hi << 32) | lo;
}

static inline void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline void sleep_ms(uint64_t ms) {
    sleep_ns(ms * 1000000ull);
}

/* Nanoseconds per TSC tick, measured against CLOCK_MONOTONIC over ~50 ms. */
static inline double tsc_calibrate(void) {
    uint64_t t0 = now_ns(), c0 = tsc_now();
    sleep_ms(50);
    uint64_t t1 = now_ns(), c1 = tsc_now();
    if (c1 <= c0) return 1.0;
    return (double)(t1 - t0) / (double)(c1 - c0);
}

/* ---- random numbers (splitmix64: no state beyond one word) -------------- */

static inline uint64_t rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- memory figures ------------------------------------------------------ */

/* Reads a small /proc file into buf without stdio (stdio allocates). */
static inline ssize_t read_proc_file(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t len = 0;
    while (len + 1 < cap) {
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The number after `key` in /proc/self/status ("VmHWM:", "Threads:"; kB
 * for the memory fields), or -1. */
static inline double status_field(const char *key) {
    char buf[4096];
    if (read_proc_file("/proc/self/status", buf, sizeof buf) <= 0) return -1;
    const char *s = strstr(buf, key);
    double v;
    return s && sscanf(s + strlen(key), "%lf", &v) == 1 ? v : -1;
}

/* Resident set size of this process in bytes (from /proc/self/statm). */
static inline uint64_t rss_bytes(void) {
    char buf[256];
    if (read_proc_file("/proc/self/statm", buf, sizeof buf) <= 0) return 0;
    unsigned long long size = 0, resident = 0;
    if (sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
    return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static inline double rss_mib(void) {
    return (double)rss_bytes() / BENCH_MIB;
}

/* Peak RSS of this process so far (getrusage's ru_maxrss), in MiB. */
static inline double peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (double)ru.ru_maxrss / 1024.0;
}

/* Minor faults taken by the calling thread so far. */
static inline long thread_minflt(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return -1;
    return ru.ru_minflt;
}

/* The minor faults of every thread of the process (an allocator's own
 * threads too). */
static inline long process_minflt(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return ru.ru_minflt;
}

/* Zeroed memory straight from the kernel, for the benchmark's own arrays:
 * they must not come from (or disturb) the allocator under test. */
static inline void *map_array(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    return p;
}

/* Fisher-Yates shuffle of a[0..n), driven by rng_next. */
static inline void shuffle_u32(uint32_t *a, size_t n, uint64_t *rng) {
    for (size_t i = n ? n - 1 : 0; i > 0; i--) {
        size_t j = rng_next(rng) % (i + 1);
        uint32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* Sorts v[0..n) ascending in place (Shell sort: no allocation, fine for the
 * thousands of samples a program here keeps). */
static inline void sort_doubles(double *v, size_t n) {
    for (size_t gap = n / 2; gap > 0; gap = gap == 2 ? 1 : gap * 5 / 11) {
        for (size_t i = gap; i < n; i++) {
            double t = v[i];
            size_t j = i;
            for (; j >= gap && v[j - gap] > t; j -= gap)
                v[j] = v[j - gap];
            v[j] = t;
        }
    }
}

/* Median of v[0..n) (sorts v; the mean of the middle two when n is even). */
static inline double median_doubles(double *v, size_t n) {
    if (n == 0) return 0;
    sort_doubles(v, n);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Value at quantile q (0..1) of the sorted v[0..n): the nearest rank. */
static inline double quantile_sorted(const double *v, size_t n, double q) {
    if (n == 0) return 0;
    size_t i = (size_t)(q * (double)n);
    return v[i < n ? i : n - 1];
}

/* Voluntary plus involuntary context switches of the calling thread so far. */
static inline long thread_switches(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return -1;
    return ru.ru_nvcsw + ru.ru_nivcsw;
}

/* Writes one byte in every page of [p, p + n) so that all of it is resident. */
static inline void touch_pages(void *p, size_t n) {
    volatile char *c = (volatile char *)p;
    for (size_t i = 0; i < n; i += BENCH_PAGE)
        c[i] = (char)i;
    if (n) c[n - 1] = 1;
}

/* ---- results ------------------------------------------------------------ */

static inline void result(const char *scenario, const char *metric, double value,
                          const char *unit) {
    printf("RESULT %s %s %.6g %s\n", scenario, metric, value, unit);
}

/* ---- latency histogram: log-linear, 16 sub-buckets per power of two ------ */

#define HIST_SUB_BITS 4
#define HIST_SUB (1u << HIST_SUB_BITS)
#define HIST_BUCKETS (64u * HIST_SUB)

typedef struct {
    uint64_t count[HIST_BUCKETS];
    uint64_t n;
    uint64_t max;
    uint64_t sum;
} hist_t;

static inline unsigned hist_index(uint64_t v) {
    if (v < HIST_SUB) return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned sub = (unsigned)(v >> (msb - HIST_SUB_BITS)) & (HIST_SUB - 1u);
    return ((msb - HIST_SUB_BITS + 1u) << HIST_SUB_BITS) + sub;
}

/* Largest value that falls in bucket idx. */
static inline uint64_t hist_upper(unsigned idx) {
    if (idx < HIST_SUB) return idx;
    unsigned msb = (idx >> HIST_SUB_BITS) + HIST_SUB_BITS - 1u;
    unsigned sub = idx & (HIST_SUB - 1u);
    uint64_t lo = (uint64_t)(HIST_SUB + sub) << (msb - HIST_SUB_BITS);
    return lo + ((uint64_t)1 << (msb - HIST_SUB_BITS)) - 1u;
}

static inline void hist_add(hist_t *h, uint64_t v) {
    h->count[hist_index(v)]++;
    h->n++;
    h->sum += v;
    if (v > h->max) h->max = v;
}

static inline void hist_merge(hist_t *into, const hist_t *from) {
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        into->count[i] += from->count[i];
    into->n += from->n;
    into->sum += from->sum;
    if (from->max > into->max) into->max = from->max;
}

/* Value at quantile q (0..1): the upper edge of the bucket that holds it
 * (at most 1/16 above the true value), never above the exact maximum. */
static inline uint64_t hist_quantile(const hist_t *h, double q) {
    if (h->n == 0) return 0;
    uint64_t rank = (uint64_t)(q * (double)h->n);
    if (rank >= h->n) rank = h->n - 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->count[i];
        if (seen > rank) {
            uint64_t u = hist_upper(i);
            return u < h->max ? u : h->max;
        }
    }
    return h->max;
}

/* Writes "value,cumulative_fraction" rows (value scaled by `scale`). */
static inline int hist_write_cdf(const hist_t *h, const char *path, double scale,
                                 const char *header) {
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "%s\n", header);
    uint64_t seen = 0;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        if (!h->count[i]) continue;
        seen += h->count[i];
        uint64_t u = hist_upper(i);
        if (u > h->max) u = h->max;
        fprintf(f, "%.3f,%.9f\n", (double)u * scale, (double)seen / (double)h->n);
    }
    fclose(f);
    return 0;
}

/* Prints p50/p99/p99.9/p99.99/max (and mean) of h, scaled by `scale`. */
static inline void hist_report(const hist_t *h, const char *scenario, const char *prefix,
                               double scale, const char *unit) {
    static const struct {
        const char *name;
        double q;
    } qs[] = {{"p50", 0.50}, {"p99", 0.99}, {"p999", 0.999}, {"p9999", 0.9999}};
    char metric[128];
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        snprintf(metric, sizeof metric, "%s_%s", prefix, qs[i].name);
        result(scenario, metric, (double)hist_quantile(h, qs[i].q) * scale, unit);
    }
    snprintf(metric, sizeof metric, "%s_max", prefix);
    result(scenario, metric, (double)h->max * scale, unit);
    snprintf(metric, sizeof metric, "%s_mean", prefix);
    result(scenario, metric, h->n ? (double)h->sum / (double)h->n * scale : 0.0, unit);
}

/* ---- preload check ------------------------------------------------------ */

/* Allocator libraries recognised in /proc/self/maps. */
static const char *const bench_alloc_libs[] = {"jemalloc", "mimalloc", "tcmalloc", "liblull", NULL};

static char bench_maps_buf[1 << 20];

/* Is `path` the file of some mapping in the maps text? */
static inline int maps_has_path(const char *maps, const char *path) {
    size_t len = strlen(path);
    for (const char *s = maps; (s = strstr(s, path)) != NULL; s += len) {
        if ((s[len] == '\n' || s[len] == '\0' || s[len] == ' ') && s > maps && s[-1] == ' ')
            return 1;
    }
    return 0;
}

/*
 * Verifies that the allocator named by the environment is the one mapped in
 * this process, prints what was found, and exits with status 3 if not:
 *   - every LD_PRELOAD entry (resolved with realpath) must be mapped;
 *   - with BENCH_ALLOC=glibc, no known allocator library may be mapped.
 * Prints "INFO <scenario> preload ..." lines that run.sh keeps in results.
 */
static inline void bench_check_preload(const char *scenario) {
    const char *alloc = getenv("BENCH_ALLOC");
    const char *preload = getenv("LD_PRELOAD");
    if (read_proc_file("/proc/self/maps", bench_maps_buf, sizeof bench_maps_buf) <= 0) {
        printf("ERROR %s cannot read /proc/self/maps\n", scenario);
        fflush(stdout);
        exit(3);
    }
    int ok = 1;
    printf("INFO %s allocator %s\n", scenario, alloc ? alloc : "(unset)");
    printf("INFO %s ld_preload %s\n", scenario, preload && *preload ? preload : "(none)");
    /* List every allocator library that is mapped (once each). */
    char seen[8][PATH_MAX];
    int nseen = 0;
    for (char *line = bench_maps_buf; line && *line;) {
        char *nl = strchr(line, '\n');
        size_t llen = nl ? (size_t)(nl - line) : strlen(line);
        char *path = memchr(line, '/', llen);
        size_t plen = path ? llen - (size_t)(path - line) : 0;
        if (path && plen < PATH_MAX) {
            char tmp[PATH_MAX];
            memcpy(tmp, path, plen);
            tmp[plen] = '\0';
            const char *base = strrchr(tmp, '/') + 1;
            for (int k = 0; bench_alloc_libs[k]; k++) {
                if (!strstr(base, bench_alloc_libs[k])) continue;
                int dup = 0;
                for (int j = 0; j < nseen; j++)
                    dup |= strcmp(seen[j], tmp) == 0;
                if (!dup && nseen < 8) {
                    memcpy(seen[nseen++], tmp, plen + 1);
                    printf("INFO %s mapped %s\n", scenario, tmp);
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    if (preload && *preload) {
        char tok[PATH_MAX];
        const char *s = preload;
        while (*s) {
            size_t n = strcspn(s, ": ");
            if (n > 0 && n < sizeof tok) {
                memcpy(tok, s, n);
                tok[n] = '\0';
                char real[PATH_MAX];
                const char *want = realpath(tok, real) ? real : tok;
                if (maps_has_path(bench_maps_buf, want)) {
                    printf("INFO %s preload_ok %s\n", scenario, want);
                } else {
                    printf("ERROR %s preload %s is not mapped in /proc/self/maps\n", scenario,
                           want);
                    ok = 0;
                }
            }
            s += n;
            while (*s == ':' || *s == ' ')
                s++;
        }
    }
    if (alloc && strcmp(alloc, "glibc") == 0 && nseen > 0) {
        printf("ERROR %s glibc run but an allocator library is mapped\n", scenario);
        ok = 0;
    }
    if (alloc && strcmp(alloc, "glibc") == 0 && ok) printf("INFO %s preload_ok glibc\n", scenario);
    fflush(stdout);
    if (!ok) exit(3);
}

/* ---- argument parsing: --name=value or --name value ---------------------- */

/* If argv[*i] is --name (with =value or a following value), stores the value
 * and returns 1. */
static inline int arg_value(int argc, char **argv, int *i, const char *name, const char **out) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *out = a + n + 1;
        return 1;
    }
    if (a[n] == '\0' && *i + 1 < argc) {
        *out = argv[++*i];
        return 1;
    }
    return 0;
}

static inline int arg_u64(int argc, char **argv, int *i, const char *name, uint64_t *out) {
    const char *v;
    if (!arg_value(argc, argv, i, name, &v)) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end) {
        fprintf(stderr, "bad value for %s: %s\n", name, v);
        exit(2);
    }
    *out = x;
    return 1;
}

static inline int arg_flag(char **argv, int i, const char *name) {
    return strcmp(argv[i], name) == 0;
}

#endif
