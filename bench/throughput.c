/*
 * throughput.c: malloc/free throughput of small blocks, in ops/s.
 *
 * Modes (one per process, --mode NAME; run.sh runs each in its own process
 * so that one mode's heap state does not leak into the next):
 *   st           one thread, a working set of N live objects, each op frees
 *                a random one and allocates a replacement (one malloc+free
 *                pair);
 *   mt           the same on two threads at once, each with its own objects;
 *   prodcons     thread A allocates and hands blocks over a ring, thread B
 *                frees them: every free is a remote free (ops = blocks, a
 *                quarter of --ops);
 *   larson       Larson's server simulation: chains of threads, each makes a
 *                pass of random replacements over an array it inherited,
 *                starts its successor on that array and exits, so that most
 *                blocks are freed by another thread than the one that
 *                allocated them;
 *   larson-live  the same, but the threads keep running and pass the arrays
 *                to each other (the allocating thread is alive at the free).
 *
 * st and mt keep --live blocks a thread (10,000: a heap that fits the
 * caches; the suite also runs 300,000, 55 MiB a thread, whose metrics are
 * named st_live300000_...). With --touch (metrics ..._touch_...; st, mt
 * and the larson modes) each block's first word is read before its free,
 * as a destructor or a reference count would: then the free's block is in
 * the cache.
 *
 * st, mt and prodcons draw sizes of 16-1024 B skewed to small ones as in
 * servers: 40 % 16-64, 25 % 65-128, 20 % 129-256, 10 % 257-512, 5 % 513-1024.
 * The larson modes draw them uniformly from --sizes (16-1024; Larson's
 * classic range is 10-100).
 *
 * Every mode reports its peak RSS (ru_maxrss); all but prodcons (whose
 * sides spin while they wait) also the process's CPU time per op (all its
 * threads, the allocator's own included): unlike the rate, it does not grow
 * while the threads wait for a CPU on a busy machine.
 */
#include "bench_common.h"

#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdatomic.h>

#define SC "throughput"
#define SIZE_TABLE 4096

static uint32_t size_table[SIZE_TABLE];

static void init_sizes(void) {
    static const struct {
        uint32_t lo, hi, pct;
    } classes[] = {{16, 64, 40}, {65, 128, 25}, {129, 256, 20}, {257, 512, 10}, {513, 1024, 5}};
    uint64_t rng = 42;
    for (unsigned i = 0; i < SIZE_TABLE; i++) {
        unsigned r = (unsigned)(rng_next(&rng) % 100), acc = 0;
        for (size_t k = 0; k < sizeof classes / sizeof classes[0]; k++) {
            acc += classes[k].pct;
            if (r < acc) {
                size_table[i] = classes[k].lo +
                                (uint32_t)(rng_next(&rng) % (classes[k].hi - classes[k].lo + 1));
                break;
            }
        }
    }
}

static inline size_t pick_size(uint64_t *rng) {
    return size_table[rng_next(rng) & (SIZE_TABLE - 1)];
}

static inline void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "malloc(%zu) failed\n", n);
        exit(1);
    }
    /* Write the first and last word, as a user of the block would. */
    ((volatile char *)p)[0] = 1;
    ((volatile char *)p)[n - 1] = 1;
    return p;
}

struct config {
    uint64_t ops;
    uint64_t live;          /* live objects per thread (st, mt) or per array (larson) */
    uint64_t larson_passes; /* passes over its array a larson thread makes per hand-off */
    uint64_t threads;       /* larson: chains or threads */
    uint32_t min_size, max_size;
    int touch; /* read each block's first word before its free (--touch) */
};

static struct config cfg = {.ops = 10000000,
                            .live = 10000,
                            .larson_passes = 1,
                            .threads = 2,
                            .min_size = 16,
                            .max_size = 1024};

/* ---- st / mt ---------------------------------------------------------- */

struct worker {
    pthread_t th;
    uint64_t seed;
    uint64_t ops;
};

/* what --touch reads, so that the reads are not optimised away */
static _Atomic uint64_t touch_sink;

static void *replace_worker(void *arg) {
    struct worker *w = arg;
    uint64_t rng = w->seed;
    size_t n = cfg.live;
    void **slots = xmalloc(n * sizeof *slots);
    uint64_t touched = 0;
    for (size_t i = 0; i < n; i++)
        slots[i] = xmalloc(pick_size(&rng));
    for (uint64_t i = 0; i < w->ops; i++) {
        size_t s = rng_next(&rng) % n;
        if (cfg.touch) touched += *(volatile uint64_t *)slots[s];
        free(slots[s]);
        slots[s] = xmalloc(pick_size(&rng));
    }
    for (size_t i = 0; i < n; i++)
        free(slots[i]);
    free(slots);
    atomic_fetch_add_explicit(&touch_sink, touched, memory_order_relaxed);
    return NULL;
}

static uint64_t cpu_ns_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ops/s over all threads; *cpu_ns_per_op: process CPU time per op */
static double run_replace(int threads, double *cpu_ns_per_op) {
    struct worker w[2];
    uint64_t c0 = cpu_ns_now();
    uint64_t t0 = now_ns();
    for (int i = 0; i < threads; i++) {
        w[i].seed = 1000 + (uint64_t)i;
        w[i].ops = cfg.ops;
        if (threads == 1) {
            replace_worker(&w[i]);
        } else if (pthread_create(&w[i].th, NULL, replace_worker, &w[i]) != 0) {
            perror("pthread_create");
            exit(1);
        }
    }
    if (threads > 1)
        for (int i = 0; i < threads; i++)
            pthread_join(w[i].th, NULL);
    uint64_t t1 = now_ns();
    *cpu_ns_per_op = (double)(cpu_ns_now() - c0) / ((double)cfg.ops * threads);
    return (double)cfg.ops * threads / ((double)(t1 - t0) / 1e9);
}

/* ---- prodcons ---------------------------------------------------------- */

#define RING 4096
static void *ring[RING];
static uint64_t prodcons_ops;

/* Spin briefly, then yield: on a busy 2-core machine the other side may
 * not be running, and spinning for its whole time slice measures nothing. */
static inline void backoff(unsigned *spins) {
    if (++*spins < 256) {
        __builtin_ia32_pause();
    } else {
        *spins = 0;
        sched_yield();
    }
}
static _Alignas(64) _Atomic uint64_t ring_head; /* written by the producer */
static _Alignas(64) _Atomic uint64_t ring_tail; /* written by the consumer */

static void *producer(void *arg) {
    (void)arg;
    uint64_t rng = 7, head = 0;
    unsigned spins = 0;
    for (uint64_t i = 0; i < prodcons_ops; i++) {
        void *p = xmalloc(pick_size(&rng));
        while (head - atomic_load_explicit(&ring_tail, memory_order_acquire) >= RING)
            backoff(&spins);
        ring[head % RING] = p;
        atomic_store_explicit(&ring_head, ++head, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg) {
    (void)arg;
    uint64_t tail = 0;
    unsigned spins = 0;
    while (tail < prodcons_ops) {
        uint64_t head = atomic_load_explicit(&ring_head, memory_order_acquire);
        if (head == tail) {
            backoff(&spins);
            continue;
        }
        while (tail < head)
            free(ring[tail++ % RING]);
        atomic_store_explicit(&ring_tail, tail, memory_order_release);
    }
    return NULL;
}

static double run_prodcons(void) {
    pthread_t a, b;
    /* a remote free costs more than a local pair: fewer ops */
    prodcons_ops = cfg.ops / 4 ? cfg.ops / 4 : 1;
    uint64_t t0 = now_ns();
    if (pthread_create(&b, NULL, consumer, NULL) || pthread_create(&a, NULL, producer, NULL)) {
        perror("pthread_create");
        exit(1);
    }
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return (double)prodcons_ops / ((double)(now_ns() - t0) / 1e9);
}

/* ---- larson ------------------------------------------------------------ */

/*
 * Larson's server simulation (Larson and Krishnan, "Memory allocation for
 * long-running server applications", ISMM 1998; the larson.cpp of
 * mimalloc-bench): an array of slots holds live blocks; a thread replaces
 * random ones (free the old block, allocate one of a random size) and,
 * after a while, hands the whole array on. Whoever gets the array next frees
 * blocks the previous thread allocated.
 *
 *   larson       Larson's own hand-off: --threads chains; a thread makes
 *                --larson-passes passes over its array, starts its successor
 *                on the same array and exits (thread churn included);
 *   larson-live  the same work on --threads threads that keep running and
 *                pass --threads + 1 arrays around through a FIFO, each taking
 *                the oldest array another thread worked on last (its own
 *                only when no other is queued, so that it never waits): the
 *                thread that allocated a freed block is alive.
 *
 * A pass is --live replacements of random slots, so one pass per hand-off
 * makes ~63 % of the frees remote (the first free of each slot a thread
 * touches); Larson's defaults (100 passes) make ~1 % remote. Each slot
 * records which thread allocated its block, and the mode reports the share of
 * frees made by another thread (larson_remote_free_pct).
 */

struct lslot {
    void *p;
    uint32_t size;
    uint32_t owner; /* the thread that allocated p (0: the main thread) */
};

struct larray {
    struct lslot *slots;
    uint64_t rng;
    uint32_t last; /* the thread that worked on it last (larson-live) */
};

static _Atomic uint32_t larson_next_id = 1;
static _Atomic uint64_t larson_ops, larson_remote;

static inline uint32_t larson_size(uint64_t *rng) {
    return cfg.min_size + (uint32_t)(rng_next(rng) % (cfg.max_size - cfg.min_size + 1));
}

/* One hand-off's work: --larson-passes passes of random replacements. */
static void larson_work(struct larray *a, uint32_t me) {
    uint64_t n = cfg.live, ops = cfg.larson_passes * n, remote = 0, touched = 0;
    for (uint64_t i = 0; i < ops; i++) {
        struct lslot *s = &a->slots[rng_next(&a->rng) % n];
        remote += s->owner != me;
        if (cfg.touch) touched += *(volatile uint64_t *)s->p;
        free(s->p);
        s->size = larson_size(&a->rng);
        s->p = xmalloc(s->size);
        s->owner = me;
    }
    atomic_fetch_add_explicit(&larson_ops, ops, memory_order_relaxed);
    atomic_fetch_add_explicit(&larson_remote, remote, memory_order_relaxed);
    atomic_fetch_add_explicit(&touch_sink, touched, memory_order_relaxed);
}

static void spawn(pthread_t *th, void *(*fn)(void *), void *arg, int detached) {
    pthread_attr_t attr;
    pthread_t tmp;
    pthread_attr_init(&attr);
    if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(th ? th : &tmp, &attr, fn, arg) != 0) {
        perror("pthread_create");
        exit(1);
    }
    pthread_attr_destroy(&attr);
}

/* larson: chains of short-lived threads */

struct chain {
    struct larray a;
    uint64_t handoffs_left;
};

static sem_t larson_chain_done;

static void *larson_chain_thread(void *arg) {
    struct chain *c = arg;
    larson_work(&c->a, atomic_fetch_add(&larson_next_id, 1));
    if (--c->handoffs_left == 0)
        sem_post(&larson_chain_done);
    else
        spawn(NULL, larson_chain_thread, c, 1);
    return NULL;
}

/* larson-live: long-lived threads and a FIFO of arrays (one more than
 * threads, so that a thread never waits for one) */

#define LARSON_MAX_THREADS 64
static struct {
    pthread_mutex_t mu;
    struct larray *fifo[LARSON_MAX_THREADS + 1];
    unsigned head, len;
} larson_q = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Atomic int64_t larson_handoffs_left;

static void larson_q_push(struct larray *a) {
    pthread_mutex_lock(&larson_q.mu);
    larson_q.fifo[(larson_q.head + larson_q.len++) % (LARSON_MAX_THREADS + 1)] = a;
    pthread_mutex_unlock(&larson_q.mu);
}

/* The oldest array that another thread worked on last; the oldest of all if
 * every queued array is the caller's own (the other threads are not
 * running): a thread never waits. */
static struct larray *larson_q_pop(uint32_t me) {
    pthread_mutex_lock(&larson_q.mu);
    unsigned k = 0, cap = LARSON_MAX_THREADS + 1;
    while (k + 1 < larson_q.len && larson_q.fifo[(larson_q.head + k) % cap]->last == me)
        k++;
    struct larray *a = larson_q.fifo[(larson_q.head + k) % cap];
    for (; k > 0; k--) /* close the gap: the older ones move up by one */
        larson_q.fifo[(larson_q.head + k) % cap] = larson_q.fifo[(larson_q.head + k - 1) % cap];
    larson_q.head = (larson_q.head + 1) % cap;
    larson_q.len--;
    pthread_mutex_unlock(&larson_q.mu);
    return a;
}

static void *larson_live_thread(void *arg) {
    (void)arg;
    uint32_t me = atomic_fetch_add(&larson_next_id, 1);
    while (atomic_fetch_sub(&larson_handoffs_left, 1) > 0) {
        struct larray *a = larson_q_pop(me);
        larson_work(a, me);
        a->last = me;
        larson_q_push(a);
    }
    return NULL;
}

/* ops/s; *live_mib: the bytes held by the arrays at the end */
static double run_larson(int live_threads, double *cpu_ns_per_op, double *remote_pct,
                         double *live_mib) {
    unsigned t = (unsigned)cfg.threads, na = live_threads ? t + 1 : t;
    struct chain ch[LARSON_MAX_THREADS + 1];
    uint64_t n = cfg.live;
    /* hand-offs in all: ops / (passes * live), at least one per thread */
    uint64_t handoffs = cfg.ops / (cfg.larson_passes * n);
    if (handoffs < t) handoffs = t;
    for (unsigned k = 0; k < na; k++) {
        ch[k].a.rng = 99 + k;
        ch[k].a.last = 0;
        ch[k].a.slots = map_array(n * sizeof(struct lslot));
        for (uint64_t i = 0; i < n; i++) {
            struct lslot *s = &ch[k].a.slots[i];
            s->size = larson_size(&ch[k].a.rng);
            s->p = xmalloc(s->size);
        }
        ch[k].handoffs_left = handoffs / t;
    }
    sem_init(&larson_chain_done, 0, 0);
    atomic_store(&larson_handoffs_left, (int64_t)handoffs);
    pthread_t th[LARSON_MAX_THREADS];
    uint64_t c0 = cpu_ns_now(), t0 = now_ns();
    if (live_threads) {
        for (unsigned k = 0; k < na; k++)
            larson_q_push(&ch[k].a);
        for (unsigned k = 0; k < t; k++)
            spawn(&th[k], larson_live_thread, NULL, 0);
        for (unsigned k = 0; k < t; k++)
            pthread_join(th[k], NULL);
    } else {
        for (unsigned k = 0; k < t; k++)
            spawn(NULL, larson_chain_thread, &ch[k], 1);
        for (unsigned k = 0; k < t; k++)
            while (sem_wait(&larson_chain_done) != 0) {
            }
    }
    uint64_t t1 = now_ns(), ops = atomic_load(&larson_ops);
    *cpu_ns_per_op = (double)(cpu_ns_now() - c0) / (double)ops;
    *remote_pct = 100.0 * (double)atomic_load(&larson_remote) / (double)ops;
    uint64_t live = 0;
    for (unsigned k = 0; k < na; k++) {
        for (uint64_t i = 0; i < n; i++) {
            live += ch[k].a.slots[i].size;
            free(ch[k].a.slots[i].p);
        }
        munmap(ch[k].a.slots, n * sizeof(struct lslot));
    }
    *live_mib = (double)live / BENCH_MIB;
    return (double)ops / ((double)(t1 - t0) / 1e9);
}

static void usage(void) {
    fprintf(stderr,
            "usage: throughput [--mode st|mt|prodcons|larson|larson-live] [--quick] [--ops N]\n"
            "                  [--live N] [--threads N] [--larson-passes N] [--sizes MIN-MAX]\n"
            "                  [--touch]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *mode = "st", *sizes = NULL;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            quick = 1;
        } else if (arg_flag(argv, i, "--touch")) {
            cfg.touch = 1;
        } else if (!arg_value(argc, argv, &i, "--mode", &mode) &&
                   !arg_value(argc, argv, &i, "--sizes", &sizes) &&
                   !arg_u64(argc, argv, &i, "--ops", &cfg.ops) &&
                   !arg_u64(argc, argv, &i, "--live", &cfg.live) &&
                   !arg_u64(argc, argv, &i, "--threads", &cfg.threads) &&
                   !arg_u64(argc, argv, &i, "--larson-passes", &cfg.larson_passes)) {
            usage();
        }
    }
    if (sizes && (sscanf(sizes, "%u-%u", &cfg.min_size, &cfg.max_size) != 2 || !cfg.min_size ||
                  cfg.min_size > cfg.max_size))
        usage();
    if (quick) cfg.ops /= 10;
    if (!cfg.live || !cfg.larson_passes || !cfg.threads || cfg.threads > LARSON_MAX_THREADS)
        usage();
    bench_check_preload(SC);
    init_sizes();
    printf("INFO %s config mode=%s ops=%llu live=%llu threads=%llu larson_passes=%llu "
           "sizes=%u-%u\n",
           SC, mode, (unsigned long long)cfg.ops, (unsigned long long)cfg.live,
           (unsigned long long)cfg.threads, (unsigned long long)cfg.larson_passes, cfg.min_size,
           cfg.max_size);
    fflush(stdout);
    /* metric prefix: the mode, and the larson settings that differ from the
     * defaults (larson_10_100_mops), so that such runs get rows of their own */
    char pre[64];
    int larson = strncmp(mode, "larson", 6) == 0;
    snprintf(pre, sizeof pre, "%s", mode);
    for (char *c = pre; *c; c++)
        if (*c == '-') *c = '_';
    if (larson && (cfg.min_size != 16 || cfg.max_size != 1024))
        snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "_%u_%u", cfg.min_size, cfg.max_size);
    if (larson && cfg.threads != 2)
        snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "_t%llu",
                 (unsigned long long)cfg.threads);
    /* st and mt with a heap other than the default's 10,000 blocks (the
     * suite's st_live300000: a heap larger than the caches) */
    if (!larson && cfg.live != 10000)
        snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "_live%llu",
                 (unsigned long long)cfg.live);
    if (cfg.touch) snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "_touch");
    if (larson && cfg.larson_passes != 1)
        snprintf(pre + strlen(pre), sizeof pre - strlen(pre), "_p%llu",
                 (unsigned long long)cfg.larson_passes);
    double r, cpu = -1, remote = -1, live = -1;
    if (strcmp(mode, "st") == 0)
        r = run_replace(1, &cpu);
    else if (strcmp(mode, "mt") == 0)
        r = run_replace(2, &cpu);
    else if (strcmp(mode, "prodcons") == 0)
        r = run_prodcons();
    else if (strcmp(mode, "larson") == 0)
        r = run_larson(0, &cpu, &remote, &live);
    else if (strcmp(mode, "larson-live") == 0)
        r = run_larson(1, &cpu, &remote, &live);
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    char m[96];
    snprintf(m, sizeof m, "%s_mops", pre);
    result(SC, m, r / 1e6, "Mops/s");
    if (cpu >= 0) {
        snprintf(m, sizeof m, "%s_cpu_ns_per_op", pre);
        result(SC, m, cpu, "ns/op");
    }
    snprintf(m, sizeof m, "%s_peak_rss_mib", pre);
    result(SC, m, peak_rss_mib(), "MiB");
    if (remote >= 0) {
        snprintf(m, sizeof m, "%s_live_mib", pre);
        result(SC, m, live, "MiB");
        snprintf(m, sizeof m, "%s_remote_free_pct", pre);
        result(SC, m, remote, "%");
    }
    return 0;
}
