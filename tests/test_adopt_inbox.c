/* A heap adopted with remote frees waiting in it (src/heap.c): what other
 * threads sent a heap while it was abandoned is the reclaim thread's to
 * collect, and once a new thread adopts the heap only that thread may. A
 * thread that adopts it through a free (a consumer, which gets a heap for
 * its outbox) and keeps the blocks it frees on its reuse lists never
 * refills: it held those frees for good, counted live. The reclaim thread
 * is held here, so that no tick collects the heap before the adoption. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/span.h"
#include "tests/support/reclaim_hold.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#define SIZE 256
#define N 32 /* one span's worth of a new heap, under a message's 64 */

static void *owned[N];
static lull_heap *owner_heap, *adopter_heap;
static void *main_block;
static uint32_t used_at_adoption;

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static void run_thread(void *(*fn)(void *)) {
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, NULL), 0);
    pthread_join(t, NULL);
}

static void *allocate_and_exit(void *arg) {
    (void)arg;
    for (unsigned i = 0; i < N; i++) {
        owned[i] = lull_malloc(SIZE);
        memset(owned[i], 0x5a, SIZE);
    }
    owner_heap = lull_tl_heap;
    return NULL;
}

/* Its first call into lull is a free of another heap's block: it adopts
 * the last heap abandoned, and only frees. */
static void *consumer(void *arg) {
    (void)arg;
    lull_free(main_block);
    adopter_heap = lull_tl_heap;
    used_at_adoption = lull_span_used(span_of(owned[0]));
    return NULL;
}

Test(adopt_inbox, an_adopted_heap_applies_the_frees_sent_while_it_was_abandoned) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_free(lull_malloc(SIZE)); /* the main thread's heap */
    main_block = lull_malloc(SIZE);
    run_thread(allocate_and_exit); /* its heap is the last one abandoned */
    uint32_t used = lull_span_used(span_of(owned[0]));
    cr_assert_eq(used, N);
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    /* kept on this thread's reuse list, then sent home by the collect: a
     * message in the abandoned heap's inbox */
    for (unsigned i = 0; i < N; i++)
        lull_free(owned[i]);
    lull_thread_collect();
    run_thread(consumer);
    cr_assert(reclaim_release(), "the reclaim thread was not released");
    cr_assert_eq(adopter_heap, owner_heap, "the consumer did not adopt the exited thread's heap");
    cr_assert_eq(used_at_adoption, used - N,
                 "%u blocks in use after the adoption, %u before the %u frees sent to the heap",
                 used_at_adoption, used, N);
}
