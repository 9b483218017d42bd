/* How many thread heaps exist (in use or abandoned), for the tests that
 * check that threads do not leave heaps behind. */
#ifndef TESTS_SUPPORT_HEAP_COUNT_H
#define TESTS_SUPPORT_HEAP_COUNT_H

#include "src/heap.h"

static inline void heap_count_one(lull_heap *h, void *arg) {
    (void)h;
    (*(unsigned *)arg)++;
}

static inline unsigned heap_count(void) {
    unsigned n = 0;
    lull_heaps_foreach(heap_count_one, &n);
    return n;
}

#endif
