/*
 * footprint.c: how much memory an allocator keeps, at its peak and once the
 * program has freed what it no longer needs and gone idle.
 *
 *   bench_footprint --scenario NAME [--quick] [--long-idle-ms N]
 *   bench_footprint --list          (the scenario names, one a line)
 *
 * One scenario per process (run.sh starts one for each), so that neither the
 * heap nor the peak of one scenario carries into the next. A scenario sets up
 * the benchmark's own arrays first (mmap, not the allocator under test, and
 * touched in advance, so that they weigh the same in every figure of every
 * allocator), then runs its measured part: the workload and the frees that
 * end it, leaving the live set the scenario keeps. Then the process idles.
 *
 * Metrics, each "RESULT footprint <scenario>_<metric> <value> <unit>":
 *   peak_rss_mib       VmHWM at the end of the measured part. The high-water
 *                      mark is reset at its start by writing 5 to
 *                      /proc/self/clear_refs; INFO peak_reset says whether
 *                      that worked (if not, this is the process's peak);
 *   rss_idle_mib       RSS 1.2 s after the measured part;
 *   rss_idle_long_mib  RSS 10 s after it (--quick: 2 s), only where page
 *                      return is the point (redis_delete, survivors_*);
 *   live_mib           the bytes the program holds at the end (the sizes it
 *                      asked malloc for);
 *   idle_rss_per_live  RSS after the (long) idle over live, when live is at
 *                      least 1 MiB;
 *   time_s             wall clock of the measured part (CLOCK_MONOTONIC);
 *   returnable_mib     survivors_*: the bytes of the 4 KiB pages that the
 *                      blocks allocated at the peak overlapped and that no
 *                      surviving block overlaps: what an allocator could give
 *                      back without moving anything;
 *   returned_pct       survivors_*: (peak RSS - RSS after the long idle) /
 *                      returnable, clipped to 0-100.
 * Every RSS figure includes the program, its own arrays and the allocator's
 * metadata; INFO base_rss_mib is the RSS when the measured part starts.
 *
 * Scenarios (sizes drawn uniformly; fixed seeds, so every allocator gets the
 * same requests; first and last byte of every block written, and one byte in
 * every page of it, as a user of the block would):
 *   short_threads    2,000 threads, at most 4 alive; each allocates 100
 *                    blocks of 16-512 B, frees 92 and hands 8 to the next
 *                    thread, which frees them: per-thread caches and arenas
 *                    that outlive their thread;
 *   pool_prodcons    2 producer and 2 consumer threads, a bounded ring of
 *                    batches; 2 M blocks of 16-1024 B; each consumer keeps the
 *                    last 16,384 it received and frees the oldest: every free
 *                    is remote;
 *   pool_larson      4 threads pass 5 arrays of 10,000 slots (16-1024 B)
 *                    around through a FIFO, a pass makes 10,000 replacements
 *                    of random slots; 4 M replacements; at the end the main
 *                    thread frees all arrays but one;
 *   small_single     one thread, 4 rounds: build a hash table of 500,000
 *                    nodes of 16-256 B, look each up, tear it down in bucket
 *                    order keeping one node in 64 (a small live set that
 *                    pins pages across rounds);
 *   large_blocks     64 KiB-5 MiB blocks, a live set of ~256 MiB, 1,000 random
 *                    replacements, then half of the slots freed;
 *   redis_delete     a key space of ~1 GiB of 64-1024 B values (each key an
 *                    entry, a key string and a value, as Redis allocates
 *                    them), 75 % of the keys deleted at random;
 *   survivors_small  ~256 MiB of 16-1024 B blocks, 19 of 20 freed at random;
 *   survivors_mid    ~256 MiB of 4-32 KiB blocks, 3 of 4 freed at random;
 *   huge_blocks      4 blocks of 20-64 MiB, 24 replacements, each block
 *                    touched in full; at the end all but one freed.
 * --quick shrinks the sizes and counts (CI smoke) and the long idle to 2 s.
 */
#include "bench_common.h"
#include "lull/counters.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#define SC "footprint"
#define SHORT_IDLE_MS 1200
#define KIB 1024u
#define MIB (1024u * 1024u)

static struct {
    int quick;
    uint64_t long_idle_ms;
} cfg = {.long_idle_ms = 10000};

/* ---- small helpers --------------------------------------------------------- */

static uint32_t uniform(uint64_t *rng, uint32_t lo, uint32_t hi) {
    return lo + (uint32_t)(rng_next(rng) % (hi - lo + 1));
}

/* malloc that exits on failure and writes every page of the block (first and
 * last byte included): untouched memory would not show in RSS. */
static void *alloc_touched(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "malloc(%zu) failed\n", n);
        exit(1);
    }
    touch_pages(p, n);
    return p;
}

static uint64_t own_bytes; /* the benchmark's own arrays, for INFO */

/* An array of the benchmark's own, outside the allocator, resident from the
 * start: it then adds the same to every RSS figure of every allocator. */
static void *own_array(size_t bytes) {
    void *p = map_array(bytes);
    touch_pages(p, bytes);
    own_bytes += bytes;
    return p;
}

/* A random order of 0..n-1 in an array of the benchmark's own. */
static uint32_t *random_order(size_t n, uint64_t seed) {
    uint32_t *order = own_array(n * sizeof *order);
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    shuffle_u32(order, n, &seed);
    return order;
}

static void start_thread(pthread_t *th, void *(*fn)(void *), void *arg) {
    if (pthread_create(th, NULL, fn, arg) != 0) {
        perror("pthread_create");
        exit(1);
    }
}

/* Resets VmHWM to the current RSS; 1 if the kernel took it. */
static int reset_peak_rss(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int ok = write(fd, "5", 1) == 1;
    close(fd);
    return ok;
}

/* ---- the measured part ------------------------------------------------------ */

static struct {
    uint64_t t0, t1;
    int peak_reset;
    double base_rss_mib, end_rss_mib, peak_rss_mib;
    uint64_t live_bytes;
} meas;

/* ---- where lull's memory is (only when lull is the allocator) ------------- */

/* lull's own accounting (include/lull/counters.h), sampled every few ms
 * through the measured part by a thread that allocates nothing: the sample
 * with the most resident bytes (mapped - purged) is printed as INFO
 * footprint lull_at_peak, and one more after the idle, so that each
 * scenario's peak can be split into live blocks, size-class rounding, free
 * blocks inside spans, free slices not yet purged, the warm reserve,
 * metadata and the huge cache (issue 14, item 6). */
typedef int (*lull_stats_fn)(struct lull_counters *);
static struct {
    lull_stats_fn stats;
    pthread_t thread;
    _Atomic int stop;
    struct lull_counters now, peak;
} lullacct;

static double acct_resident(const struct lull_counters *c) {
    return (double)(c->total.mapped - c->total.purged);
}

static void acct_print(const char *when, const struct lull_counters *c) {
    const struct lull_counters_accounting *t = &c->total;
    uint64_t huge_cache = 0;
    for (uint64_t i = 0; i < c->node_count && i < LULL_COUNTERS_MAX_NODES; i++)
        huge_cache += c->nodes[i].huge_cache_bytes;
    printf("INFO %s lull_%s resident_mib %.1f live %.1f rounding %.1f span_free %.1f dirty %.1f "
           "purging %.1f warm %.1f metadata %.1f huge_cache %.1f\n",
           SC, when, acct_resident(c) / BENCH_MIB, (double)t->live / BENCH_MIB,
           (double)t->rounding / BENCH_MIB, (double)t->span_free / BENCH_MIB,
           (double)t->dirty / BENCH_MIB, (double)t->purging / BENCH_MIB,
           (double)t->warm / BENCH_MIB, (double)t->metadata / BENCH_MIB,
           (double)huge_cache / BENCH_MIB);
}

static void *acct_sampler(void *arg) {
    (void)arg;
    while (!atomic_load(&lullacct.stop)) {
        if (lullacct.stats(&lullacct.now) == 0 && acct_resident(&lullacct.now) > acct_resident(&lullacct.peak))
            lullacct.peak = lullacct.now;
        sleep_ms(5);
    }
    return NULL;
}

static void acct_start(void) {
    lullacct.stats = (lull_stats_fn)dlsym(RTLD_DEFAULT, "lull_stats");
    if (!lullacct.stats) return;
    memset(&lullacct.peak, 0, sizeof lullacct.peak);
    atomic_store(&lullacct.stop, 0);
    if (pthread_create(&lullacct.thread, NULL, acct_sampler, NULL) != 0) lullacct.stats = NULL;
}

static void acct_stop(void) {
    if (!lullacct.stats) return;
    atomic_store(&lullacct.stop, 1);
    pthread_join(lullacct.thread, NULL);
    acct_print("at_peak", &lullacct.peak);
}

static void acct_after_idle(void) {
    if (lullacct.stats && lullacct.stats(&lullacct.now) == 0) acct_print("after_idle", &lullacct.now);
}

/* Called by each scenario once its own arrays are ready. */
static void measure_begin(void) {
    acct_start();
    meas.peak_reset = reset_peak_rss();
    meas.base_rss_mib = rss_mib();
    meas.t0 = now_ns();
}

/* Called after the frees that end the workload; live_bytes: what it keeps. */
static void measure_end(uint64_t live_bytes) {
    meas.t1 = now_ns();
    acct_stop();
    double hwm_kib = status_field("VmHWM:");
    meas.peak_rss_mib = hwm_kib < 0 ? peak_rss_mib() : hwm_kib / 1024.0;
    meas.end_rss_mib = rss_mib();
    meas.live_bytes = live_bytes;
}

/* RSS once ms have passed since the end of the measured part. */
static double rss_after_idle(uint64_t ms) {
    uint64_t due = meas.t1 + ms * 1000000ull, now = now_ns();
    if (now < due) sleep_ns(due - now);
    return rss_mib();
}

/* ---- short_threads ---------------------------------------------------------- */

#define ST_ALIVE 4
#define ST_BLOCKS 100
#define ST_KEEP 8

/* The blocks the last thread left for the next one. */
static struct {
    pthread_mutex_t mu;
    void *p[ST_KEEP];
    uint32_t size[ST_KEEP];
} handoff = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *short_thread(void *arg) {
    uint64_t rng = 1000 + (uintptr_t)arg;
    void *p[ST_BLOCKS];
    uint32_t size[ST_BLOCKS];
    for (int i = 0; i < ST_BLOCKS; i++) {
        size[i] = uniform(&rng, 16, 512);
        p[i] = alloc_touched(size[i]);
    }
    /* free all but the last ST_KEEP, in a random order */
    uint32_t order[ST_BLOCKS - ST_KEEP];
    for (uint32_t i = 0; i < ST_BLOCKS - ST_KEEP; i++)
        order[i] = i;
    shuffle_u32(order, ST_BLOCKS - ST_KEEP, &rng);
    for (int i = 0; i < ST_BLOCKS - ST_KEEP; i++)
        free(p[order[i]]);
    /* swap the kept ones with the previous thread's, then free those */
    void *theirs[ST_KEEP];
    pthread_mutex_lock(&handoff.mu);
    for (int k = 0; k < ST_KEEP; k++) {
        theirs[k] = handoff.p[k];
        handoff.p[k] = p[ST_BLOCKS - ST_KEEP + k];
        handoff.size[k] = size[ST_BLOCKS - ST_KEEP + k];
    }
    pthread_mutex_unlock(&handoff.mu);
    for (int k = 0; k < ST_KEEP; k++)
        free(theirs[k]); /* NULL for the first thread */
    return NULL;
}

static void run_short_threads(void) {
    unsigned threads = cfg.quick ? 200 : 2000;
    pthread_t th[ST_ALIVE];
    printf("INFO %s config threads=%u alive=%d blocks=%d kept=%d sizes=16-512\n", SC, threads,
           ST_ALIVE, ST_BLOCKS, ST_KEEP);
    measure_begin();
    for (unsigned i = 0; i < threads; i++) {
        /* at most ST_ALIVE at once: thread i takes the place of i - ST_ALIVE */
        if (i >= ST_ALIVE) pthread_join(th[i % ST_ALIVE], NULL);
        start_thread(&th[i % ST_ALIVE], short_thread, (void *)(uintptr_t)i);
    }
    for (unsigned i = threads > ST_ALIVE ? threads - ST_ALIVE : 0; i < threads; i++)
        pthread_join(th[i % ST_ALIVE], NULL);
    uint64_t live = 0;
    for (int k = 0; k < ST_KEEP; k++)
        live += handoff.size[k];
    measure_end(live);
}

/* ---- pool_prodcons ---------------------------------------------------------- */

#define PC_PRODUCERS 2
#define PC_CONSUMERS 2
#define PC_BATCH 64
#define PC_RING 64 /* batches in flight at most */
#define PC_WINDOW 16384

struct pc_batch {
    void *p[PC_BATCH];
    uint32_t size[PC_BATCH];
};

/* A bounded ring of batches (one lock per 64 blocks: the hand-off is not
 * what is measured here). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t not_full, not_empty;
    struct pc_batch ring[PC_RING];
    unsigned head, len, producers_left;
    uint64_t blocks_per_producer;
} pc = {.mu = PTHREAD_MUTEX_INITIALIZER,
        .not_full = PTHREAD_COND_INITIALIZER,
        .not_empty = PTHREAD_COND_INITIALIZER};

/* A consumer keeps the last PC_WINDOW blocks it received, as a cache would. */
struct pc_consumer {
    pthread_t th;
    void **window;
    uint32_t *window_size;
    uint64_t received, live;
};

static void pc_push(const struct pc_batch *b) {
    pthread_mutex_lock(&pc.mu);
    while (pc.len == PC_RING)
        pthread_cond_wait(&pc.not_full, &pc.mu);
    pc.ring[(pc.head + pc.len++) % PC_RING] = *b;
    pthread_cond_signal(&pc.not_empty);
    pthread_mutex_unlock(&pc.mu);
}

/* 0 once the ring is empty and every producer has finished. */
static int pc_pop(struct pc_batch *b) {
    pthread_mutex_lock(&pc.mu);
    while (pc.len == 0 && pc.producers_left > 0)
        pthread_cond_wait(&pc.not_empty, &pc.mu);
    int got = pc.len > 0;
    if (got) {
        *b = pc.ring[pc.head];
        pc.head = (pc.head + 1) % PC_RING;
        pc.len--;
        pthread_cond_signal(&pc.not_full);
    }
    pthread_mutex_unlock(&pc.mu);
    return got;
}

static void pc_producer_done(void) {
    pthread_mutex_lock(&pc.mu);
    pc.producers_left--;
    pthread_cond_broadcast(&pc.not_empty);
    pthread_mutex_unlock(&pc.mu);
}

static void *pc_producer(void *arg) {
    uint64_t rng = 77 + (uintptr_t)arg;
    struct pc_batch b;
    for (uint64_t i = 0; i < pc.blocks_per_producer; i += PC_BATCH) {
        for (int k = 0; k < PC_BATCH; k++) {
            b.size[k] = uniform(&rng, 16, 1024);
            b.p[k] = alloc_touched(b.size[k]);
        }
        pc_push(&b);
    }
    pc_producer_done();
    return NULL;
}

/* Reads the block, keeps it, and frees the oldest one kept once the window
 * is full (a block from a producer thread: a remote free). */
static void pc_keep(struct pc_consumer *c, void *p, uint32_t size) {
    (void)*(volatile char *)p;
    size_t slot = c->received++ % PC_WINDOW;
    if (c->received > PC_WINDOW) {
        free(c->window[slot]);
        c->live -= c->window_size[slot];
    }
    c->window[slot] = p;
    c->window_size[slot] = size;
    c->live += size;
}

static void *pc_consumer(void *arg) {
    struct pc_consumer *c = arg;
    struct pc_batch b;
    while (pc_pop(&b))
        for (int k = 0; k < PC_BATCH; k++)
            pc_keep(c, b.p[k], b.size[k]);
    return NULL;
}

static void run_pool_prodcons(void) {
    uint64_t blocks = cfg.quick ? 200000 : 2000000;
    pc.blocks_per_producer = blocks / PC_PRODUCERS / PC_BATCH * PC_BATCH;
    pc.producers_left = PC_PRODUCERS;
    struct pc_consumer cons[PC_CONSUMERS] = {0};
    for (int i = 0; i < PC_CONSUMERS; i++) {
        cons[i].window = own_array(PC_WINDOW * sizeof(void *));
        cons[i].window_size = own_array(PC_WINDOW * sizeof(uint32_t));
    }
    printf("INFO %s config producers=%d consumers=%d blocks=%llu window=%d ring=%dx%d "
           "sizes=16-1024\n",
           SC, PC_PRODUCERS, PC_CONSUMERS,
           (unsigned long long)(pc.blocks_per_producer * PC_PRODUCERS), PC_WINDOW, PC_RING,
           PC_BATCH);
    measure_begin();
    pthread_t prod[PC_PRODUCERS];
    for (int i = 0; i < PC_CONSUMERS; i++)
        start_thread(&cons[i].th, pc_consumer, &cons[i]);
    for (int i = 0; i < PC_PRODUCERS; i++)
        start_thread(&prod[i], pc_producer, (void *)(uintptr_t)i);
    for (int i = 0; i < PC_PRODUCERS; i++)
        pthread_join(prod[i], NULL);
    uint64_t live = 0;
    for (int i = 0; i < PC_CONSUMERS; i++) {
        pthread_join(cons[i].th, NULL);
        live += cons[i].live;
    }
    measure_end(live);
}

/* ---- pool_larson ------------------------------------------------------------ */

#define LA_THREADS 4
#define LA_ARRAYS (LA_THREADS + 1) /* one more: a thread never waits for one */
#define LA_SLOTS 10000

struct la_slot {
    void *p;
    uint32_t size;
    uint32_t owner; /* the thread that allocated p (0: the main thread) */
};

struct la_array {
    struct la_slot *slots;
    uint64_t rng;
};

static struct {
    pthread_mutex_t mu;
    struct la_array *fifo[LA_ARRAYS];
    unsigned head, len;
} la_queue = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Atomic int64_t la_passes_left;
static _Atomic uint64_t la_frees, la_remote_frees;

static void la_push(struct la_array *a) {
    pthread_mutex_lock(&la_queue.mu);
    la_queue.fifo[(la_queue.head + la_queue.len++) % LA_ARRAYS] = a;
    pthread_mutex_unlock(&la_queue.mu);
}

/* The oldest queued array: with one array more than threads, there is one. */
static struct la_array *la_pop(void) {
    pthread_mutex_lock(&la_queue.mu);
    struct la_array *a = la_queue.fifo[la_queue.head];
    la_queue.head = (la_queue.head + 1) % LA_ARRAYS;
    la_queue.len--;
    pthread_mutex_unlock(&la_queue.mu);
    return a;
}

/* One pass: LA_SLOTS replacements of random slots. */
static void la_pass(struct la_array *a, uint32_t me) {
    uint64_t remote = 0;
    for (int i = 0; i < LA_SLOTS; i++) {
        struct la_slot *s = &a->slots[rng_next(&a->rng) % LA_SLOTS];
        remote += s->owner != me;
        free(s->p);
        s->size = uniform(&a->rng, 16, 1024);
        s->p = alloc_touched(s->size);
        s->owner = me;
    }
    atomic_fetch_add_explicit(&la_frees, LA_SLOTS, memory_order_relaxed);
    atomic_fetch_add_explicit(&la_remote_frees, remote, memory_order_relaxed);
}

static void *la_thread(void *arg) {
    uint32_t me = (uint32_t)(uintptr_t)arg;
    while (atomic_fetch_sub(&la_passes_left, 1) > 0) {
        struct la_array *a = la_pop();
        la_pass(a, me);
        la_push(a);
    }
    return NULL;
}

static void la_fill(struct la_array *a, uint64_t seed) {
    a->rng = seed;
    for (int i = 0; i < LA_SLOTS; i++) {
        a->slots[i].size = uniform(&a->rng, 16, 1024);
        a->slots[i].p = alloc_touched(a->slots[i].size);
        a->slots[i].owner = 0;
    }
}

static uint64_t la_bytes(const struct la_array *a) {
    uint64_t bytes = 0;
    for (int i = 0; i < LA_SLOTS; i++)
        bytes += a->slots[i].size;
    return bytes;
}

static void la_free_all(struct la_array *a) {
    for (int i = 0; i < LA_SLOTS; i++)
        free(a->slots[i].p);
}

static void run_pool_larson(void) {
    uint64_t ops = cfg.quick ? 400000 : 4000000;
    struct la_array arrays[LA_ARRAYS];
    for (int k = 0; k < LA_ARRAYS; k++)
        arrays[k].slots = own_array(LA_SLOTS * sizeof(struct la_slot));
    atomic_store(&la_passes_left, (int64_t)(ops / LA_SLOTS));
    printf("INFO %s config threads=%d arrays=%d slots=%d replacements=%llu sizes=16-1024\n", SC,
           LA_THREADS, LA_ARRAYS, LA_SLOTS, (unsigned long long)(ops / LA_SLOTS * LA_SLOTS));
    measure_begin();
    for (int k = 0; k < LA_ARRAYS; k++) {
        la_fill(&arrays[k], 99 + (uint64_t)k);
        la_push(&arrays[k]);
    }
    pthread_t th[LA_THREADS];
    for (int t = 0; t < LA_THREADS; t++)
        start_thread(&th[t], la_thread, (void *)(uintptr_t)(t + 1));
    for (int t = 0; t < LA_THREADS; t++)
        pthread_join(th[t], NULL);
    /* keep one array, free the others (blocks of threads that have exited) */
    for (int k = 1; k < LA_ARRAYS; k++)
        la_free_all(&arrays[k]);
    measure_end(la_bytes(&arrays[0]));
    uint64_t frees = atomic_load(&la_frees);
    printf("INFO %s remote_free_pct %.1f (frees of a block another thread allocated)\n", SC,
           frees ? 100.0 * (double)atomic_load(&la_remote_frees) / (double)frees : 0.0);
}

/* ---- a chained hash table (small_single, redis_delete) --------------------- */

/* The head of every node: the chain, the key (an id) and the node's size. */
struct link {
    struct link *next;
    uint32_t id;
    uint32_t size;
};

struct table {
    struct link **buckets; /* from malloc, as a program's table would be */
    uint64_t mask;
};

static size_t table_bytes(const struct table *t) {
    return (size_t)(t->mask + 1) * sizeof *t->buckets;
}

static void table_init(struct table *t, size_t expected) {
    size_t n = 1;
    while (n < expected)
        n *= 2;
    t->buckets = calloc(n, sizeof *t->buckets);
    if (!t->buckets) {
        fprintf(stderr, "calloc(%zu) failed\n", n * sizeof *t->buckets);
        exit(1);
    }
    t->mask = n - 1;
}

static struct link **table_bucket(const struct table *t, uint32_t id) {
    uint64_t h = id;
    return &t->buckets[rng_next(&h) & t->mask];
}

static void table_insert(struct table *t, struct link *l) {
    struct link **b = table_bucket(t, l->id);
    l->next = *b;
    *b = l;
}

/* The node of key id, unlinked from the table (NULL if there is none). */
static struct link *table_remove(struct table *t, uint32_t id) {
    for (struct link **pp = table_bucket(t, id); *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            struct link *l = *pp;
            *pp = l->next;
            return l;
        }
    }
    return NULL;
}

static const struct link *table_find(const struct table *t, uint32_t id) {
    const struct link *l = *table_bucket(t, id);
    while (l && l->id != id)
        l = l->next;
    return l;
}

/* ---- small_single ---------------------------------------------------------- */

#define SS_ROUNDS 4
#define SS_KEEP_ONE_IN 64

/* One round: build a table of n nodes of 16-256 B, look each up, tear it
 * down in bucket order (not the order of allocation), moving one node in
 * SS_KEEP_ONE_IN to the survivors. Returns the bytes that survived. */
static uint64_t small_round(uint32_t first_id, uint32_t n, uint64_t *rng, struct link **survivors) {
    struct table t;
    table_init(&t, n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t size = uniform(rng, sizeof(struct link), 256);
        struct link *l = alloc_touched(size);
        l->id = first_id + i;
        l->size = size;
        table_insert(&t, l);
    }
    for (uint32_t i = 0; i < n; i++)
        if (!table_find(&t, first_id + i)) abort();
    uint64_t kept = 0;
    for (uint64_t b = 0; b <= t.mask; b++) {
        for (struct link *l = t.buckets[b], *next; l; l = next) {
            next = l->next;
            if (l->id % SS_KEEP_ONE_IN == 0) {
                l->next = *survivors;
                *survivors = l;
                kept += l->size;
            } else {
                free(l);
            }
        }
    }
    free(t.buckets);
    return kept;
}

static void run_small_single(void) {
    uint32_t n = cfg.quick ? 50000 : 500000;
    printf("INFO %s config rounds=%d nodes_per_round=%u sizes=16-256 keep_one_in=%d\n", SC,
           SS_ROUNDS, n, SS_KEEP_ONE_IN);
    uint64_t rng = 3, live = 0;
    struct link *survivors = NULL;
    measure_begin();
    for (uint32_t r = 0; r < SS_ROUNDS; r++)
        live += small_round(r * n, n, &rng, &survivors);
    measure_end(live);
}

/* ---- large_blocks and huge_blocks: random replacement in a few slots ------- */

struct slots {
    void **p;
    uint32_t *size;
    uint32_t n;
};

static void slots_init(struct slots *s, uint32_t n) {
    s->n = n;
    s->p = own_array(n * sizeof *s->p);
    s->size = own_array(n * sizeof *s->size);
}

/* Fills every slot, makes `replacements` random replacements (each new block
 * touched in full), then frees all but `keep` slots at random. Returns the
 * bytes kept. */
static uint64_t replace_in_slots(struct slots *s, uint32_t lo, uint32_t hi, uint32_t replacements,
                                 uint32_t keep, uint32_t *order, uint64_t seed) {
    uint64_t rng = seed;
    for (uint32_t i = 0; i < s->n; i++) {
        s->size[i] = uniform(&rng, lo, hi);
        s->p[i] = alloc_touched(s->size[i]);
    }
    for (uint32_t r = 0; r < replacements; r++) {
        uint32_t i = (uint32_t)(rng_next(&rng) % s->n);
        free(s->p[i]);
        s->size[i] = uniform(&rng, lo, hi);
        s->p[i] = alloc_touched(s->size[i]);
    }
    uint64_t kept = 0;
    for (uint32_t k = 0; k < s->n; k++) {
        uint32_t i = order[k];
        if (k < s->n - keep)
            free(s->p[i]);
        else
            kept += s->size[i];
    }
    return kept;
}

static void run_large_blocks(void) {
    const uint32_t lo = 64 * KIB, hi = 5 * MIB;
    uint64_t live_target = (cfg.quick ? 32ull : 256ull) * MIB;
    uint32_t n = (uint32_t)(live_target / ((lo + hi) / 2)), reps = cfg.quick ? 100 : 1000;
    struct slots s;
    slots_init(&s, n);
    uint32_t *order = random_order(n, 21);
    printf("INFO %s config slots=%u (~%.0f MiB live) replacements=%u sizes=64KiB-5MiB "
           "kept_at_end=%u\n",
           SC, n, (double)live_target / BENCH_MIB, reps, n / 2);
    measure_begin();
    measure_end(replace_in_slots(&s, lo, hi, reps, n / 2, order, 17));
}

static void run_huge_blocks(void) {
    const uint32_t lo = 20 * MIB, hi = 64 * MIB;
    uint32_t n = cfg.quick ? 2 : 4, reps = cfg.quick ? 6 : 24;
    struct slots s;
    slots_init(&s, n);
    uint32_t *order = random_order(n, 23);
    printf("INFO %s config slots=%u replacements=%u sizes=20-64MiB kept_at_end=1\n", SC, n, reps);
    measure_begin();
    measure_end(replace_in_slots(&s, lo, hi, reps, 1, order, 19));
}

/* ---- redis_delete ---------------------------------------------------------- */

/* A key as Redis allocates one: an entry, a key string, a value. */
struct kv_entry {
    struct link link; /* link.size: the value's size */
    char *key;
    char *value;
};

#define RD_VALUE_MIN 64
#define RD_VALUE_MAX 1024

static uint64_t kv_bytes(const struct kv_entry *e) {
    return sizeof *e + strlen(e->key) + 1 + e->link.size;
}

/* Inserts key id with a value of a random size; returns the bytes that takes. */
static uint64_t kv_insert(struct table *t, uint32_t id, uint64_t *rng) {
    char key[32];
    int len = snprintf(key, sizeof key, "key:%u", id);
    struct kv_entry *e = alloc_touched(sizeof *e);
    e->link.id = id;
    e->link.size = uniform(rng, RD_VALUE_MIN, RD_VALUE_MAX);
    e->key = alloc_touched((size_t)len + 1);
    memcpy(e->key, key, (size_t)len + 1);
    e->value = alloc_touched(e->link.size);
    memset(e->value, 'v', e->link.size); /* a value is written in full */
    table_insert(t, &e->link);
    return kv_bytes(e);
}

/* Deletes key id; returns the bytes that frees. */
static uint64_t kv_delete(struct table *t, uint32_t id) {
    struct kv_entry *e = (struct kv_entry *)table_remove(t, id);
    if (!e) abort();
    uint64_t bytes = kv_bytes(e);
    free(e->key);
    free(e->value);
    free(e);
    return bytes;
}

static void run_redis_delete(void) {
    uint64_t values = (cfg.quick ? 64ull : 1024ull) * MIB;
    uint32_t keys = (uint32_t)(values / ((RD_VALUE_MIN + RD_VALUE_MAX) / 2));
    uint32_t deleted = keys / 4 * 3;
    uint32_t *order = random_order(keys, 31);
    printf("INFO %s config keys=%u values=~%.0f MiB (%d-%d B) deleted=%u (75 %%, at random)\n", SC,
           keys, (double)values / BENCH_MIB, RD_VALUE_MIN, RD_VALUE_MAX, deleted);
    uint64_t rng = 29, held = 0;
    struct table t;
    measure_begin();
    table_init(&t, keys);
    held += table_bytes(&t);
    for (uint32_t id = 0; id < keys; id++)
        held += kv_insert(&t, id, &rng);
    for (uint32_t k = 0; k < deleted; k++)
        held -= kv_delete(&t, order[k]);
    measure_end(held);
}

/* ---- survivors_small, survivors_mid: which pages could go back ------------- */

struct block {
    uintptr_t addr; /* kept after the free too: only its number is used */
    uint32_t size;
    uint32_t live;
};

static struct block *blocks;
static size_t nblocks;

/* Allocates ~total bytes of lo-hi B blocks, then frees all but one in
 * keep_one_in of them, chosen at random. */
static void run_survivors(uint64_t total, uint32_t lo, uint32_t hi, uint32_t keep_one_in) {
    /* the count the total takes, with room for the spread of the sizes */
    size_t cap = (size_t)(total / ((lo + hi) / 2) * 11 / 10) + 1024;
    blocks = own_array(cap * sizeof *blocks);
    uint64_t rng = 5, sum = 0;
    while (sum < total && nblocks < cap) {
        blocks[nblocks].size = uniform(&rng, lo, hi);
        sum += blocks[nblocks++].size;
    }
    uint32_t *order = random_order(nblocks, 7);
    size_t keep = nblocks / keep_one_in;
    printf("INFO %s config blocks=%zu (%.1f MiB) sizes=%u-%u kept=%zu (one in %u, at random)\n", SC,
           nblocks, (double)sum / BENCH_MIB, lo, hi, keep, keep_one_in);
    measure_begin();
    for (size_t i = 0; i < nblocks; i++)
        blocks[i].addr = (uintptr_t)alloc_touched(blocks[i].size);
    uint64_t live = 0;
    for (size_t k = 0; k < nblocks; k++) {
        struct block *b = &blocks[order[k]];
        if (k < nblocks - keep) {
            free((void *)b->addr);
        } else {
            b->live = 1;
            live += b->size;
        }
    }
    measure_end(live);
}

static void run_survivors_small(void) {
    run_survivors((cfg.quick ? 32ull : 256ull) * MIB, 16, 1024, 20);
}

static void run_survivors_mid(void) {
    run_survivors((cfg.quick ? 32ull : 256ull) * MIB, 4 * KIB, 32 * KIB, 4);
}

static uint64_t first_page(const struct block *b) {
    return b->addr / BENCH_PAGE;
}

static uint64_t last_page(const struct block *b) {
    return (b->addr + b->size - 1) / BENCH_PAGE;
}

/* Sorts a[0..n) (LSD radix sort, 16 bits a pass; tmp: n words of scratch). */
static void sort_u64(uint64_t *a, uint64_t *tmp, size_t n) {
    static size_t count[1 << 16];
    uint64_t max = 0;
    for (size_t i = 0; i < n; i++)
        max = a[i] > max ? a[i] : max;
    for (unsigned shift = 0; shift < 64 && (max >> shift) != 0; shift += 16) {
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < n; i++)
            count[(a[i] >> shift) & 0xffff]++;
        for (size_t d = 0, at = 0; d < (1 << 16); d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++)
            tmp[count[(a[i] >> shift) & 0xffff]++] = a[i];
        memcpy(a, tmp, n * sizeof *a);
    }
}

/* The number of distinct 4 KiB pages that the blocks overlap (all of them,
 * or only the live ones); pages and tmp have room for every block's pages. */
static size_t distinct_pages(int live_only, uint64_t *pages, uint64_t *tmp) {
    size_t n = 0;
    for (size_t i = 0; i < nblocks; i++) {
        if (live_only && !blocks[i].live) continue;
        for (uint64_t pg = first_page(&blocks[i]); pg <= last_page(&blocks[i]); pg++)
            pages[n++] = pg;
    }
    sort_u64(pages, tmp, n);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        distinct += i == 0 || pages[i] != pages[i - 1];
    return distinct;
}

/* returnable and returned_pct, from the addresses of the blocks (after the
 * idle: this scratch memory is not in the RSS figures). */
static void report_returnable(const char *name, double peak_mib, double idle_mib) {
    size_t cap = 0;
    for (size_t i = 0; i < nblocks; i++)
        cap += last_page(&blocks[i]) - first_page(&blocks[i]) + 1;
    uint64_t *pages = map_array(cap * sizeof *pages), *tmp = map_array(cap * sizeof *tmp);
    size_t peak_pages = distinct_pages(0, pages, tmp);
    size_t live_pages = distinct_pages(1, pages, tmp);
    munmap(pages, cap * sizeof *pages);
    munmap(tmp, cap * sizeof *tmp);
    double returnable = (double)(peak_pages - live_pages) * BENCH_PAGE / BENCH_MIB;
    double pct = returnable > 0 ? 100.0 * (peak_mib - idle_mib) / returnable : 0;
    printf("INFO %s pages peak=%zu (%.1f MiB) with_live_byte=%zu (%.1f MiB) "
           "returned_unclipped=%.1f %%\n",
           SC, peak_pages, (double)peak_pages * BENCH_PAGE / BENCH_MIB, live_pages,
           (double)live_pages * BENCH_PAGE / BENCH_MIB, pct);
    char m[96];
    snprintf(m, sizeof m, "%s_returnable_mib", name);
    result(SC, m, returnable, "MiB");
    snprintf(m, sizeof m, "%s_returned_pct", name);
    result(SC, m, pct < 0 ? 0 : pct > 100 ? 100 : pct, "%");
}

/* ---- scenarios and main ---------------------------------------------------- */

struct scenario {
    const char *name;
    void (*run)(void);
    int long_idle;  /* page return is the point: the RSS after the long idle too */
    int returnable; /* the returnable pages and the share returned */
};

static const struct scenario scenarios[] = {
    {"short_threads", run_short_threads, 0, 0},     {"pool_prodcons", run_pool_prodcons, 0, 0},
    {"pool_larson", run_pool_larson, 0, 0},         {"small_single", run_small_single, 0, 0},
    {"large_blocks", run_large_blocks, 0, 0},       {"redis_delete", run_redis_delete, 1, 0},
    {"survivors_small", run_survivors_small, 1, 1}, {"survivors_mid", run_survivors_mid, 1, 1},
    {"huge_blocks", run_huge_blocks, 0, 0},
};
#define NSCENARIOS (sizeof scenarios / sizeof scenarios[0])

static void scenario_result(const struct scenario *s, const char *metric, double v,
                            const char *unit) {
    char m[96];
    snprintf(m, sizeof m, "%s_%s", s->name, metric);
    result(SC, m, v, unit);
}

/* The idle that follows the measured part, and every figure. */
static void idle_and_report(const struct scenario *s) {
    printf("INFO %s peak_reset %s\n", SC,
           meas.peak_reset ? "clear_refs (peak of the measured part)"
                           : "unavailable (peak of the whole process)");
    printf("INFO %s base_rss_mib %.1f (own arrays %.1f MiB) end_rss_mib %.1f (right after the "
           "frees)\n",
           SC, meas.base_rss_mib, (double)own_bytes / BENCH_MIB, meas.end_rss_mib);
    printf("INFO %s idle short=%d ms long=%llu ms\n", SC, SHORT_IDLE_MS,
           s->long_idle ? (unsigned long long)cfg.long_idle_ms : 0ull);
    fflush(stdout);
    double idle = rss_after_idle(SHORT_IDLE_MS);
    scenario_result(s, "peak_rss_mib", meas.peak_rss_mib, "MiB");
    scenario_result(s, "rss_idle_mib", idle, "MiB");
    if (s->long_idle) {
        idle = rss_after_idle(cfg.long_idle_ms);
        scenario_result(s, "rss_idle_long_mib", idle, "MiB");
    }
    acct_after_idle();
    double live = (double)meas.live_bytes / BENCH_MIB;
    scenario_result(s, "live_mib", live, "MiB");
    if (live >= 1) scenario_result(s, "idle_rss_per_live", idle / live, "x");
    scenario_result(s, "time_s", (double)(meas.t1 - meas.t0) / 1e9, "s");
    if (s->returnable) report_returnable(s->name, meas.peak_rss_mib, idle);
}

static void usage(void) {
    fprintf(stderr, "usage: footprint --scenario NAME [--quick] [--long-idle-ms N]\n"
                    "       footprint --list\n"
                    "scenarios:");
    for (size_t i = 0; i < NSCENARIOS; i++)
        fprintf(stderr, " %s", scenarios[i].name);
    fprintf(stderr, "\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *name = NULL;
    int long_idle_given = 0;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            cfg.quick = 1;
        } else if (arg_flag(argv, i, "--list")) {
            for (size_t k = 0; k < NSCENARIOS; k++)
                printf("%s\n", scenarios[k].name);
            return 0;
        } else if (arg_u64(argc, argv, &i, "--long-idle-ms", &cfg.long_idle_ms)) {
            long_idle_given = 1;
        } else if (!arg_value(argc, argv, &i, "--scenario", &name)) {
            usage();
        }
    }
    if (cfg.quick && !long_idle_given) cfg.long_idle_ms = 2000;
    if (cfg.long_idle_ms < SHORT_IDLE_MS) usage();
    const struct scenario *s = NULL;
    for (size_t k = 0; name && k < NSCENARIOS; k++)
        if (strcmp(scenarios[k].name, name) == 0) s = &scenarios[k];
    if (!s) usage();
    bench_check_preload(SC);
    printf("INFO %s scenario %s%s\n", SC, s->name, cfg.quick ? " (quick)" : "");
    s->run();
    idle_and_report(s);
    return 0;
}
