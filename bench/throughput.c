/*
 * throughput.c: malloc/free throughput of small blocks, in ops/s.
 *
 * Modes (one per process, --mode NAME; run.sh runs each in its own process
 * so that one mode's heap state does not leak into the next):
 *   st        one thread, a working set of N live objects, each op frees a
 *             random one and allocates a replacement (one malloc+free pair);
 *   mt        the same on two threads at once, each with its own objects;
 *   prodcons  thread A allocates and hands blocks over a ring, thread B
 *             frees them: every free is a remote free (ops = blocks, a
 *             quarter of --ops);
 *   larson    larson-like server: two chains of threads, each thread does a
 *             round of random replacements in an inherited array of objects
 *             then starts its successor and exits, so that blocks are freed
 *             by a later thread than the one that allocated them.
 *
 * Sizes are 16-1024 B, skewed to small ones as in servers:
 *   40 % 16-64, 25 % 65-128, 20 % 129-256, 10 % 257-512, 5 % 513-1024.
 *
 * st and mt also report the process's CPU time per op (all its threads, the
 * allocator's own included): unlike the rate, it does not grow while the
 * threads wait for a CPU on a busy machine.
 */
#include "bench_common.h"

#include <pthread.h>
#include <sched.h>
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
    uint64_t live;
    uint64_t larson_rounds;
};

static struct config cfg = {.ops = 10000000, .live = 10000, .larson_rounds = 100};

/* ---- st / mt ---------------------------------------------------------- */

struct worker {
    pthread_t th;
    uint64_t seed;
    uint64_t ops;
};

static void *replace_worker(void *arg) {
    struct worker *w = arg;
    uint64_t rng = w->seed;
    size_t n = cfg.live;
    void **slots = xmalloc(n * sizeof *slots);
    for (size_t i = 0; i < n; i++)
        slots[i] = xmalloc(pick_size(&rng));
    for (uint64_t i = 0; i < w->ops; i++) {
        size_t s = rng_next(&rng) % n;
        free(slots[s]);
        slots[s] = xmalloc(pick_size(&rng));
    }
    for (size_t i = 0; i < n; i++)
        free(slots[i]);
    free(slots);
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

/* ---- larson-like -------------------------------------------------------- */

struct chain {
    void **slots;
    uint64_t rng;
    uint64_t rounds_left;
    uint64_t ops_per_round;
    uint64_t ops_done;
    _Atomic int done;
};

static void *larson_thread(void *arg) {
    struct chain *c = arg;
    size_t n = cfg.live;
    for (uint64_t i = 0; i < c->ops_per_round; i++) {
        size_t s = rng_next(&c->rng) % n;
        free(c->slots[s]);
        /* larson draws sizes uniformly from its range */
        c->slots[s] = xmalloc(16 + rng_next(&c->rng) % 1009);
    }
    c->ops_done += c->ops_per_round;
    if (--c->rounds_left == 0) {
        atomic_store(&c->done, 1);
        return NULL;
    }
    pthread_t next;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&next, &attr, larson_thread, c) != 0) {
        perror("pthread_create");
        exit(1);
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

static double run_larson(void) {
    struct chain ch[2];
    size_t n = cfg.live;
    for (int k = 0; k < 2; k++) {
        ch[k].rng = 99 + (uint64_t)k;
        ch[k].slots = xmalloc(n * sizeof(void *));
        for (size_t i = 0; i < n; i++)
            ch[k].slots[i] = xmalloc(16 + rng_next(&ch[k].rng) % 1009);
        ch[k].rounds_left = cfg.larson_rounds;
        ch[k].ops_per_round = cfg.ops / cfg.larson_rounds;
        if (!ch[k].ops_per_round) ch[k].ops_per_round = 1;
        ch[k].ops_done = 0;
        atomic_store(&ch[k].done, 0);
    }
    uint64_t t0 = now_ns();
    for (int k = 0; k < 2; k++) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &attr, larson_thread, &ch[k]) != 0) {
            perror("pthread_create");
            exit(1);
        }
        pthread_attr_destroy(&attr);
    }
    while (!atomic_load(&ch[0].done) || !atomic_load(&ch[1].done))
        sleep_ns(100000);
    uint64_t t1 = now_ns();
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < n; i++)
            free(ch[k].slots[i]);
        free(ch[k].slots);
    }
    return (double)(ch[0].ops_done + ch[1].ops_done) / ((double)(t1 - t0) / 1e9);
}

int main(int argc, char **argv) {
    const char *mode = "st";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            quick = 1;
        } else if (!arg_value(argc, argv, &i, "--mode", &mode) &&
                   !arg_u64(argc, argv, &i, "--ops", &cfg.ops) &&
                   !arg_u64(argc, argv, &i, "--live", &cfg.live) &&
                   !arg_u64(argc, argv, &i, "--larson-rounds", &cfg.larson_rounds)) {
            fprintf(stderr, "usage: throughput [--mode st|mt|prodcons|larson] [--quick] [--ops N]\n"
                            "                  [--live N] [--larson-rounds N]\n");
            return 2;
        }
    }
    if (quick) {
        cfg.ops /= 10;
        cfg.larson_rounds /= 4;
    }
    if (!cfg.live || !cfg.larson_rounds) return 2;
    bench_check_preload(SC);
    init_sizes();
    printf("INFO %s config mode=%s ops=%llu live=%llu larson_rounds=%llu\n", SC, mode,
           (unsigned long long)cfg.ops, (unsigned long long)cfg.live,
           (unsigned long long)cfg.larson_rounds);
    fflush(stdout);
    double r, cpu = -1;
    if (strcmp(mode, "st") == 0)
        r = run_replace(1, &cpu);
    else if (strcmp(mode, "mt") == 0)
        r = run_replace(2, &cpu);
    else if (strcmp(mode, "prodcons") == 0)
        r = run_prodcons();
    else if (strcmp(mode, "larson") == 0)
        r = run_larson();
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    char m[64];
    snprintf(m, sizeof m, "%s_mops", mode);
    result(SC, m, r / 1e6, "Mops/s");
    if (cpu >= 0) {
        snprintf(m, sizeof m, "%s_cpu_ns_per_op", mode);
        result(SC, m, cpu, "ns/op");
    }
    return 0;
}
