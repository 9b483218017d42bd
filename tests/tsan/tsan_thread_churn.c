/* Thread churn under ThreadSanitizer: waves of short-lived threads. Each
 * thread allocates blocks, frees some of them itself, and leaves the rest
 * behind when it exits (its heap is abandoned with live blocks in it). The
 * threads of the next wave adopt the abandoned heaps, and free the blocks
 * the previous wave left (remote frees into abandoned heaps, or local frees
 * into a heap they adopted) after checking their patterns. One thread
 * lives through all the waves, allocating and freeing its own blocks and
 * freeing blocks of threads that died meanwhile. */
#include "tsan_common.h"

#define WAVES 40
#define PER_WAVE 4
#define BLOCKS 256
#define LEFT 128 /* blocks each thread leaves behind */

/* A left-behind block carries its size and pattern seed in its first 16
 * bytes, so a slot is one atomic pointer. */
typedef struct {
    size_t size;
    uint64_t seed;
} orphan_header;

/* orphans[w % 2][thread][i]: stored by the thread of wave w before it
 * exits, taken by a thread of wave w + 1 or by the long-lived thread; all
 * of them are taken before wave w + 2 reuses the slots. */
static _Atomic(void *) orphans[2][PER_WAVE][LEFT];
static atomic_int taken_total, left_total;

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 100;
    if (k < 85) return 16 + (r >> 8) % 600;
    if (k < 99) return 1024 + (r >> 8) % (32 * KiB);
    return 128 * KiB + (r >> 8) % (512 * KiB);
}

static void take_orphans(int parity, int from, uint64_t *rng) {
    for (int i = 0; i < LEFT; i++) {
        void *p = atomic_exchange_explicit(&orphans[parity][from][i], NULL, memory_order_acquire);
        if (!p) continue;
        orphan_header h;
        memcpy(&h, p, sizeof h);
        CHECK(h.size >= sizeof h && h.size < MiB, "orphan %p: header overwritten", p);
        if (h.size < sizeof h || h.size >= MiB) continue;
        CHECK(pat_check((char *)p + sizeof h, h.size - sizeof h, h.seed),
              "orphan %p of %zu bytes corrupted", p, h.size);
        if (rng_next(rng) & 1)
            lull_free(p);
        else
            lull_free_sized(p, h.size);
        atomic_fetch_add(&taken_total, 1);
    }
}

typedef struct {
    int wave, index;
} churn_arg;

static void *churn_thread(void *arg) {
    churn_arg a = *(churn_arg *)arg;
    uint64_t rng = mix64((uint64_t)a.wave * 131 + (uint64_t)a.index + 1);
    /* the previous wave's blocks, in another order than they were made */
    if (a.wave > 0) take_orphans((a.wave - 1) % 2, (a.index + 1) % PER_WAVE, &rng);
    tsan_item mine[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        size_t size = pick_size(rng_next(&rng));
        mine[i] = (tsan_item){lull_malloc(size), size, rng_next(&rng)};
        CHECK(mine[i].p != NULL, "malloc(%zu) failed", size);
        if (mine[i].p) pat_fill(mine[i].p, size, mine[i].seed);
    }
    for (int i = 0; i < BLOCKS - LEFT; i++) {
        if (!mine[i].p) continue;
        CHECK(pat_check(mine[i].p, mine[i].size, mine[i].seed), "own block corrupted");
        lull_free(mine[i].p);
    }
    if (a.index == 0) lull_thread_collect();
    _Atomic(void *) *slot = orphans[a.wave % 2][a.index];
    for (int i = 0; i < LEFT; i++) {
        tsan_item *it = &mine[BLOCKS - LEFT + i];
        if (!it->p) continue;
        orphan_header h = {it->size, it->seed};
        memcpy(it->p, &h, sizeof h);
        pat_fill((char *)it->p + sizeof h, it->size - sizeof h, it->seed);
        void *old = atomic_exchange_explicit(&slot[i], it->p, memory_order_release);
        CHECK(old == NULL, "slot %d of wave %d still held a block", i, a.wave);
        atomic_fetch_add(&left_total, 1);
    }
    return NULL; /* the heap is abandoned with LEFT live blocks */
}

/* Lives through all the waves and steals from the wave before last, so its
 * frees race with the adoption of the heaps those blocks came from. */
static atomic_int current_wave;
static atomic_bool stop;

static void *long_lived(void *arg) {
    (void)arg;
    uint64_t rng = 99;
    tsan_item keep[32] = {{0}};
    while (!atomic_load(&stop)) {
        int w = atomic_load(&current_wave);
        for (int i = 0; i < 32; i++) {
            if (keep[i].p) {
                CHECK(pat_check(keep[i].p, keep[i].size, keep[i].seed), "kept block corrupted");
                lull_free(keep[i].p);
            }
            size_t size = pick_size(rng_next(&rng));
            keep[i] = (tsan_item){lull_malloc(size), size, rng_next(&rng)};
            if (keep[i].p) pat_fill(keep[i].p, size, keep[i].seed);
        }
        /* the blocks of the last thread of wave w - 1 (its successors take
         * from index + 1, so nobody takes index 0 from a wave but us) */
        if (w > 0) take_orphans((w - 1) % 2, 0, &rng);
        sched_yield();
    }
    for (int i = 0; i < 32; i++)
        if (keep[i].p) lull_free(keep[i].p);
    return NULL;
}

int main(void) {
    lull_set_purge_delay_ms(0);
    pthread_t ll;
    start_thread(&ll, long_lived, NULL);
    for (int w = 0; w < WAVES; w++) {
        atomic_store(&current_wave, w);
        pthread_t t[PER_WAVE];
        churn_arg args[PER_WAVE];
        for (int i = 0; i < PER_WAVE; i++) {
            args[i] = (churn_arg){w, i};
            start_thread(&t[i], churn_thread, &args[i]);
        }
        for (int i = 0; i < PER_WAVE; i++)
            pthread_join(t[i], NULL);
        if (w % 8 == 0) lull_reclaim_now();
    }
    atomic_store(&stop, true);
    pthread_join(ll, NULL);
    uint64_t rng = 7;
    for (int p = 0; p < 2; p++)
        for (int t = 0; t < PER_WAVE; t++)
            take_orphans(p, t, &rng);
    CHECK(atomic_load(&taken_total) == atomic_load(&left_total), "left %d blocks, freed %d",
          atomic_load(&left_total), atomic_load(&taken_total));
    CHECK(lull_reclaim_now(), "no reclaim thread");
    return tsan_finish("tsan_thread_churn");
}
