/*
 * huge_overload.c: freed huge blocks under overload (issue 13, item 9).
 *
 * --threads (3) request threads run for --seconds (10). Each thread keeps
 * --slots (256) blocks; an operation frees the block of a random slot and
 * allocates a new one there: with probability --huge-ppm per million
 * (5000: 0.5 %) a --huge-mib (20) MiB block whose first and last
 * --touch-kib (4) KiB are written, else a small one (16..1039 bytes, first
 * byte written). So about threads x slots x 0.5 % huge blocks are live at a
 * time (3.8 by default, more at peaks), each freed at a random later time,
 * and the live bytes go up and down as in a server.
 *
 * The main thread samples every --sample-ms (10): RSS (/proc/self/statm),
 * the address space (lull_stats()'s total.mapped when lull is loaded, else
 * VmSize), and the live bytes the workload holds (its own count of what it
 * asked for). It prints the peaks, the goal (RSS at most live
 * + 5 % + 64 MiB, mapped at most 4x live + 1 GiB, live being the peak live
 * bytes) and whether each peak met it, and ops/s. Under lull it also prints
 * the huge allocations that reused a freed mapping and those that mapped
 * one, the huge blocks unmapped and the reclaim ticks (lull_stats()).
 *
 * A run whose address space passes --max-mapped-gib (1024) or whose RSS
 * passes --max-rss-mib (8192) stops early (an allocator that lets freed
 * mappings pile up would otherwise take the machine's memory in page
 * tables), says so in an INFO line, and reports what it reached.
 */
#include "bench_common.h"

#include <dlfcn.h>
#include <lull/counters.h> /* the statistics layout only: nothing links lull */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define SC "huge_overload"
#define MAX_THREADS 64

static struct {
    uint64_t threads, seconds, huge_ppm, huge_mib, touch_kib, slots, sample_ms;
    uint64_t max_mapped_gib, max_rss_mib;
} cfg = {.threads = 3,
         .seconds = 10,
         .huge_ppm = 5000,
         .huge_mib = 20,
         .touch_kib = 4,
         .slots = 256,
         .sample_ms = 10,
         .max_mapped_gib = 1024,
         .max_rss_mib = 8192};

typedef struct {
    _Atomic uint64_t ops, huge_ops; /* written by the owner only */
    _Atomic uint64_t live;          /* bytes this thread holds now */
    uint64_t seed;
    char pad[64];
} worker;

static worker workers[MAX_THREADS];
static atomic_bool stop;

static void touch(char *p, size_t n, size_t touch_bytes) {
    if (touch_bytes > n / 2) touch_bytes = n / 2;
    for (size_t i = 0; i < touch_bytes; i += BENCH_PAGE) {
        p[i] = (char)i;
        p[n - 1 - i] = (char)i;
    }
}

static void *work(void *arg) {
    worker *w = arg;
    uint64_t rng = w->seed;
    void **slot = map_array(cfg.slots * sizeof *slot);
    size_t *slot_size = map_array(cfg.slots * sizeof *slot_size);
    size_t huge = (size_t)cfg.huge_mib << 20, touch_bytes = (size_t)cfg.touch_kib << 10;
    uint64_t live = 0, ops = 0, huge_ops = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int k = 0; k < 64; k++) {
            uint64_t r = rng_next(&rng);
            size_t i = (size_t)(r >> 32) % cfg.slots;
            bool is_huge = r % 1000000 < cfg.huge_ppm;
            size_t n = is_huge ? huge : 16 + (size_t)(r >> 20) % 1024;
            if (slot_size[i] == huge) huge_ops++; /* a huge free */
            free(slot[i]);
            live -= slot_size[i];
            char *p = malloc(n);
            if (!p) {
                printf("ERROR %s malloc(%zu) failed\n", SC, n);
                fflush(stdout);
                exit(1);
            }
            if (is_huge)
                touch(p, n, touch_bytes);
            else
                p[0] = 1;
            slot[i] = p;
            slot_size[i] = n;
            live += n;
            ops++;
            /* the sampler sees a huge block as soon as it is live */
            if (is_huge) atomic_store_explicit(&w->live, live, memory_order_relaxed);
        }
        atomic_store_explicit(&w->ops, ops, memory_order_relaxed);
        atomic_store_explicit(&w->huge_ops, huge_ops, memory_order_relaxed);
        atomic_store_explicit(&w->live, live, memory_order_relaxed);
    }
    for (size_t i = 0; i < cfg.slots; i++)
        free(slot[i]);
    atomic_store_explicit(&w->live, 0, memory_order_relaxed);
    return NULL;
}

typedef int (*lull_stats_fn)(struct lull_counters *);

static uint64_t vm_bytes(void) {
    char buf[256];
    if (read_proc_file("/proc/self/statm", buf, sizeof buf) <= 0) return 0;
    unsigned long long size = 0;
    if (sscanf(buf, "%llu", &size) != 1) return 0;
    return (uint64_t)size * (uint64_t)sysconf(_SC_PAGESIZE);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (arg_u64(argc, argv, &i, "--threads", &cfg.threads) ||
            arg_u64(argc, argv, &i, "--seconds", &cfg.seconds) ||
            arg_u64(argc, argv, &i, "--huge-ppm", &cfg.huge_ppm) ||
            arg_u64(argc, argv, &i, "--huge-mib", &cfg.huge_mib) ||
            arg_u64(argc, argv, &i, "--touch-kib", &cfg.touch_kib) ||
            arg_u64(argc, argv, &i, "--slots", &cfg.slots) ||
            arg_u64(argc, argv, &i, "--sample-ms", &cfg.sample_ms) ||
            arg_u64(argc, argv, &i, "--max-mapped-gib", &cfg.max_mapped_gib) ||
            arg_u64(argc, argv, &i, "--max-rss-mib", &cfg.max_rss_mib))
            continue;
        fprintf(stderr,
                "usage: %s [--threads N] [--seconds S] [--huge-ppm P] [--huge-mib M] "
                "[--touch-kib K] [--slots N] [--sample-ms MS] [--max-mapped-gib G] "
                "[--max-rss-mib M]\n",
                argv[0]);
        return 2;
    }
    if (cfg.threads < 1 || cfg.threads > MAX_THREADS || cfg.slots < 1 || cfg.huge_mib < 17 ||
        cfg.sample_ms < 1) {
        fprintf(stderr, "%s: threads 1..%d, slots >= 1, huge-mib >= 17, sample-ms >= 1\n", argv[0],
                MAX_THREADS);
        return 2;
    }
    bench_check_preload(SC);
    lull_stats_fn lull_stats = (lull_stats_fn)dlsym(RTLD_DEFAULT, "lull_stats");
    static struct lull_counters c; /* not on the stack */
    printf("INFO %s config threads=%llu seconds=%llu huge_ppm=%llu huge_mib=%llu touch_kib=%llu "
           "slots=%llu mapped_from=%s\n",
           SC, (unsigned long long)cfg.threads, (unsigned long long)cfg.seconds,
           (unsigned long long)cfg.huge_ppm, (unsigned long long)cfg.huge_mib,
           (unsigned long long)cfg.touch_kib, (unsigned long long)cfg.slots,
           lull_stats ? "lull_stats" : "VmSize");
    fflush(stdout);

    pthread_t t[MAX_THREADS];
    for (uint64_t i = 0; i < cfg.threads; i++) {
        workers[i].seed = 0x5eed0000u + i * 7919u;
        if (pthread_create(&t[i], NULL, work, &workers[i]) != 0) {
            printf("ERROR %s pthread_create failed\n", SC);
            return 1;
        }
    }
    uint64_t t0 = now_ns(), end = t0 + cfg.seconds * 1000000000ull;
    uint64_t peak_rss = 0, peak_mapped = 0, peak_live = 0, samples = 0;
    const char *stopped = NULL;
    while (now_ns() < end) {
        sleep_ms(cfg.sample_ms);
        uint64_t live = 0;
        for (uint64_t i = 0; i < cfg.threads; i++)
            live += atomic_load_explicit(&workers[i].live, memory_order_relaxed);
        uint64_t rss = rss_bytes();
        uint64_t mapped = lull_stats && lull_stats(&c) == 0 ? c.total.mapped : vm_bytes();
        samples++;
        if (rss > peak_rss) peak_rss = rss;
        if (mapped > peak_mapped) peak_mapped = mapped;
        if (live > peak_live) peak_live = live;
        if (mapped > cfg.max_mapped_gib << 30) stopped = "address space over --max-mapped-gib";
        if (rss > cfg.max_rss_mib << 20) stopped = "RSS over --max-rss-mib";
        if (stopped) break;
    }
    atomic_store(&stop, true);
    double secs = (double)(now_ns() - t0) / 1e9;
    uint64_t ops = 0, huge_ops = 0;
    for (uint64_t i = 0; i < cfg.threads; i++) {
        pthread_join(t[i], NULL);
        ops += atomic_load(&workers[i].ops);
        huge_ops += atomic_load(&workers[i].huge_ops);
    }
    if (stopped) printf("INFO %s stopped_early after %.2f s: %s\n", SC, secs, stopped);
    double live_mib = (double)peak_live / BENCH_MIB;
    double rss_bound = live_mib * 1.05 + 64, mapped_bound = 4 * live_mib + 1024;
    result(SC, "seconds", secs, "s");
    result(SC, "ops_per_s", (double)ops / secs, "ops/s");
    result(SC, "huge_frees_per_s", (double)huge_ops / secs, "frees/s");
    result(SC, "peak_live", live_mib, "MiB");
    result(SC, "peak_rss", (double)peak_rss / BENCH_MIB, "MiB");
    result(SC, "peak_rss_getrusage", peak_rss_mib(), "MiB");
    result(SC, "peak_mapped", (double)peak_mapped / BENCH_MIB, "MiB");
    result(SC, "rss_bound", rss_bound, "MiB");
    result(SC, "mapped_bound", mapped_bound, "MiB");
    result(SC, "rss_within_bound", (double)peak_rss / BENCH_MIB <= rss_bound, "bool");
    result(SC, "mapped_within_bound", (double)peak_mapped / BENCH_MIB <= mapped_bound, "bool");
    result(SC, "samples", (double)samples, "count");
    if (lull_stats && lull_stats(&c) == 0) {
        uint64_t hits = 0, misses = 0;
        for (uint64_t n = 0; n < c.node_count && n < LULL_COUNTERS_MAX_NODES; n++) {
            hits += c.nodes[n].huge_cache_hits;
            misses += c.nodes[n].huge_cache_misses;
        }
        result(SC, "lull_huge_reused", (double)hits, "count");
        result(SC, "lull_huge_mapped_anew", (double)misses, "count");
        result(SC, "lull_huge_unmapped", (double)c.huge_unmapped, "count");
        result(SC, "lull_reclaim_ticks", (double)c.reclaim_ticks, "count");
        result(SC, "lull_mapped_at_end", (double)c.total.mapped / BENCH_MIB, "MiB");
    }
    fflush(stdout);
    return 0;
}
