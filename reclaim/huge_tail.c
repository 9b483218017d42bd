/* Tails of shrunk huge blocks; see huge_tail.h.
 *
 * held_bytes is never below what the stack holds: a push adds the tail's
 * length before its CAS, the reclaim thread subtracts it after its unmap
 * (inside its huge step, which fork's prepare handler waits for). So a
 * fork child copied between a push's add and its CAS counts a tail that
 * is on no stack of its own, which nobody there will ever unmap: the
 * child counts the stack again (below). Before session 28 it kept the
 * count for good (race_fork_huge::fork_while_a_realloc_pushes_a_shrunk_tail),
 * and each mapping its kernel refused waited for a forced tick first. */
#include "reclaim/huge_tail.h"
#include "base/fork_exec.h"
#include "base/race.h"

#include <stdatomic.h>

static lull_huge_tail *_Atomic tails;
/* The address space of the tails pushed and not yet unmapped: added before
 * the push, subtracted after the unmap, so never below what is held. */
static LULL_FORK_EXEC_DATA _Atomic uint64_t held_bytes; /* 0: no tail */

void lull_huge_tail_push(void *start, size_t len, size_t dirty, int node) {
    lull_huge_tail *t = start;
    t->len = len;
    t->dirty = dirty;
    t->node = node;
    atomic_fetch_add_explicit(&held_bytes, len, memory_order_relaxed);
    LULL_RACE_POINT(LULL_RACE_HUGE_TAIL_PUSH);
    lull_huge_tail *old = atomic_load_explicit(&tails, memory_order_relaxed);
    do {
        t->next = old;
        /* release: the node's fields before the reclaim thread's reads */
    } while (!atomic_compare_exchange_weak_explicit(&tails, &old, t, memory_order_release,
                                                    memory_order_relaxed));
}

lull_huge_tail *lull_huge_tail_take_all(void) {
    if (!atomic_load_explicit(&tails, memory_order_relaxed)) return NULL;
    return atomic_exchange_explicit(&tails, NULL, memory_order_acquire);
}

void lull_huge_tail_unmapped(size_t len) {
    atomic_fetch_sub_explicit(&held_bytes, len, memory_order_relaxed);
}

uint64_t lull_huge_tail_bytes(void) {
    return atomic_load_explicit(&held_bytes, memory_order_relaxed);
}

LULL_FORK_EXEC_TEXT void lull_huge_tail_after_fork_child(void) {
    /* never below what is held: 0, and the child reads no tail */
    if (!atomic_load_explicit(&held_bytes, memory_order_relaxed)) return;
    uint64_t bytes = 0; /* one thread here: nobody takes or unmaps meanwhile */
    for (lull_huge_tail *t = atomic_load_explicit(&tails, memory_order_relaxed); t; t = t->next)
        bytes += t->len;
    atomic_store_explicit(&held_bytes, bytes, memory_order_relaxed);
}
