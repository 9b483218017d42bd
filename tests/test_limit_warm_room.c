/* At the heap limit (heap_limit_mb, base/resident.h), a span search must
 * still take warm slices, which the resident estimate counts already and
 * which take no room. take_span's passes go dirty, then dirty or lazy
 * (MADV_FREE'd, clean to the estimate: taking them grows it), then warm:
 * a lazy run over the limit ended the whole search there, as if every
 * run of resident slices had been tried, and the allocation was refused
 * (NULL, ENOMEM) with a run of warm slices free for it.
 *
 * An arena of the test's own (the library's reclaim thread walks only
 * lull_arenas[]): a lazy run made by a MADV_FREE step, a warm run made as
 * the warm reserve makes one, and a limit that leaves less room than the
 * span. lull_arena_try_alloc_span: one search, no wait for a purge. */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/resident.h"
#include "numa/arena.h"
#include "lull.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim_steps.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#define N 8 /* the span's slices */

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* the library is initialised: segments, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

static void no_limit(void) {
    __atomic_store_n(&lull_config.heap_limit_bytes, 0, __ATOMIC_RELAXED);
}

Test(limit_warm_room, warm_slices_are_taken_when_lazy_ones_are_over_the_limit, .init = setup,
     .fini = no_limit) {
    static lull_arena a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.lock, NULL);
    bool zeroed;
    /* the lazy run: slices 2..9 of the segment; a slice in use after it */
    lull_span *lazy = lull_arena_alloc_span(&a, N, &zeroed);
    lull_span *spacer = lull_arena_alloc_span(&a, 1, &zeroed);
    cr_assert(lazy && spacer);
    lull_segment *seg = lull_segment_of(lazy);
    cr_assert_eq(lull_segment_of(spacer), seg);
    lull_arena_free_span(lazy);
    purge_backend b;
    memset(&b, 0, sizeof b);
    lull_reclaim_stats st;
    memset(&st, 0, sizeof st);
    lull_step_slices(&b, &st, &a, 0, true, MADV_FREE);
    cr_assert_eq(st.purge_failures, 0, "MADV_FREE refused");
    cr_assert_eq(lull_arena_count_slices(&a, 0), 0, "the lazy run is still dirty");

    /* the warm run: the next N zeroed clean slices, taken and finished as
     * the warm reserve does (the estimate counts them from now on) */
    lull_slice_run runs[8];
    size_t n = lull_arena_take_clean(&a, N, runs, 8);
    cr_assert_eq(n, 1);
    cr_assert_eq(runs[0].count, N);
    unsigned warm_first = runs[0].first;
    lull_arena_make_warm(&runs[0]);
    cr_assert_eq(lull_arena_count_slices(&a, 1), N);

    /* room for half the span: the lazy run does not fit, the warm one
     * needs none */
    uint64_t span_bytes = (uint64_t)N << LULL_SLICE_SHIFT;
    __atomic_store_n(&lull_config.heap_limit_bytes, lull_resident_bytes() + span_bytes / 2,
                     __ATOMIC_RELAXED);
    lull_span *s = lull_arena_try_alloc_span(&a, N, &zeroed);
    uint64_t resident = lull_resident_bytes();
    no_limit();
    cr_assert_not_null(s, "a span of %d slices refused at the limit, %d warm slices free", N, N);
    cr_assert_eq(lull_segment_of(s), seg);
    cr_assert_eq((unsigned)(s - lull_span_table_of(seg)->slices), warm_first,
                 "the span took other slices than the warm ones");
    cr_assert_eq(lull_arena_count_slices(&a, 1), 0);
    cr_assert_leq(resident, lull_resident_limit() ? lull_resident_limit() : UINT64_MAX);
    lull_arena_free_span(s);
    lull_arena_free_span(spacer);
}
