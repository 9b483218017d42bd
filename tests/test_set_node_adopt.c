/* lull_thread_set_node() binds the calling thread's allocations, and only
 * its own: a heap it pinned and left behind (at its exit, or when it moved
 * to another node) is adopted by the next thread of that node, which never
 * asked for a node. That thread must follow the node it runs on, as every
 * unpinned thread does: the heap's pin stayed with the heap, and its new
 * owner took every span from the first owner's node for good, wherever it
 * ran.
 *
 * Two arenas on any machine: the home node comes from a function of the
 * test's (lull_set_home_node_fn), so a thread "moves" to node 1 when the
 * test says so; node 0 is the one lull_thread_set_node() names. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "numa/home_arena.h"
#include "src/heap.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

static _Atomic int fake_node;

static int fake_home_node(void) {
    return atomic_load(&fake_node);
}

static lull_heap *pinned_heap;

static void *pin_and_exit(void *arg) {
    (void)arg;
    lull_free(lull_malloc(64)); /* a heap of node 0 */
    cr_assert_eq(lull_thread_set_node(0), 0);
    pinned_heap = lull_tl_heap;
    return NULL; /* the heap is abandoned, pinned, to node 0's list */
}

struct adopt_result {
    lull_heap *heap;
    lull_arena *arena; /* the arena of a span taken after the move */
};

static void *adopt_and_move(void *arg) {
    struct adopt_result *r = arg;
    void *first = lull_malloc(64); /* adopts the heap node 0's list holds */
    r->heap = lull_tl_heap;
    atomic_store(&fake_node, 1); /* this thread now runs on node 1 */
    /* a class this heap has no span of: a new span, from the home node */
    void *p = lull_malloc(3000);
    cr_assert_not_null(p);
    r->arena = lull_segment_of(p)->arena;
    lull_free(p);
    lull_free(first);
    return NULL;
}

Test(set_node_adopt, adopted_heap_follows_its_new_thread) {
    lull_free(lull_malloc(16)); /* lull started */
    lull_set_home_node_fn(fake_home_node);
    lull_arena_count = 2;

    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, pin_and_exit, NULL), 0);
    pthread_join(t, NULL);
    cr_assert_not_null(pinned_heap);

    struct adopt_result r = {0};
    cr_assert_eq(pthread_create(&t, NULL, adopt_and_move, &r), 0);
    pthread_join(t, NULL);
    /* the precondition: the second thread took the pinned heap over */
    cr_assert_eq(r.heap, pinned_heap, "the second thread did not adopt the pinned heap");
    cr_assert_eq(r.arena, &lull_arenas[1],
                 "a thread that never called lull_thread_set_node() took its span from arena "
                 "%d, the node its heap's former owner pinned, not from the node it runs on (1)",
                 (int)(r.arena - lull_arenas));
}

/* include/lull.h: a node that is not present is refused with -EINVAL, the
 * thread's binding unchanged and errno untouched. */
Test(set_node_adopt, absent_node_is_refused) {
    lull_free(lull_malloc(16));
    errno = 0;
    cr_assert_eq(lull_thread_set_node(4095), -EINVAL);
    cr_assert_eq(errno, 0, "errno %d after a refused lull_thread_set_node()", errno);
    cr_assert_eq(lull_thread_set_node(-1), 0);
}
