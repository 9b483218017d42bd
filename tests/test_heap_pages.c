/* A thread's heap (base/types.h lull_heap) is ~28 KiB, most of it arrays
 * of one entry a size class (the reuse lists' stand-in spans, the second
 * lists, defrag's views) that a thread uses a few entries of. Heaps come
 * from mmap'd chunks (src/heap.c), zeroed: a new heap writes only what is
 * not zero already, so the pages of entries it never uses stay untouched.
 * A memset of the second lists and a "closed" mark in every list past the
 * last class at each heap's creation made 6 of its 8 pages resident.
 *
 * Four threads, alive at once, each allocate and free blocks of twenty
 * sizes: at most three pages of each of their heaps are written
 * (pagemap: present and mapped by this process alone, which leaves out
 * pages only read). Where the kernel maps no shared zero page for a read
 * (a PVM guest booted with pvm_no_zero_page=1), a read makes the page
 * resident and is counted too, as it costs RSS there: a new heap that read
 * every class's reuse lists (the reset, each first malloc of a class) and
 * the profile pointer after them made 25 pages of 4 heaps resident. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/types.h"
#include "src/heap.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* Pages of [lo, hi) this process wrote: present in /proc/self/pagemap and
 * mapped by it alone (bit 56), which leaves out the shared zero page that
 * a read of an untouched page maps. By address, not by mapping: the
 * kernel may merge the chunk's mapping with its neighbours (an ASan
 * build's, which smaps then counted in: 1,124 KiB). */
static uint64_t pages_written(uintptr_t lo, uintptr_t hi) {
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open /proc/self/pagemap");
    uint64_t n = 0;
    for (uintptr_t a = lo & ~(uintptr_t)(PAGE - 1); a < hi; a += PAGE) {
        uint64_t e;
        cr_assert_eq(pread(fd, &e, sizeof e, (off_t)(a / PAGE * sizeof e)), (ssize_t)sizeof e);
        n += (e >> 63 & 1) && (e >> 56 & 1);
    }
    close(fd);
    return n;
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
    /* the workers' heaps and any made between them (one chunk, in order) */
    uint64_t in_range = (hi - lo) / heap_size + 1;
    cr_assert_lt(hi - lo, (uintptr_t)1 << 20, "the heaps are not in one chunk");
    uint64_t written = pages_written(lo, hi + heap_size);
    cr_log_info("%llu heaps of %zu bytes (%llu made), %llu pages written",
                (unsigned long long)in_range, heap_size, (unsigned long long)heaps,
                (unsigned long long)written);
    cr_assert_geq(heaps, THREADS + 1);
    cr_assert_geq(written, in_range, "fewer pages written than heaps: the count is wrong");
    cr_assert_leq(written, in_range * 3, "%llu pages written for %llu heaps of %zu KiB",
                  (unsigned long long)written, (unsigned long long)in_range, heap_size >> 10);

    pthread_barrier_wait(&measured);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
}
