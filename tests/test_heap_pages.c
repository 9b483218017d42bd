/* A thread's heap (base/types.h lull_heap) is ~28 KiB, most of it arrays
 * of one entry a size class (the reuse lists' stand-in spans, the second
 * lists, defrag's views) that a thread uses a few entries of. Heaps come
 * from mmap'd chunks (src/heap.c), zeroed: a new heap writes only what is
 * not zero already, so the pages of entries it never uses stay untouched.
 * A memset of the second lists and a "closed" mark in every list past the
 * last class at each heap's creation made 6 of its 8 pages resident.
 *
 * Four threads, alive at once, each allocate and free blocks of twenty
 * sizes: the chunk holding the heaps has at most three resident pages for
 * each heap made (smaps Rss, which leaves out pages only read). */
#define _GNU_SOURCE
#include "lull.h"
#include "base/types.h"
#include "src/heap.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern _Atomic uint64_t lull_heap_used_bytes; /* src/heap.c */

#define THREADS 4
#define PAGE 4096u

static pthread_barrier_t all_made, measured;
static uintptr_t heap_at[THREADS];

static void *worker(void *arg) {
    int i = (int)(intptr_t)arg;
    void *p[20];
    for (int k = 0; k < 20; k++) {
        p[k] = lull_malloc(16 + 48 * (size_t)k);
        cr_assert_not_null(p[k]);
        memset(p[k], k, 16 + 48 * (size_t)k);
    }
    for (int k = 0; k < 20; k++)
        lull_free(p[k]);
    heap_at[i] = (uintptr_t)lull_tl_heap;
    pthread_barrier_wait(&all_made);
    pthread_barrier_wait(&measured); /* the heaps stay theirs until then */
    return NULL;
}

/* smaps' Rss of the mapping that holds address a, in bytes. */
static uint64_t resident_of_mapping(uintptr_t a) {
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f);
    char line[512];
    bool inside = false;
    uint64_t rss = UINT64_MAX;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
            continue;
        }
        unsigned long kib;
        if (inside && sscanf(line, "Rss: %lu kB", &kib) == 1) {
            rss = (uint64_t)kib << 10;
            break;
        }
    }
    fclose(f);
    cr_assert_neq(rss, UINT64_MAX, "no mapping holds %#lx", (unsigned long)a);
    return rss;
}

Test(heap_pages, a_new_heap_leaves_the_entries_it_never_uses_untouched) {
    lull_free(lull_malloc(16)); /* this thread's heap too */
    cr_assert_eq(pthread_barrier_init(&all_made, NULL, THREADS + 1), 0);
    cr_assert_eq(pthread_barrier_init(&measured, NULL, THREADS + 1), 0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    pthread_barrier_wait(&all_made);

    size_t heap_size = (sizeof(lull_heap) + 63) & ~(size_t)63;
    uint64_t heaps = atomic_load(&lull_heap_used_bytes) / heap_size;
    uintptr_t lo = heap_at[0], hi = heap_at[0];
    for (int i = 1; i < THREADS; i++) {
        lo = heap_at[i] < lo ? heap_at[i] : lo;
        hi = heap_at[i] > hi ? heap_at[i] : hi;
    }
    uint64_t rss = resident_of_mapping(lo);
    cr_assert_eq(rss, resident_of_mapping(hi), "the heaps are not in one chunk");
    cr_log_info("%llu heaps of %zu bytes, chunk resident %llu KiB", (unsigned long long)heaps,
                heap_size, (unsigned long long)rss >> 10);
    cr_assert_geq(heaps, THREADS + 1);
    cr_assert_leq(rss, heaps * 3 * PAGE, "%llu KiB resident for %llu heaps of %zu KiB",
                  (unsigned long long)rss >> 10, (unsigned long long)heaps, heap_size >> 10);

    pthread_barrier_wait(&measured);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}
