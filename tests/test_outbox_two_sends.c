/* A remote free whose outbox slot held blocks for another heap sends that
 * message first, and a block of 64 KiB or more then goes out at once in a
 * message of its own: two sends in one free (src/outbox.c). An owner that
 * exited has its frees collected by the sender at once (heap.c,
 * lull_heap_collect_if_abandoned), not a reclaim tick later; the put
 * reported only its last send, so the first message's abandoned owner held
 * its frees until a tick. The reclaim thread is held here: no tick
 * collects anything meanwhile. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/reuse.h"
#include "tests/support/reclaim_hold.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>

#define HEAPS 9 /* more than the 8 slots: two of them share one */
#define BIG ((size_t)100 << 10)

static pthread_barrier_t made;
static struct {
    lull_heap *heap;
    void *small, *big;
} owner[HEAPS];

static void *make_blocks(void *arg) {
    size_t i = (size_t)arg;
    owner[i].small = lull_malloc(64);
    owner[i].big = lull_malloc(BIG);
    cr_assert(owner[i].small && owner[i].big);
    owner[i].heap = lull_tl_heap;
    pthread_barrier_wait(&made); /* all alive at once: nine heaps */
    return NULL;                 /* the heap is abandoned */
}

/* src/outbox.c's slot_of */
static unsigned slot_of(const lull_heap *h) {
    return (unsigned)(((uintptr_t)h >> 6) * 0x9e3779b97f4a7c15ull >> 61);
}

Test(outbox_two_sends, the_slots_former_owner_gets_its_frees_when_it_exited) {
    lull_free(lull_malloc(16));
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    pthread_barrier_init(&made, NULL, HEAPS);
    pthread_t t[HEAPS];
    for (size_t i = 0; i < HEAPS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, make_blocks, (void *)i), 0);
    for (size_t i = 0; i < HEAPS; i++)
        pthread_join(t[i], NULL);
    size_t a = HEAPS, b = HEAPS;
    for (size_t i = 0; i < HEAPS && a == HEAPS; i++)
        for (size_t j = i + 1; j < HEAPS; j++)
            if (slot_of(owner[i].heap) == slot_of(owner[j].heap)) {
                a = i;
                b = j;
                break;
            }
    cr_assert_lt(a, HEAPS, "no two heaps share a slot");
    cr_assert_neq(owner[a].heap, owner[b].heap);
    cr_assert(owner[a].heap->abandoned && owner[b].heap->abandoned);
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    lull_free(owner[a].small); /* waits in this thread's outbox, for heap a */
    cr_assert_null(atomic_load(&owner[a].heap->inbox));
    /* the slot goes to heap b: a's message is sent, then this block's own */
    lull_free(owner[b].big);
    lull_block *left_a = atomic_load(&owner[a].heap->inbox);
    lull_block *left_b = atomic_load(&owner[b].heap->inbox);
    cr_assert(reclaim_release(), "the reclaim thread was not released");
    cr_expect_null(left_b, "the exited owner of the second message kept it");
    cr_expect_null(left_a, "the exited owner of the first message kept it: its frees "
                           "wait for a reclaim tick");
    for (size_t i = 0; i < HEAPS; i++) {
        if (i != a) lull_free(owner[i].small);
        if (i != b) lull_free(owner[i].big);
    }
    lull_reuse_max_bytes = LULL_REUSE_MAX_BYTES;
}
