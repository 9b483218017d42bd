/* An arena of the test's own, outside lull_arenas[] (the library's reclaim
 * thread walks only those), filled with n spans of `slices` slices each,
 * and a purge step over it, for the tests that run the reclaim steps
 * themselves. */
#ifndef TESTS_SUPPORT_OWN_ARENA_H
#define TESTS_SUPPORT_OWN_ARENA_H

#include "numa/arena.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim_steps.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

static inline void own_arena_fill(lull_arena *a, lull_span **spans, int n, unsigned slices) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    for (int i = 0; i < n; i++) {
        bool zeroed;
        spans[i] = lull_arena_alloc_span(a, slices, &zeroed);
        cr_assert_not_null(spans[i]);
    }
}

/* A purge step over everything free in a (lull_purge_all's, every delay
 * past), run here with a plain madvise backend, as lull_purge_all does when
 * no reclaim thread runs; its counts into *st. */
static inline void own_arena_purge_all(lull_arena *a, lull_reclaim_stats *st) {
    purge_backend b;
    memset(&b, 0, sizeof b);
    memset(st, 0, sizeof *st);
    lull_step_slices(&b, st, a, 0, true, MADV_DONTNEED);
}

#endif
