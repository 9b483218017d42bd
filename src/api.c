/* The small public API around the malloc family: configuration, the purge
 * delay, per-thread controls. */
#include "lull.h"
#include "base/config.h"
#include "reclaim/reclaim.h"
#include "numa/arena.h"
#include "numa/home_node.h"
#include "numa/numa_module.h"
#include "src/heap.h"
#include "src/init.h"

#include <errno.h>

LULL_EXPORT bool lull_configure(const char *key, const char *value) {
    lull_ensure_init(); /* the start-up configuration first, as it always was */
    return lull_config_set(key, value);
}

LULL_EXPORT void lull_set_purge_delay_ms(long ms) {
    lull_ensure_init();
    if (ms < LULL_PURGE_DELAY_AUTO) ms = LULL_PURGE_DELAY_NEVER;
    /* the reclaim thread compares 32-bit millisecond times */
    if (ms > LULL_PURGE_DELAY_MAX_MS) ms = LULL_PURGE_DELAY_MAX_MS;
    __atomic_store_n(&lull_config.purge_delay_ms, ms, __ATOMIC_RELAXED);
}

LULL_EXPORT long lull_purge_delay_ms(void) {
    lull_ensure_init();
    return __atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED);
}

LULL_EXPORT void lull_thread_collect(void) {
    lull_heap *h = lull_tl_heap;
    if (h != &lull_heap_empty) lull_heap_collect(h, true);
    lull_reclaim_start_point();
}

LULL_EXPORT void lull_purge_all(void) {
    /* a purge the kernel refuses is counted (purge_errors), no error of
     * the caller's, whose errno stays, as malloc_trim's must: with no
     * reclaim thread the caller purges, and a refused madvise's ENOMEM
     * came back in its errno
     * (glibc_malloc.malloc_trim_on_its_caller_leaves_errno_as_it_was) */
    int saved = errno;
    /* this thread's kept spans and held remote frees first: what the purge
     * can reach is what lies in the arenas and the huge cache */
    lull_thread_collect();
    lull_reclaim_purge_all();
    errno = saved;
}

LULL_EXPORT int lull_thread_set_node(int node) {
    lull_ensure_init();
    /* An exiting thread (a key destructor after lull's abandoned its heap)
     * takes no heap: one taken in glibc's last destructor round is never
     * abandoned, and is lost with the thread (test_set_node_exiting). Its
     * allocations come from the late heap, whatever its node. */
    if (lull_tl_heap == &lull_heap_empty && lull_heap_thread_done())
        return home_node_set_thread(node);
    lull_heap *h = lull_heap_get_or_create();
    if (!h) return -ENOMEM;
    int err = home_node_set_thread(node);
    if (err) return err;
    int arena = lull_numa_arena_of_node(node);
    if (arena != h->node) {
        /* The heap's spans are memory of its old node, and it would keep
         * serving small blocks from them: leave it to the next thread of
         * that node (as at thread exit) and take a heap of the new one
         * (lull_home_node() now sees the override). */
        lull_heap_abandon(h);
        h = lull_heap_get_or_create();
        if (!h) return -ENOMEM;
    }
    h->node_pinned = node >= 0;
    h->node = arena;
    h->arena = &lull_arenas[arena];
    return 0;
}
