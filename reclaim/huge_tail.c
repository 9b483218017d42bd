/* Tails of shrunk huge blocks; see huge_tail.h. */
#include "reclaim/huge_tail.h"

#include <stdatomic.h>

static lull_huge_tail *_Atomic tails;
/* The address space of the tails pushed and not yet unmapped: added before
 * the push, subtracted after the unmap, so never below what is held. */
static _Atomic uint64_t held_bytes;

void lull_huge_tail_push(void *start, size_t len, size_t dirty, int node) {
    lull_huge_tail *t = start;
    t->len = len;
    t->dirty = dirty;
    t->node = node;
    atomic_fetch_add_explicit(&held_bytes, len, memory_order_relaxed);
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
