/*
 * thp.c: transparent hugepages (issue 16, "Measure"): how much of a heap of
 * small objects an allocator leaves backed by huge pages, and what that is
 * worth to a workload bound by TLB misses.
 *
 *   bench_thp --mode coverage [--quick] [--heap-mib N] [--rounds N] [--idle-ms N]
 *   bench_thp --mode tlb      [--quick] [--heap-mib N] [--ops N] [--chains N]
 *
 * Coverage is AnonHugePages / Anonymous of /proc/self/smaps_rollup (both
 * kB), of the whole process as the issue defines it: the program's own
 * arrays (mmap, MADV_NOHUGEPAGE, ~0.6 % of the heap) are in the denominator
 * for every allocator alike (INFO thp base_* has them).
 *
 * coverage: a heap of --heap-mib (512; --quick 64) of 64-4096 B objects
 * (--min-bytes, --max-bytes),
 * sizes drawn uniformly, each written in full; then the coverage
 * (coverage_alloc_pct), RSS and time. Then a churn with purging on (every
 * allocator as configured by default): --rounds (10; --quick 3) of
 *   free a random half of the objects, idle --idle-ms (1200), allocate the
 *   freed half again (new random sizes, written in full),
 * with the coverage after each round's allocation (churn_rNN_coverage_pct),
 * its minimum and median over the rounds, the largest RSS after an
 * allocation and the median RSS after the idle (the heap half free: what
 * purging gave back). The idle is a fixed sleep, not a wait for an event:
 * lull's own reclaim could be waited for through its API, but the peers have
 * none (jemalloc and mimalloc purge from inside later calls, on the clock),
 * and this is a benchmark, not a test: 1.2 s is past lull's purge delay and
 * what bench_stall waits too. At the end every object is freed and, after
 * the same idle, rss_idle_end_mib (rss_base_mib: before the heap).
 *
 * tlb: a heap of --heap-mib (2048; --quick 128) of 64-256 B objects and an
 * array of pointers to them (mmap, MADV_HUGEPAGE: the program's own index
 * costs every allocator the same, and as little as the system allows, so
 * that the misses that differ are the objects'). Each object's first word
 * holds a random value. --ops (20 M; --quick 2 M) operations, each a read of
 * one object's first word, and on half of them (chosen by the value) a write
 * of it; the next object a chain visits is a hash of the value read (a
 * dependent chain, as a server chases pointers), and --chains (4) chains are
 * interleaved, so that the CPU overlaps their misses as it would a server's
 * independent requests. The sequence of objects visited depends only on the
 * seeds, never on addresses: every allocator gets the same accesses.
 * The operations run in 5 timed passes, the chains going on from one to the
 * next. Reports tlb_mops (of the median pass; tlb_mops_best: the fastest),
 * tlb_ns_per_op and tlb_cpu_ns_per_op (the thread's CPU time, which being
 * switched out on a shared machine does not inflate; tlb_cpu_mops: its
 * operations per CPU second), the RSS, and the
 * heap's coverage (tlb_heap_coverage_pct: AnonHugePages and Anonymous less
 * what they were before the heap, i.e. without the index array). Under
 * BENCH_PERF_CTL (and BENCH_PERF_ACK), fifos of `perf stat --control
 * fifo:CTL,ACK -D -1` (bench/thp_tlb.sh sets them), the program enables the
 * counters for the timed passes only: perf, not this program, counts the
 * dTLB misses.
 */
#include "bench_common.h"
#include "lull/counters.h"

#include <sys/stat.h>

#define SC "thp"
#define KIB 1024u
#define MIB (1024ull * 1024ull)

static struct {
    int quick;
    uint64_t heap_mib;
    uint64_t rounds;
    uint64_t idle_ms;
    uint64_t ops;
    uint64_t chains;
    uint32_t min_bytes, max_bytes;
} cfg;

/* ---- /proc/self/smaps_rollup -------------------------------------------- */

struct anon {
    double rss_kb, anon_kb, huge_kb;
};

static double rollup_field(const char *buf, const char *key) {
    const char *s = strstr(buf, key);
    double v;
    return s && sscanf(s + strlen(key), "%lf", &v) == 1 ? v : -1;
}

static struct anon read_anon(void) {
    char buf[4096];
    struct anon a = {-1, -1, -1};
    if (read_proc_file("/proc/self/smaps_rollup", buf, sizeof buf) <= 0) {
        printf("ERROR %s cannot read /proc/self/smaps_rollup\n", SC);
        fflush(stdout);
        exit(1);
    }
    a.rss_kb = rollup_field(buf, "\nRss:");
    a.anon_kb = rollup_field(buf, "\nAnonymous:");
    a.huge_kb = rollup_field(buf, "\nAnonHugePages:");
    if (a.anon_kb < 0 || a.huge_kb < 0) {
        printf("ERROR %s no Anonymous or AnonHugePages in /proc/self/smaps_rollup\n", SC);
        fflush(stdout);
        exit(1);
    }
    return a;
}

static double coverage_pct(struct anon a) {
    return a.anon_kb > 0 ? 100.0 * a.huge_kb / a.anon_kb : 0;
}

static void print_anon(const char *what, struct anon a) {
    printf("INFO %s %s rss=%.1f MiB anonymous=%.1f MiB anon_huge=%.1f MiB coverage=%.1f %%\n", SC,
           what, a.rss_kb / 1024, a.anon_kb / 1024, a.huge_kb / 1024, coverage_pct(a));
}

/* ---- the system's THP settings and lull's configuration ------------------ */

static void print_sys_file(const char *key, const char *path) {
    char buf[256];
    if (read_proc_file(path, buf, sizeof buf) <= 0) snprintf(buf, sizeof buf, "n/a\n");
    buf[strcspn(buf, "\n")] = '\0';
    printf("INFO %s %s %s\n", SC, key, buf);
}

/* Under lull, the configuration in force from this process's counter page
 * (include/lull/counters.h; lull opens it about 1 s after start, so this
 * runs at the end): whether a thp= key took effect shows there. */
static void print_lull_config(void) {
    char path[64];
    snprintf(path, sizeof path, LULL_COUNTERS_SHM_DIR LULL_COUNTERS_NAME_PREFIX "%d",
             (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return; /* not lull */
    const volatile struct lull_counters *page = MAP_FAILED;
    struct stat st;
    /* (a page not yet sized would fault on access: SIGBUS) */
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof *page)
        page = mmap(NULL, sizeof *page, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (page == MAP_FAILED) return;
    static struct lull_counters c; /* not on the stack */
    int ok = page->magic == LULL_COUNTERS_MAGIC && page->abi_version == LULL_COUNTERS_ABI_VERSION &&
             page->size >= sizeof c && lull_counters_snapshot(page, &c) == 0;
    munmap((void *)page, sizeof *page);
    if (!ok) return;
    c.config[sizeof c.config - 1] = '\0';
    printf("INFO %s lull_config %s\n", SC, c.config);
    const char *want = getenv("LULL_CONF");
    const char *thp = want ? strstr(want, "thp=") : NULL;
    if (thp) {
        /* the state lull reports (struct lull_counters_thp): the config
         * string has no room for the key */
        static const char *const states[] = {"off", "on", "unavailable"};
        printf("INFO %s lull_thp %.*s asked for; lull's huge pages: %s, %llu collapses, %llu "
               "regions prefaulted huge by the warm reserve, %llu MiB in regions it made huge\n",
               SC, (int)strcspn(thp, ","), thp, c.thp.state < 3 ? states[c.thp.state] : "?",
               (unsigned long long)c.thp.collapses, (unsigned long long)c.thp.prefaulted_regions,
               (unsigned long long)(c.thp.huge_bytes >> 20));
    }
}

/* ---- the program's own arrays --------------------------------------------- */

static void *own_array(size_t bytes, int advice) {
    void *p = map_array(bytes);
    madvise(p, bytes, advice); /* best effort: without THP either is refused */
    memset(p, 0, bytes);       /* resident before the first figure */
    return p;
}

static uint32_t uniform(uint64_t *rng, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)(rng_next(rng) % (hi - lo + 1u));
}

static void *alloc_or_die(size_t n) {
    void *p = malloc(n);
    if (!p) {
        printf("ERROR %s malloc(%zu) failed\n", SC, n);
        fflush(stdout);
        exit(1);
    }
    return p;
}

/* ---- coverage ------------------------------------------------------------- */

/* object sizes; --min-bytes and --max-bytes change them (buffers of 16
 * KiB-1 MiB, say: spans of their own, whose frees leave holes the next
 * allocations fill, where placement decides which 2 MiB regions stay
 * dense) */
#define COV_MIN cfg.min_bytes
#define COV_MAX cfg.max_bytes
#define MAX_ROUNDS 100

static void **cov_ptr;
static uint32_t *cov_size;

static uint64_t cov_fill(uint32_t slot, uint64_t *rng) {
    uint32_t size = uniform(rng, COV_MIN, COV_MAX);
    cov_size[slot] = size;
    cov_ptr[slot] = alloc_or_die(size);
    memset(cov_ptr[slot], (int)(slot | 1u), size); /* written in full */
    return size;
}

static void run_coverage(void) {
    uint64_t heap = cfg.heap_mib * MIB;
    /* the count the heap takes, with room for the spread of the sizes */
    size_t cap = (size_t)(heap / ((COV_MIN + COV_MAX) / 2) * 11 / 10) + 1024;
    cov_ptr = own_array(cap * sizeof *cov_ptr, MADV_NOHUGEPAGE);
    cov_size = own_array(cap * sizeof *cov_size, MADV_NOHUGEPAGE);
    uint32_t *order = own_array(cap * sizeof *order, MADV_NOHUGEPAGE);
    printf("INFO %s config mode=coverage heap=%llu MiB sizes=%u-%u rounds=%llu idle=%llu ms%s\n",
           SC, (unsigned long long)cfg.heap_mib, COV_MIN, COV_MAX, (unsigned long long)cfg.rounds,
           (unsigned long long)cfg.idle_ms, cfg.quick ? " (quick)" : "");
    struct anon base = read_anon();
    print_anon("base", base);
    fflush(stdout);

    uint64_t rng = 11, live = 0;
    uint32_t n = 0;
    uint64_t t0 = now_ns();
    while (live < heap && n < cap)
        live += cov_fill(n++, &rng);
    uint64_t t1 = now_ns();
    struct anon a = read_anon();
    print_anon("after_alloc", a);
    printf("INFO %s objects %u live=%.1f MiB\n", SC, n, (double)live / BENCH_MIB);
    result(SC, "rss_base_mib", base.rss_kb / 1024, "MiB");
    result(SC, "live_mib", (double)live / BENCH_MIB, "MiB");
    result(SC, "coverage_alloc_pct", coverage_pct(a), "%");
    result(SC, "rss_alloc_mib", a.rss_kb / 1024, "MiB");
    result(SC, "alloc_time_s", (double)(t1 - t0) / 1e9, "s");
    fflush(stdout);

    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    double cov[MAX_ROUNDS], rss_full[MAX_ROUNDS], rss_half[MAX_ROUNDS], cov_half[MAX_ROUNDS];
    uint64_t churn_ns = 0;
    for (uint32_t r = 0; r < cfg.rounds; r++) {
        shuffle_u32(order, n, &rng);
        uint64_t c0 = now_ns();
        for (uint32_t k = 0; k < n / 2; k++) {
            free(cov_ptr[order[k]]);
            live -= cov_size[order[k]];
        }
        churn_ns += now_ns() - c0;
        sleep_ms(cfg.idle_ms);
        struct anon h = read_anon();
        c0 = now_ns();
        for (uint32_t k = 0; k < n / 2; k++)
            live += cov_fill(order[k], &rng);
        churn_ns += now_ns() - c0;
        struct anon f = read_anon();
        cov[r] = coverage_pct(f);
        cov_half[r] = coverage_pct(h);
        rss_full[r] = f.rss_kb / 1024;
        rss_half[r] = h.rss_kb / 1024;
        printf("INFO %s round %u half_free: rss=%.1f MiB coverage=%.1f %%; refilled: rss=%.1f MiB "
               "anon_huge=%.1f MiB coverage=%.1f %% live=%.1f MiB\n",
               SC, r + 1, rss_half[r], cov_half[r], rss_full[r], f.huge_kb / 1024, cov[r],
               (double)live / BENCH_MIB);
        char m[64];
        snprintf(m, sizeof m, "churn_r%02u_coverage_pct", r + 1);
        result(SC, m, cov[r], "%");
        fflush(stdout);
    }
    if (cfg.rounds > 0) {
        double mx = 0;
        for (uint32_t r = 0; r < cfg.rounds; r++)
            mx = rss_full[r] > mx ? rss_full[r] : mx;
        result(SC, "churn_coverage_median_pct", median_doubles(cov, cfg.rounds), "%");
        /* (median_doubles sorted cov: its first is the minimum) */
        result(SC, "churn_coverage_min_pct", cov[0], "%");
        result(SC, "churn_half_coverage_median_pct", median_doubles(cov_half, cfg.rounds), "%");
        result(SC, "churn_rss_max_mib", mx, "MiB");
        result(SC, "churn_half_rss_median_mib", median_doubles(rss_half, cfg.rounds), "MiB");
        result(SC, "churn_time_s", (double)churn_ns / 1e9, "s");
    }

    for (uint32_t i = 0; i < n; i++)
        free(cov_ptr[i]);
    sleep_ms(cfg.idle_ms);
    struct anon e = read_anon();
    print_anon("end_idle", e);
    result(SC, "rss_idle_end_mib", e.rss_kb / 1024, "MiB");
}

/* ---- tlb ------------------------------------------------------------------ */

#define TLB_MIN 64u
#define TLB_MAX 256u
#define MAX_CHAINS 16
#define TLB_PASSES 5

static uint64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The perf control fifos of bench/thp_tlb.sh, if any: "enable" / "disable",
 * each answered with "ack" (so the window is exact). */
static int perf_ctl = -1, perf_ack = -1;

static void perf_open(void) {
    const char *ctl = getenv("BENCH_PERF_CTL"), *ack = getenv("BENCH_PERF_ACK");
    if (!ctl || !*ctl) return;
    perf_ctl = open(ctl, O_WRONLY | O_CLOEXEC);
    perf_ack = ack && *ack ? open(ack, O_RDONLY | O_CLOEXEC) : -1;
    if (perf_ctl < 0) {
        printf("ERROR %s cannot open the perf control fifo %s\n", SC, ctl);
        fflush(stdout);
        exit(1);
    }
}

static void perf_command(const char *cmd) {
    if (perf_ctl < 0) return;
    size_t len = strlen(cmd);
    if (write(perf_ctl, cmd, len) != (ssize_t)len) {
        printf("ERROR %s writing '%s' to the perf control fifo failed\n", SC, cmd);
        exit(1);
    }
    if (perf_ack >= 0) {
        char buf[8];
        if (read(perf_ack, buf, sizeof buf) <= 0) {
            printf("ERROR %s no ack from perf\n", SC);
            exit(1);
        }
    }
}

/* Maps a 64-bit hash onto [0, n) without a division. */
static inline uint64_t scale_to(uint64_t h, uint64_t n) {
    return (uint64_t)(((unsigned __int128)h * n) >> 64);
}

static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The timed loop: --chains dependent chains, interleaved. Returns a checksum
 * (printed, so that the loads cannot be dropped). */
static __attribute__((noinline)) uint64_t tlb_loop(uint64_t **ptr, uint64_t n, uint64_t first,
                                                   uint64_t ops, uint32_t chains, uint64_t *idx) {
    uint64_t sum = 0;
    for (uint64_t k = first; k < first + ops; k += chains) {
        for (uint32_t c = 0; c < chains; c++) {
            uint64_t *p = ptr[idx[c]];
            uint64_t v = *p;
            if (v & 1) *p = mix64(v + k); /* a write on half the operations */
            sum += v;
            idx[c] = scale_to(mix64(v ^ k), n);
        }
    }
    return sum;
}

static void run_tlb(void) {
    uint64_t heap = cfg.heap_mib * MIB;
    size_t cap = (size_t)(heap / ((TLB_MIN + TLB_MAX) / 2) * 11 / 10) + 1024;
    uint64_t **ptr = own_array(cap * sizeof *ptr, MADV_HUGEPAGE);
    printf("INFO %s config mode=tlb heap=%llu MiB sizes=%u-%u ops=%llu chains=%llu "
           "index=mmap+MADV_HUGEPAGE%s\n",
           SC, (unsigned long long)cfg.heap_mib, TLB_MIN, TLB_MAX, (unsigned long long)cfg.ops,
           (unsigned long long)cfg.chains, cfg.quick ? " (quick)" : "");
    struct anon base = read_anon();
    print_anon("base", base);
    fflush(stdout);

    uint64_t rng = 13, live = 0, n = 0;
    uint64_t t0 = now_ns();
    while (live < heap && n < cap) {
        uint32_t size = uniform(&rng, TLB_MIN, TLB_MAX);
        uint64_t *p = alloc_or_die(size);
        p[0] = rng_next(&rng);
        ((volatile char *)p)[size - 1] = 1;
        ptr[n++] = p;
        live += size;
    }
    uint64_t t1 = now_ns();
    struct anon a = read_anon();
    print_anon("after_alloc", a);
    printf("INFO %s objects %llu live=%.1f MiB\n", SC, (unsigned long long)n,
           (double)live / BENCH_MIB);
    result(SC, "tlb_live_mib", (double)live / BENCH_MIB, "MiB");
    /* the heap's alone: the index array (huge where THP allows) is taken out */
    struct anon heap_only = {a.rss_kb - base.rss_kb, a.anon_kb - base.anon_kb,
                             a.huge_kb - base.huge_kb};
    result(SC, "tlb_heap_coverage_pct", coverage_pct(heap_only), "%");
    result(SC, "tlb_rss_mib", a.rss_kb / 1024, "MiB");
    result(SC, "tlb_alloc_time_s", (double)(t1 - t0) / 1e9, "s");
    fflush(stdout);

    /* TLB_PASSES timed passes, the chains going on from one to the next:
     * the median pass (and the best) and the thread's CPU time, which a
     * machine shared with other work inflates less than the wall clock */
    uint64_t per_pass = (cfg.ops / TLB_PASSES + cfg.chains - 1) / cfg.chains * cfg.chains;
    uint64_t idx[MAX_CHAINS], sum = 0;
    double wall[TLB_PASSES], cpu[TLB_PASSES];
    for (uint32_t c = 0; c < cfg.chains; c++)
        idx[c] = scale_to(mix64(0x1234567ull + c), n);
    perf_open();
    perf_command("enable\n");
    for (uint32_t i = 0; i < TLB_PASSES; i++) {
        uint64_t c0 = thread_cpu_ns(), w0 = now_ns();
        sum += tlb_loop(ptr, n, i * per_pass, per_pass, (uint32_t)cfg.chains, idx);
        uint64_t w1 = now_ns(), c1 = thread_cpu_ns();
        wall[i] = (double)(w1 - w0) / (double)per_pass;
        cpu[i] = (double)(c1 - c0) / (double)per_pass;
    }
    perf_command("disable\n");
    printf("INFO %s tlb_checksum %llx\n", SC, (unsigned long long)sum);
    printf("INFO %s tlb_passes", SC);
    for (uint32_t i = 0; i < TLB_PASSES; i++)
        printf(" %.1f", wall[i]);
    printf(" ns/op (wall)\n");
    double wall_med = median_doubles(wall, TLB_PASSES); /* sorts: wall[0] is the best */
    result(SC, "tlb_ops", (double)(per_pass * TLB_PASSES), "ops");
    result(SC, "tlb_mops", 1e3 / wall_med, "Mops/s");
    result(SC, "tlb_mops_best", 1e3 / wall[0], "Mops/s");
    result(SC, "tlb_ns_per_op", wall_med, "ns");
    double cpu_med = median_doubles(cpu, TLB_PASSES);
    result(SC, "tlb_cpu_ns_per_op", cpu_med, "ns");
    result(SC, "tlb_cpu_mops", 1e3 / cpu_med, "Mops/s");
    struct anon e = read_anon();
    print_anon("after_ops", e);
}
/* ---- main ----------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: thp --mode coverage [--quick] [--heap-mib N] [--rounds N] [--idle-ms N]\n"
            "                          [--min-bytes N] [--max-bytes N]\n"
            "       thp --mode tlb [--quick] [--heap-mib N] [--ops N] [--chains N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *mode = NULL;
    uint64_t heap = 0, rounds = UINT64_MAX, idle = UINT64_MAX, ops = 0, chains = 4;
    uint64_t min_bytes = 64, max_bytes = 4096;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            cfg.quick = 1;
        } else if (!arg_value(argc, argv, &i, "--mode", &mode) &&
                   !arg_u64(argc, argv, &i, "--heap-mib", &heap) &&
                   !arg_u64(argc, argv, &i, "--rounds", &rounds) &&
                   !arg_u64(argc, argv, &i, "--idle-ms", &idle) &&
                   !arg_u64(argc, argv, &i, "--ops", &ops) &&
                   !arg_u64(argc, argv, &i, "--chains", &chains) &&
                   !arg_u64(argc, argv, &i, "--min-bytes", &min_bytes) &&
                   !arg_u64(argc, argv, &i, "--max-bytes", &max_bytes)) {
            usage();
        }
    }
    int coverage = mode && strcmp(mode, "coverage") == 0;
    if (!coverage && !(mode && strcmp(mode, "tlb") == 0)) usage();
    cfg.heap_mib = heap ? heap : coverage ? (cfg.quick ? 64 : 512) : (cfg.quick ? 128 : 2048);
    cfg.rounds = rounds != UINT64_MAX ? rounds : cfg.quick ? 3 : 10;
    cfg.idle_ms = idle != UINT64_MAX ? idle : 1200;
    cfg.ops = ops ? ops : cfg.quick ? 2000000 : 20000000;
    cfg.chains = chains;
    if (cfg.rounds > MAX_ROUNDS || cfg.chains < 1 || cfg.chains > MAX_CHAINS) usage();
    if (min_bytes < 1 || min_bytes > max_bytes || max_bytes > (64u << 20)) usage();
    cfg.min_bytes = (uint32_t)min_bytes;
    cfg.max_bytes = (uint32_t)max_bytes;

    bench_check_preload(SC);
    print_sys_file("thp_enabled", "/sys/kernel/mm/transparent_hugepage/enabled");
    print_sys_file("thp_defrag", "/sys/kernel/mm/transparent_hugepage/defrag");
    print_sys_file("thp_khugepaged_defrag",
                   "/sys/kernel/mm/transparent_hugepage/khugepaged/defrag");
    const char *tunables = getenv("GLIBC_TUNABLES");
    if (tunables && *tunables) printf("INFO %s glibc_tunables %s\n", SC, tunables);
    if (coverage)
        run_coverage();
    else
        run_tlb();
    print_lull_config();
    return 0;
}
