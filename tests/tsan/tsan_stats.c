/* Statistics read while they change, under ThreadSanitizer: three threads
 * allocate and free (remote frees included) while one thread calls
 * lull_stats() in a loop and another copies snapshots of the counter page
 * (the mapping the reclaim thread publishes to) with
 * lull_counters_snapshot(). Every snapshot and every lull_stats() result
 * must satisfy the accounting identity, overall and per node, and the
 * cumulative counts must never go backwards. */
#include "tsan_common.h"

#include "lull/counters.h"
#include "src/counter_page.h"

#define WORKERS 3
#define OPS 30000
#define LIVE 256

static atomic_bool stop;
static spsc handoff[WORKERS];
static atomic_ulong stats_calls, snapshots;

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 1000;
    if (k < 750) return 8 + (r >> 12) % 1024;
    if (k < 990) return 2 * KiB + (r >> 12) % (200 * KiB);
    if (k < 998) return 1 * MiB + (r >> 12) % (4 * MiB);
    return 17 * MiB + (r >> 12) % (4 * MiB);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    spsc *out = &handoff[id], *in = &handoff[(id + 1) % WORKERS];
    uint64_t rng = mix64((uint64_t)id + 1000);
    tsan_item live[LIVE] = {{0}};
    for (int op = 0; op < OPS; op++) {
        uint64_t r = rng_next(&rng);
        tsan_item *it = &live[r % LIVE];
        if (it->p) {
            CHECK(pat_check(it->p, it->size, it->seed), "block changed");
            /* every fourth block is freed by the next thread */
            if ((r >> 32) % 4 == 0 && spsc_push(out, *it)) {
            } else {
                lull_free(it->p);
            }
            it->p = NULL;
        }
        size_t size = pick_size(rng_next(&rng));
        it->p = lull_malloc(size);
        CHECK(it->p != NULL, "malloc(%zu)", size);
        if (!it->p) continue;
        it->size = size;
        it->seed = rng_next(&rng);
        pat_fill(it->p, size, it->seed);
        tsan_item got;
        while (spsc_pop(in, &got)) {
            CHECK(pat_check(got.p, got.size, got.seed), "handed-over block changed");
            lull_free(got.p);
        }
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].p) lull_free(live[i].p);
    atomic_store_explicit(&out->closed, true, memory_order_release);
    while (!atomic_load_explicit(&in->closed, memory_order_acquire))
        sched_yield();
    tsan_item got;
    while (spsc_pop(in, &got))
        lull_free(got.p);
    return NULL;
}

static void check_counters(const struct lull_counters *c, const char *what) {
    CHECK(lull_counters_accounting_sum(&c->total) == c->total.mapped,
          "%s: identity broken: terms %llu != mapped %llu", what,
          (unsigned long long)lull_counters_accounting_sum(&c->total),
          (unsigned long long)c->total.mapped);
    CHECK(c->node_count >= 1 && c->node_count <= LULL_COUNTERS_MAX_NODES, "%s: node_count %llu",
          what, (unsigned long long)c->node_count);
    for (uint64_t n = 0; n < c->node_count && n < LULL_COUNTERS_MAX_NODES; n++)
        CHECK(lull_counters_accounting_sum(&c->nodes[n].acct) == c->nodes[n].acct.mapped,
              "%s: identity broken on node %llu", what, (unsigned long long)n);
}

/* cumulative counts never decrease between two readings */
typedef struct {
    uint64_t ticks, purged_pages, malloc_count, free_count, huge_unmapped;
} cumulative;

static void check_monotonic(cumulative *last, const struct lull_counters *c, const char *what) {
    cumulative now = {c->reclaim_ticks, c->purged_pages, c->malloc_count, c->free_count,
                      c->huge_unmapped};
    CHECK(now.ticks >= last->ticks, "%s: ticks went back", what);
    CHECK(now.purged_pages >= last->purged_pages, "%s: purged_pages went back", what);
    CHECK(now.malloc_count >= last->malloc_count, "%s: malloc_count went back", what);
    CHECK(now.free_count >= last->free_count, "%s: free_count went back", what);
    CHECK(now.huge_unmapped >= last->huge_unmapped, "%s: huge_unmapped went back", what);
    *last = now;
}

static void *stats_reader(void *arg) {
    (void)arg;
    cumulative last = {0};
    while (!atomic_load(&stop)) {
        struct lull_counters c;
        CHECK(lull_stats(&c) == 0, "lull_stats failed");
        CHECK(c.magic == LULL_COUNTERS_MAGIC, "magic");
        check_counters(&c, "lull_stats");
        check_monotonic(&last, &c, "lull_stats");
        if (atomic_fetch_add(&stats_calls, 1) % 64 == 0) lull_reclaim_now();
        struct timespec t = {0, 50000}; /* leave the two CPUs to the workers too */
        nanosleep(&t, NULL);
    }
    return NULL;
}

static void *page_reader(void *arg) {
    (void)arg;
    cumulative last = {0};
    uint64_t last_seq = 0;
    while (!atomic_load(&stop)) {
        const volatile struct lull_counters *page = counter_page_mapping();
        if (!page) { /* the reclaim thread opens it a second after it starts */
            struct timespec t = {0, 5000000};
            nanosleep(&t, NULL);
            continue;
        }
        CHECK(__atomic_load_n(&page->magic, __ATOMIC_ACQUIRE) == LULL_COUNTERS_MAGIC, "page magic");
        struct lull_counters c;
        int r = lull_counters_snapshot(page, &c);
        if (r == -EAGAIN) continue; /* the writer was busy for 4096 tries */
        CHECK(r == 0, "snapshot: %d", r);
        CHECK(!(c.seq & 1), "odd seq %llu in a snapshot", (unsigned long long)c.seq);
        CHECK(c.seq >= last_seq, "seq went back");
        last_seq = c.seq;
        if (c.seq == 0) continue; /* nothing published yet */
        check_counters(&c, "counter page");
        check_monotonic(&last, &c, "counter page");
        atomic_fetch_add(&snapshots, 1);
        struct timespec t = {0, 20000};
        nanosleep(&t, NULL);
    }
    return NULL;
}

int main(void) {
    lull_set_purge_delay_ms(0);
    pthread_t w[WORKERS], sr, pr;
    start_thread(&sr, stats_reader, NULL);
    start_thread(&pr, page_reader, NULL);
    for (int i = 0; i < WORKERS; i++)
        start_thread(&w[i], worker, (void *)(intptr_t)i);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(w[i], NULL);
    /* the page opens a second after the reclaim thread starts: on a slow
     * machine the workers may be done before it; give it time */
    for (int i = 0; i < 3000 && atomic_load(&snapshots) < 20; i++) {
        struct timespec t = {0, 10000000};
        nanosleep(&t, NULL);
    }
    atomic_store(&stop, true);
    pthread_join(sr, NULL);
    pthread_join(pr, NULL);
    CHECK(atomic_load(&stats_calls) > 0, "no lull_stats call");
    CHECK(atomic_load(&snapshots) > 0, "no snapshot of the counter page (page %s)",
          counter_page_name() ? counter_page_name() : "not open");
    printf("tsan_stats: %lu lull_stats calls, %lu page snapshots\n", atomic_load(&stats_calls),
           atomic_load(&snapshots));
    return tsan_finish("tsan_stats");
}
