/* The huge-block queue; see huge_queue.h. Push-only stack plus take-all
 * exchange: no ABA, no lock. */
#include "reclaim/huge_queue.h"

#include <stdatomic.h>

static lull_huge *_Atomic queue_head;

void lull_huge_queue_push(lull_huge *h) {
    lull_huge *old = atomic_load_explicit(&queue_head, memory_order_relaxed);
    do {
        h->next = old;
    } while (!atomic_compare_exchange_weak_explicit(&queue_head, &old, h, memory_order_release,
                                                    memory_order_relaxed));
}

lull_huge *lull_huge_queue_take_all(void) {
    return atomic_exchange_explicit(&queue_head, NULL, memory_order_acquire);
}
