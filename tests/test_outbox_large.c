/* A thread's held remote frees (src/outbox.h) go out when it takes memory:
 * a new span for small blocks, and a span for a large block too. A thread
 * that frees other threads' small blocks and then allocates only large ones
 * (a consumer of small messages that builds large buffers) held its part-full
 * messages, and their spans stayed in use, until it collected or exited. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/outbox.h"
#include "src/reuse.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <pthread.h>

#define SIZE 256
#define N 10                         /* a part-full message */
#define LARGE_SIZE ((size_t)1 << 20) /* above the small classes (512 KiB) */

static void *owned[N];
static pthread_barrier_t bar;
static void *large;

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static void *freer(void *arg) {
    (void)arg;
    lull_free(lull_malloc(SIZE)); /* a heap of its own */
    for (unsigned i = 0; i < N; i++)
        lull_free(owned[i]);
    large = lull_malloc(LARGE_SIZE); /* a large span: memory taken */
    pthread_barrier_wait(&bar);      /* the owner collects */
    pthread_barrier_wait(&bar);
    lull_free(large);
    return NULL;
}

Test(outbox_large, a_large_allocation_sends_the_held_remote_frees) {
    lull_size_classes_init();
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    for (unsigned i = 0; i < N; i++)
        owned[i] = lull_malloc(SIZE);
    void *keep = lull_malloc(SIZE); /* keeps the span in use */
    lull_thread_collect();          /* the deferred free, if any, done */
    lull_span *span = span_of(owned[0]);
    uint32_t used = lull_span_used(span);
    pthread_barrier_init(&bar, NULL, 2);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, freer, NULL), 0);
    pthread_barrier_wait(&bar);
    lull_thread_collect(); /* applies what reached this heap's inbox */
    uint32_t after = lull_span_used(span);
    pthread_barrier_wait(&bar);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&bar);
    cr_assert_not_null(large);
    cr_assert_eq(after, used - N,
                 "%u blocks in use after the freer's large allocation, %u before its %u frees",
                 after, used, N);
    lull_free(keep);
}
