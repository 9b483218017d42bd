/* lull_thread_set_node() on a thread that is exiting: called from a
 * pthread key destructor after lull's own key destructor has abandoned the
 * thread's heap. lull then must take no heap for the thread: one taken in
 * glibc's last destructor round (PTHREAD_DESTRUCTOR_ITERATIONS) is never
 * abandoned, since no round is left to run lull's destructor again, and
 * the heap (with whatever spans it adopted) is lost with the thread. A
 * destructor that sets its key again until the last round (libraries that
 * want to run after everyone else's destructors do) and asks for a node
 * each time lost one heap per thread: the number of heaps grew with every
 * thread, where a thread's heap should be adopted by the next one. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "tests/support/heap_count.h"

#include <criterion/criterion.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

#define THREADS 20

static pthread_key_t key;
static _Atomic int last_round_calls, last_round_result;

static void late_set_node(void *value) {
    int round = (int)(intptr_t)value;
    int r = lull_thread_set_node(-1);
    if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
        /* again in the next round, up to the last one */
        pthread_setspecific(key, (void *)(intptr_t)(round + 1));
    } else {
        atomic_fetch_add(&last_round_calls, 1);
        atomic_store(&last_round_result, r);
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    lull_free(lull_malloc(64)); /* this thread's heap */
    pthread_setspecific(key, (void *)(intptr_t)1);
    return NULL;
}

static void count_not_abandoned(lull_heap *h, void *arg) {
    if (!__atomic_load_n(&h->abandoned, __ATOMIC_RELAXED)) (*(unsigned *)arg)++;
}

static unsigned heaps_not_abandoned(void) {
    unsigned n = 0;
    lull_heaps_foreach(count_not_abandoned, &n);
    return n;
}

Test(set_node_exiting, a_destructor_in_the_last_round_leaves_no_heap_behind) {
#if defined(__SANITIZE_THREAD__)
    /* as in test_abandoned.c: ThreadSanitizer finishes its per-thread state
     * from a key destructor of its own, and instrumented code run in the
     * rounds after it (this test's destructor) crashes inside TSan */
    cr_skip_test("destructor rounds after TSan's own: not testable under ThreadSanitizer");
#endif
    lull_free(lull_malloc(16)); /* lull started, this thread's heap made */
    cr_assert_eq(pthread_key_create(&key, late_set_node), 0);
    /* one thread first: the heap it leaves is the one the next ones adopt */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, thread_main, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    unsigned before = heap_count(), in_use_before = heaps_not_abandoned();
    for (int i = 0; i < THREADS; i++) {
        cr_assert_eq(pthread_create(&t, NULL, thread_main, NULL), 0);
        cr_assert_eq(pthread_join(t, NULL), 0);
    }
    unsigned after = heap_count(), in_use_after = heaps_not_abandoned();
    cr_assert_eq(atomic_load(&last_round_calls), THREADS + 1,
                 "the destructor did not reach glibc's last round in every thread");
    cr_assert_eq(atomic_load(&last_round_result), 0,
                 "lull_thread_set_node(-1) on an exiting thread: %d",
                 atomic_load(&last_round_result));
    /* every thread was joined: none of theirs is in use. (A reclaim thread
     * started meanwhile has a heap of its own, in use: one more at most.) */
    cr_assert_leq(in_use_after, in_use_before + 1,
                  "%u heaps in use after %d threads that exited, %u before: each thread left "
                  "one behind",
                  in_use_after, THREADS, in_use_before);
    cr_assert_leq(after, before + 2,
                  "%u heaps after %d threads that exited one at a time, %u before", after, THREADS,
                  before);
}
