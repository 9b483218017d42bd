/* Remote frees under ThreadSanitizer: four threads in a ring, each
 * allocating blocks (small, medium, large spans), filling them with a
 * pattern and handing them to the next thread through a lock-free queue;
 * the next thread checks the pattern and frees the block (a remote free
 * into the producer's heap), sometimes after a realloc or with free_sized.
 * Each thread also keeps a few blocks of its own that it frees locally, so
 * the owner's local frees and reuse race with the remote frees. */
#include "tsan_common.h"

#define THREADS 4
#define OPS_PER_THREAD 60000
#define LOCAL_SLOTS 64

static spsc queues[THREADS]; /* queues[i]: thread i -> thread i+1 */

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 1000;
    if (k < 800) return 1 + (r >> 12) % 1024;
    if (k < 980) return 1024 + (r >> 12) % (64 * KiB);
    return 64 * KiB + (r >> 12) % MiB; /* large spans and 512 KiB classes */
}

static void consume(tsan_item it, uint64_t *rng) {
    CHECK(pat_check(it.p, it.size, it.seed), "block %p of %zu bytes corrupted in flight", it.p,
          it.size);
    CHECK(lull_usable_size(it.p) >= it.size, "usable %zu < %zu", lull_usable_size(it.p), it.size);
    uint64_t r = rng_next(rng) % 8;
    if (r == 0) {
        /* realloc on a thread that does not own the block */
        size_t nsize = pick_size(rng_next(rng));
        void *q = lull_realloc(it.p, nsize);
        CHECK(q != NULL, "realloc to %zu failed", nsize);
        if (!q) return;
        size_t keep = nsize < it.size ? nsize : it.size;
        size_t head = keep < 256 ? keep : 256;
        if (q != it.p) {
            /* the copy keeps the first bytes (the pattern depends on the
             * old address) */
            for (size_t i = 0; i < head; i++)
                if (((uint8_t *)q)[i] != pat_byte(it.p, it.seed, i)) {
                    CHECK(false, "realloc lost byte %zu", i);
                    break;
                }
        }
        lull_free(q);
    } else if (r == 1) {
        lull_free_sized(it.p, it.size);
    } else {
        lull_free(it.p);
    }
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    spsc *out = &queues[id], *in = &queues[(id + THREADS - 1) % THREADS];
    uint64_t rng = 0x1234567ULL * (uint64_t)(id + 1);
    tsan_item local[LOCAL_SLOTS] = {{0}};
    for (int op = 0; op < OPS_PER_THREAD; op++) {
        uint64_t r = rng_next(&rng);
        size_t size = pick_size(r);
        tsan_item it = {lull_malloc(size), size, rng_next(&rng)};
        CHECK(it.p != NULL, "malloc(%zu) failed", size);
        if (!it.p) continue;
        pat_fill(it.p, size, it.seed);
        if (r & 1) {
            /* keep it locally: free an older local block first */
            tsan_item *slot = &local[(r >> 1) % LOCAL_SLOTS];
            if (slot->p) {
                CHECK(pat_check(slot->p, slot->size, slot->seed), "local block %p corrupted",
                      slot->p);
                lull_free(slot->p);
            }
            *slot = it;
        } else {
            while (!spsc_push(out, it)) {
                tsan_item got;
                if (spsc_pop(in, &got))
                    consume(got, &rng);
                else
                    sched_yield();
            }
        }
        tsan_item got;
        for (int k = 0; k < 2 && spsc_pop(in, &got); k++)
            consume(got, &rng);
    }
    atomic_store_explicit(&out->closed, true, memory_order_release);
    for (;;) {
        tsan_item got;
        if (spsc_pop(in, &got)) {
            consume(got, &rng);
            continue;
        }
        if (atomic_load_explicit(&in->closed, memory_order_acquire)) {
            /* closed is set after the last push: one more look */
            while (spsc_pop(in, &got))
                consume(got, &rng);
            break;
        }
        sched_yield();
    }
    for (int i = 0; i < LOCAL_SLOTS; i++)
        if (local[i].p) {
            CHECK(pat_check(local[i].p, local[i].size, local[i].seed), "local block corrupted");
            lull_free(local[i].p);
        }
    lull_thread_collect();
    return NULL;
}

int main(void) {
    lull_set_purge_delay_ms(0); /* the reclaim thread purges freed spans at once */
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        start_thread(&t[i], worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK(lull_reclaim_now(), "no reclaim thread");
    return tsan_finish("tsan_remote_free");
}
