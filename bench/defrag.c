/*
 * defrag.c: active defragmentation of a key-value table (issue 15).
 *
 * A table of values of 64..1024 bytes (uniform) is filled to --mib (1024;
 * --quick: 128) MiB, then --delete-pct (75) % of its keys are deleted in a
 * random order. Then an active-defrag loop runs as Redis's does: steps of
 * at most --step-us (1000) us, each followed by --sleep-us (3000) us of
 * rest (Redis's default ceiling is 25 % of a core), each step scanning the
 * table from a cursor in batches of 32 live keys: ask the allocator which
 * values would move to a denser slab or span, and move those. The loop
 * stops when the fragmentation ratio is at most --target (1.10, Redis's
 * active-defrag-threshold-lower) or when a whole pass over the table moved
 * nothing; sampling goes on (no more moves) for up to --settle-s (30;
 * --quick: 10) more seconds or until the ratio reaches the target, since
 * RSS falls only when the allocator gives the emptied memory back.
 *
 * Fragmentation ratio: (RSS - RSS before the fill) / live, live being the
 * usable size of the values still in the table (what Redis's used_memory
 * counts; the requested bytes are reported too). The table's own arrays
 * are mapped and touched before the first RSS reading, so they are not in
 * the difference.
 *
 * The allocator's defrag interface, found with dlsym in whatever is
 * preloaded:
 *   lull      lull_defrag_query() on each batch, lull_defrag_move() on the
 *             values it flags.
 *   jemalloc  mallctl("experimental.utilization.batch_query") on each batch
 *             (nfree, nregs and size of each value's slab) and the bins'
 *             curregs, curslabs and nonfull_slabs, refreshed with "epoch"
 *             at each step (Valkey refreshes them once a cron tick), judged
 *             by Valkey's makeDefragDecision (move if the slab is not full,
 *             the bin has 2 or more non-full slabs, and the slab's use is at
 *             most 1.125 x the average of the non-full slabs); a value moves
 *             as Redis moves it: mallocx(size, MALLOCX_TCACHE_NONE) (plain
 *             malloc if absent), memcpy, dallocx(old, MALLOCX_TCACHE_NONE)
 *             (plain free). background_thread is switched on first, as
 *             Redis does by default (jemalloc-bg-thread yes).
 *   none      neither (or --no-defrag): the same sampling with no moves,
 *             what the allocator gives back by itself.
 *
 * Output: RESULT lines (bench_common.h) and, with --csv, one row per step:
 * t_ms (from the first step), rss_mib, live_mib, ratio, moved_mib, moves,
 * phase (defrag | settle), and for jemalloc active_ratio (stats.active /
 * live, the allocator's own view, which does not wait for the decay).
 * Every value's contents are checked at the end.
 */
#include "bench_common.h"

#include <dlfcn.h>
#include <lull.h> /* lull_defrag_info only: nothing links lull */
#include <malloc.h>
#include <stdbool.h>

#define SC "defrag"
#define BATCH 32
#define MAX_ROWS 200000
#define JE_MAX_BINS 64
#define JE_TCACHE_NONE 256 /* MALLOCX_TCACHE_NONE: MALLOCX_TCACHE(-1) = (-1 + 2) << 8 */

static struct {
    uint64_t mib, seed, delete_pct, min_size, max_size, step_us, sleep_us, max_defrag_s, settle_s;
    double target;
    const char *csv;
    bool no_defrag, quick;
} cfg = {.mib = 1024,
         .seed = 1,
         .delete_pct = 75,
         .min_size = 64,
         .max_size = 1024,
         .step_us = 1000,
         .sleep_us = 3000,
         .max_defrag_s = 300,
         .settle_s = 30,
         .target = 1.10};

/* ---- the table ----------------------------------------------------------- */

static char **values;
static uint16_t *sizes;
static size_t nkeys;
static uint64_t live_usable, live_requested;

/* a value's contents: its key in the first 8 bytes, a byte of it everywhere */
static void fill_value(char *p, size_t key, size_t n) {
    memset(p, (int)(key * 131 & 0xff), n);
    memcpy(p, &key, sizeof key);
}

static bool value_intact(const char *p, size_t key, size_t n) {
    size_t k;
    memcpy(&k, p, sizeof k);
    char c = (char)(key * 131 & 0xff);
    return k == key && p[n / 2] == c && p[n - 1] == c;
}

/* ---- time series ----------------------------------------------------------- */

typedef struct {
    double t_ms, rss_mib, ratio, moved_mib, active_ratio;
    uint64_t moves;
    bool settle;
} row;

static row *rows;
static size_t nrows;
static uint64_t base_rss;

static double ratio_now(uint64_t *rss_out) {
    uint64_t rss = rss_bytes();
    if (rss_out) *rss_out = rss;
    return (double)(rss > base_rss ? rss - base_rss : 0) / (double)live_usable;
}

/* ---- lull ---------------------------------------------------------------- */

typedef int (*lull_query_fn)(const void *const *, size_t, lull_defrag_info *);
typedef void *(*lull_move_fn)(void *);
static lull_query_fn lull_query;
static lull_move_fn lull_move;

/* ---- jemalloc -------------------------------------------------------------- */

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef int (*mallctlnametomib_fn)(const char *, size_t *, size_t *);
typedef int (*mallctlbymib_fn)(const size_t *, size_t, void *, size_t *, void *, size_t);
typedef void *(*mallocx_fn)(size_t, int);
typedef void (*dallocx_fn)(void *, int);

typedef struct {
    size_t mib[8], len;
} je_key;

static struct {
    mallctl_fn ctl;
    mallctlbymib_fn bymib;
    mallocx_fn mallocx;
    dallocx_fn dallocx;
    je_key batch_query, epoch, active;
    unsigned nbins;
    size_t reg_size[JE_MAX_BINS];
    uint32_t nregs[JE_MAX_BINS];
    je_key curregs[JE_MAX_BINS], curslabs[JE_MAX_BINS], nonfull[JE_MAX_BINS];
    size_t cur_regs[JE_MAX_BINS], cur_slabs[JE_MAX_BINS], nonfull_slabs[JE_MAX_BINS];
} je;

static int je_key_init(const char *name, je_key *k) {
    mallctlnametomib_fn tomib = (mallctlnametomib_fn)dlsym(RTLD_DEFAULT, "mallctlnametomib");
    k->len = sizeof k->mib / sizeof k->mib[0];
    return tomib ? tomib(name, k->mib, &k->len) : -1;
}

static size_t je_read(const je_key *k) {
    size_t v = 0, sz = sizeof v;
    je.bymib(k->mib, k->len, &v, &sz, NULL, 0);
    return v;
}

static bool je_init(void) {
    je.ctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    je.bymib = (mallctlbymib_fn)dlsym(RTLD_DEFAULT, "mallctlbymib");
    if (!je.ctl || !je.bymib) return false;
    if (je_key_init("experimental.utilization.batch_query", &je.batch_query) != 0) {
        printf("INFO %s jemalloc has no experimental.utilization.batch_query\n", SC);
        return false;
    }
    je_key_init("epoch", &je.epoch);
    je_key_init("stats.active", &je.active);
    je.mallocx = (mallocx_fn)dlsym(RTLD_DEFAULT, "mallocx");
    je.dallocx = (dallocx_fn)dlsym(RTLD_DEFAULT, "dallocx");
    bool on = true;
    int bg = je.ctl("background_thread", NULL, NULL, &on, sizeof on);
    size_t sz = sizeof je.nbins;
    je.ctl("arenas.nbins", &je.nbins, &sz, NULL, 0);
    if (je.nbins > JE_MAX_BINS) je.nbins = JE_MAX_BINS;
    char name[128];
    for (unsigned j = 0; j < je.nbins; j++) {
        snprintf(name, sizeof name, "arenas.bin.%u.size", j);
        sz = sizeof je.reg_size[j];
        je.ctl(name, &je.reg_size[j], &sz, NULL, 0);
        snprintf(name, sizeof name, "arenas.bin.%u.nregs", j);
        sz = sizeof je.nregs[j];
        je.ctl(name, &je.nregs[j], &sz, NULL, 0);
        /* 4096: MALLCTL_ARENAS_ALL, every arena merged (as Valkey asks) */
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.curregs", j);
        if (je_key_init(name, &je.curregs[j])) return false;
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.curslabs", j);
        if (je_key_init(name, &je.curslabs[j])) return false;
        snprintf(name, sizeof name, "stats.arenas.4096.bins.%u.nonfull_slabs", j);
        if (je_key_init(name, &je.nonfull[j])) return false;
    }
    ssize_t dirty = 0, muzzy = 0;
    sz = sizeof dirty;
    je.ctl("opt.dirty_decay_ms", &dirty, &sz, NULL, 0);
    je.ctl("opt.muzzy_decay_ms", &muzzy, &sz, NULL, 0);
    printf("INFO %s jemalloc bins=%u background_thread=%s dirty_decay_ms=%zd muzzy_decay_ms=%zd "
           "mallocx=%s\n",
           SC, je.nbins, bg == 0 ? "on" : "failed", dirty, muzzy, je.mallocx ? "yes" : "no");
    return true;
}

static void je_refresh(void) {
    uint64_t e = 1;
    size_t sz = sizeof e;
    je.bymib(je.epoch.mib, je.epoch.len, &e, &sz, &e, sz);
    for (unsigned j = 0; j < je.nbins; j++) {
        je.cur_regs[j] = je_read(&je.curregs[j]);
        je.cur_slabs[j] = je_read(&je.curslabs[j]);
        je.nonfull_slabs[j] = je_read(&je.nonfull[j]);
    }
}

static int je_bin_of(size_t reg_size) {
    unsigned lo = 0, hi = je.nbins;
    while (lo < hi) {
        unsigned mid = (lo + hi) / 2;
        if (je.reg_size[mid] < reg_size)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < je.nbins && je.reg_size[lo] == reg_size ? (int)lo : -1;
}

/* Valkey's makeDefragDecision (src/allocator_defrag.c), with 1.125 */
static bool je_should_move(int bin, size_t nalloced) {
    size_t full = je.cur_slabs[bin] - je.nonfull_slabs[bin];
    size_t allocated_nonfull = je.cur_regs[bin] - full * je.nregs[bin];
    if (nalloced == je.nregs[bin] || je.nonfull_slabs[bin] < 2) return false;
    return 1000 * nalloced * je.nonfull_slabs[bin] <= 1125 * allocated_nonfull;
}

static void *je_move(void *p, size_t n) {
    void *q = je.mallocx ? je.mallocx(n, JE_TCACHE_NONE) : malloc(n);
    if (!q) return p;
    memcpy(q, p, n);
    if (je.dallocx)
        je.dallocx(p, JE_TCACHE_NONE);
    else
        free(p);
    return q;
}

/* ---- the defrag loop --------------------------------------------------------- */

enum { MODE_NONE, MODE_LULL, MODE_JEMALLOC };
static int mode;
static uint64_t moved_bytes, moves;

/* One batch of live keys: the allocator flags the ones to move, they move. */
static void defrag_batch(const size_t *keys, unsigned n) {
    const void *ptrs[BATCH] = {0};
    for (unsigned i = 0; i < n; i++)
        ptrs[i] = values[keys[i]];
    bool flag[BATCH] = {0};
    if (mode == MODE_LULL) {
        lull_defrag_info info[BATCH];
        lull_query(ptrs, n, info); /* -1 only for a pointer lull did not hand out */
        for (unsigned i = 0; i < n; i++)
            flag[i] = info[i].moved_would_help;
    } else {
        size_t out[3 * BATCH], out_sz = sizeof(size_t) * 3 * n;
        for (unsigned i = 0; i < 3 * n; i++)
            out[i] = (size_t)-1;
        je.bymib(je.batch_query.mib, je.batch_query.len, out, &out_sz, ptrs, sizeof(void *) * n);
        for (unsigned i = 0; i < n; i++) {
            size_t nfree = out[3 * i], nregs = out[3 * i + 1], len = out[3 * i + 2];
            if (nregs == 0 || nregs == (size_t)-1) continue;
            int bin = je_bin_of(len / nregs);
            flag[i] = bin >= 0 && je_should_move(bin, nregs - nfree);
        }
    }
    for (unsigned i = 0; i < n; i++) {
        if (!flag[i]) continue;
        char *p = values[keys[i]];
        size_t usable = malloc_usable_size(p);
        char *q = mode == MODE_LULL ? lull_move(p) : je_move(p, usable);
        if (q != p) {
            values[keys[i]] = q;
            moved_bytes += usable;
            moves++;
        }
    }
}

static void sample(double t_ms, bool settle) {
    if (nrows >= MAX_ROWS) return;
    uint64_t rss;
    double r = ratio_now(&rss);
    double active = 0;
    if (mode == MODE_JEMALLOC) {
        uint64_t e = 1;
        size_t sz = sizeof e;
        je.bymib(je.epoch.mib, je.epoch.len, &e, &sz, &e, sz);
        active = (double)je_read(&je.active) / (double)live_usable;
    }
    rows[nrows++] = (row){.t_ms = t_ms,
                          .rss_mib = (double)rss / BENCH_MIB,
                          .ratio = r,
                          .moved_mib = (double)moved_bytes / BENCH_MIB,
                          .active_ratio = active,
                          .moves = moves,
                          .settle = settle};
}

static void run_loop(void) {
    uint64_t t0 = now_ns(), step_ns = cfg.step_us * 1000;
    size_t cursor = 0, pass_moves_at = 0;
    uint64_t passes = 0, steps = 0, busy_ns = 0;
    double reached_ms = -1, reached_moved = 0, reached_busy_ms = 0;
    bool converged = mode == MODE_NONE;
    while (!converged && now_ns() - t0 < cfg.max_defrag_s * 1000000000ull) {
        uint64_t s0 = now_ns();
        if (mode == MODE_JEMALLOC) je_refresh();
        do {
            size_t keys[BATCH];
            unsigned n = 0;
            while (n < BATCH && !converged) {
                if (cursor == nkeys) { /* a whole pass: did it move anything? */
                    cursor = 0;
                    passes++;
                    if (moves == pass_moves_at) converged = true;
                    pass_moves_at = moves;
                    continue;
                }
                if (values[cursor]) keys[n++] = cursor;
                cursor++;
            }
            if (n) defrag_batch(keys, n);
        } while (!converged && now_ns() - s0 < step_ns);
        uint64_t s1 = now_ns();
        busy_ns += s1 - s0;
        steps++;
        sample((double)(s1 - t0) / 1e6, false);
        if (reached_ms < 0 && rows[nrows - 1].ratio <= cfg.target) {
            reached_ms = rows[nrows - 1].t_ms;
            reached_moved = (double)moved_bytes / BENCH_MIB;
            reached_busy_ms = (double)busy_ns / 1e6;
            break; /* below the threshold: Redis stops defragmenting */
        }
        sleep_ns(cfg.sleep_us * 1000);
    }
    double defrag_end_ms = (double)(now_ns() - t0) / 1e6;
    double moved_at_end = (double)moved_bytes / BENCH_MIB;
    /* the allocator gives memory back on its own clock: sample on */
    uint64_t settle_end = now_ns() + cfg.settle_s * 1000000000ull;
    while (reached_ms < 0 && now_ns() < settle_end) {
        sleep_ms(10);
        sample((double)(now_ns() - t0) / 1e6, true);
        if (rows[nrows - 1].ratio <= cfg.target) {
            reached_ms = rows[nrows - 1].t_ms;
            reached_moved = moved_at_end;
            reached_busy_ms = (double)busy_ns / 1e6;
        }
    }
    result(SC, "defrag_steps", (double)steps, "steps");
    result(SC, "defrag_passes", (double)passes, "passes");
    result(SC, "defrag_time_ms", defrag_end_ms, "ms");
    result(SC, "defrag_cpu_ms", (double)busy_ns / 1e6, "ms");
    result(SC, "moved_mib", moved_at_end, "MiB");
    result(SC, "moved_pct_of_live", 100.0 * (double)moved_bytes / (double)live_usable, "%");
    result(SC, "moves", (double)moves, "blocks");
    result(SC, "final_ratio", rows[nrows - 1].ratio, "x");
    result(SC, "final_rss_mib", rows[nrows - 1].rss_mib, "MiB");
    /* the figures at the target only when it was reached (report.py then
     * says "not measured", not a time of -1) */
    result(SC, "target_reached", reached_ms >= 0, "bool");
    if (reached_ms >= 0) {
        result(SC, "time_to_target_ms", reached_ms, "ms");
        result(SC, "defrag_cpu_to_target_ms", reached_busy_ms, "ms");
        result(SC, "moved_to_target_mib", reached_moved, "MiB");
    }
}

static void write_csv(void) {
    if (!cfg.csv) return;
    FILE *f = fopen(cfg.csv, "w");
    if (!f) {
        printf("ERROR %s cannot write %s\n", SC, cfg.csv);
        return;
    }
    fprintf(f, "t_ms,rss_mib,live_mib,ratio,moved_mib,moves,phase,active_ratio\n");
    for (size_t i = 0; i < nrows; i++)
        fprintf(f, "%.3f,%.2f,%.2f,%.4f,%.2f,%llu,%s,%.4f\n", rows[i].t_ms, rows[i].rss_mib,
                (double)live_usable / BENCH_MIB, rows[i].ratio, rows[i].moved_mib,
                (unsigned long long)rows[i].moves, rows[i].settle ? "settle" : "defrag",
                rows[i].active_ratio);
    fclose(f);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--quick") == 0) {
            cfg.quick = true;
            cfg.mib = 128;
            cfg.settle_s = 10;
        } else if (strcmp(argv[i], "--no-defrag") == 0)
            cfg.no_defrag = true;
        else if (arg_value(argc, argv, &i, "--mib", &v))
            cfg.mib = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--seed", &v))
            cfg.seed = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--delete-pct", &v))
            cfg.delete_pct = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--step-us", &v))
            cfg.step_us = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--sleep-us", &v))
            cfg.sleep_us = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--max-defrag-s", &v))
            cfg.max_defrag_s = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--settle-s", &v))
            cfg.settle_s = strtoull(v, NULL, 10);
        else if (arg_value(argc, argv, &i, "--target", &v))
            cfg.target = strtod(v, NULL);
        else if (arg_value(argc, argv, &i, "--csv", &v))
            cfg.csv = v;
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--mib N] [--seed N] [--delete-pct P] [--step-us N] "
                    "[--sleep-us N] [--max-defrag-s N] [--settle-s N] [--target R] [--csv PATH] "
                    "[--no-defrag]\n",
                    argv[0]);
            return 2;
        }
    }
    bench_check_preload(SC);
    lull_query = (lull_query_fn)dlsym(RTLD_DEFAULT, "lull_defrag_query");
    lull_move = (lull_move_fn)dlsym(RTLD_DEFAULT, "lull_defrag_move");
    if (cfg.no_defrag)
        mode = MODE_NONE;
    else if (lull_query && lull_move)
        mode = MODE_LULL;
    else if (je_init())
        mode = MODE_JEMALLOC;
    static const char *const names[] = {"none", "lull", "jemalloc"};
    printf("INFO %s interface %s\n", SC, names[mode]);

    /* the most keys the size fits (mean size (min + max) / 2), mapped and
     * touched before the first RSS reading */
    uint64_t total = cfg.mib << 20;
    size_t cap = (size_t)(total / ((cfg.min_size + cfg.max_size) / 2) * 11 / 10 + 1024);
    values = map_array(cap * sizeof *values);
    sizes = map_array(cap * sizeof *sizes);
    uint32_t *order = map_array(cap * sizeof *order);
    touch_pages(values, cap * sizeof *values);
    touch_pages(sizes, cap * sizeof *sizes);
    touch_pages(order, cap * sizeof *order);
    rows = map_array(MAX_ROWS * sizeof *rows);
    touch_pages(rows, MAX_ROWS * sizeof *rows);
    base_rss = rss_bytes();

    uint64_t rng = cfg.seed * 0x9e3779b97f4a7c15ull + 1, filled = 0;
    uint64_t t_fill = now_ns();
    while (filled < total && nkeys < cap) {
        size_t n = cfg.min_size + rng_next(&rng) % (cfg.max_size - cfg.min_size + 1);
        char *p = malloc(n);
        if (!p) {
            printf("ERROR %s malloc(%zu) failed after %zu keys\n", SC, n, nkeys);
            return 1;
        }
        fill_value(p, nkeys, n);
        values[nkeys] = p;
        sizes[nkeys] = (uint16_t)n;
        order[nkeys] = (uint32_t)nkeys;
        nkeys++;
        filled += n;
    }
    uint64_t rss_full = rss_bytes();
    shuffle_u32(order, nkeys, &rng);
    size_t ndel = nkeys * cfg.delete_pct / 100;
    for (size_t i = 0; i < ndel; i++) {
        free(values[order[i]]);
        values[order[i]] = NULL;
    }
    for (size_t k = 0; k < nkeys; k++)
        if (values[k]) {
            live_usable += malloc_usable_size(values[k]);
            live_requested += sizes[k];
        }
    printf("INFO %s config mib=%llu keys=%zu deleted=%zu sizes=%llu-%llu step_us=%llu "
           "sleep_us=%llu target=%.2f fill_s=%.1f\n",
           SC, (unsigned long long)cfg.mib, nkeys, ndel, (unsigned long long)cfg.min_size,
           (unsigned long long)cfg.max_size, (unsigned long long)cfg.step_us,
           (unsigned long long)cfg.sleep_us, cfg.target, (double)(now_ns() - t_fill) / 1e9);
    result(SC, "keys", (double)nkeys, "keys");
    result(SC, "live_mib", (double)live_usable / BENCH_MIB, "MiB");
    result(SC, "live_requested_mib", (double)live_requested / BENCH_MIB, "MiB");
    result(SC, "ratio_full", (double)(rss_full - base_rss) / (double)filled, "x");
    result(SC, "ratio_after_delete", ratio_now(NULL), "x");

    run_loop();

    size_t bad = 0;
    for (size_t k = 0; k < nkeys; k++)
        if (values[k] && !value_intact(values[k], k, sizes[k])) bad++;
    if (bad) printf("ERROR %s %zu values lost their contents\n", SC, bad);
    result(SC, "ratio_over_requested",
           rows[nrows - 1].ratio * (double)live_usable / (double)live_requested, "x");
    write_csv();
    fflush(stdout);
    return bad ? 1 : 0;
}
