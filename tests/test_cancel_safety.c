/* pthread_cancel() of a thread inside lull. Deferred cancellation (the
 * default) acts at the cancellation points a thread reaches (write, open,
 * read, close, nanosleep...: man 7 pthreads); glibc's malloc reaches none.
 * A lull call that reached one with an arena's lock held unwound there:
 * the lock stayed held, and every later segment of that arena waited for
 * it for ever.
 *
 * The test gives a thread a pending cancellation (pthread_cancel of
 * itself: deterministic, no timing) and then calls into lull on the path
 * that reaches the cancellation point; the call must return, the
 * cancellation acts at the thread's own pthread_testcancel() after it, and
 * the arena's lock must be free. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "numa/bind.h"
#include "tests/support/numa_unbindable.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define BLOCKS 16 /* of 8 MiB: 4 per 32 MiB segment at most */

/* how many of the thread's mallocs returned */
static _Atomic int returned;
static void *blocks[BLOCKS];

static void *allocate_cancelled(void *arg) {
    uint32_t segments = *(uint32_t *)arg;
    pthread_cancel(pthread_self()); /* pending: acts at the next cancellation point */
    for (int n = 0; n < BLOCKS && atomic_load(&lull_arenas[0].segment_count) < segments + 1; n++) {
        blocks[n] = lull_malloc(8 * MiB);
        atomic_fetch_add(&returned, 1);
    }
    pthread_testcancel();
    return NULL;
}

/* The segment hook (numa_segment_prepare) runs under the arena's lock; a
 * refused mbind is said once, with lull_message (write(2)); one is made
 * refused with tests/support/numa_unbindable.h. */
Test(cancel_safety, a_thread_cancelled_while_its_malloc_maps_a_segment, .timeout = 60) {
    numa_bind_to_absent_node();
    struct numa_bind_stats before, after;
    numa_bind_stats(&before);

    uint32_t segments = atomic_load(&lull_arenas[0].segment_count);
    pthread_t th;
    void *res;
    cr_assert_eq(pthread_create(&th, NULL, allocate_cancelled, &segments), 0);
    cr_assert_eq(pthread_join(th, &res), 0);
    /* before anything that allocates: a held lock would stop this thread too */
    int busy = pthread_mutex_trylock(&lull_arenas[0].lock);
    /* a normal mutex: glibc lets another thread unlock it, so the failure
     * below can be reported (its message allocates) */
    pthread_mutex_unlock(&lull_arenas[0].lock);
    numa_bind_stats(&after);
    if (after.failed == before.failed)
        cr_skip_test("binding to node 1 worked here (the host has a node 1): nothing failed");
    cr_assert_eq(res, PTHREAD_CANCELED);
    cr_assert_eq(busy, 0,
                 "arena 0's lock is held after its holder was cancelled (trylock: %s); "
                 "the cancelled thread's mallocs returned %d times, the segment count went "
                 "from %u to %u",
                 strerrorname_np(busy), atomic_load(&returned), segments,
                 atomic_load(&lull_arenas[0].segment_count));
    cr_assert_geq(atomic_load(&returned), 1, "the cancelled thread's malloc never returned");
    for (int i = 0; i < atomic_load(&returned); i++)
        lull_free(blocks[i]);
}
