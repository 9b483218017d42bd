/* A purge step over everything (lull_purge_all's) whose first batch is
 * nothing but runs the kernel refuses to purge (pages the program locked
 * with mlock: MADV_DONTNEED fails with EINVAL). The refused runs go back to
 * dirty, and a claim that starts over from the first segment takes the very
 * same runs again: the step saw a batch that purged nothing and ended, and
 * every dirty slice behind the refused ones stayed dirty after
 * lull_purge_all(), which promises to purge everything free.
 * tests/test_step_refused_run.c is the case of one refused run in a batch
 * that purged the rest.
 *
 * As there, an arena of the test's own (the library's reclaim thread only
 * walks lull_arenas[]), the step run here with a plain madvise backend, as
 * lull_purge_all does when no reclaim thread runs. */
#define _GNU_SOURCE
#include "numa/arena.h"
#include "lull.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim_steps.h"
#include "src/span.h"
#include "tests/support/own_arena.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* two spans a segment, four segments */
#define SPAN_SLICES 255
#define SPANS 8
#define SEGMENTS 4
#define FREE_SLICES (LULL_SLICES - LULL_META_SLICES) /* of a segment */
/* every run of the first two segments in claim order, and the runs of the
 * first word of the third: more than one batch claims (LULL_STEP_BYTES,
 * 1024 slices, checked before each 64-slice word) */
#define LOCKED_SEGMENTS 2
#define LOCKED_EXTENTS_OF_THIRD 2
#define MAX_LOCKED (LOCKED_SEGMENTS * LULL_SLICES / LULL_EXTENT_SLICES + LOCKED_EXTENTS_OF_THIRD)

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* the library is initialised: segments, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

static char *locked[MAX_LOCKED];
static int n_locked;

/* one locked page at the start of each extent's run of seg, the first
 * `extents` extents (a run is cut at each extent, and the first starts
 * after the metadata) */
static void lock_runs(lull_segment *seg, unsigned extents) {
    for (unsigned e = 0; e < extents; e++) {
        unsigned first = e * LULL_EXTENT_SLICES;
        if (first < LULL_META_SLICES) first = LULL_META_SLICES;
        char *p = lull_slice_address(seg, first);
        /* the system call itself: the sanitizers' mlock() does nothing */
        if (syscall(SYS_mlock, p, 4096) != 0) cr_skip_test("mlock refused (RLIMIT_MEMLOCK)");
        locked[n_locked++] = p;
    }
}

Test(step_refused_batch, a_batch_of_refused_runs_does_not_end_the_step, .init = setup) {
    static lull_arena a;
    lull_span *spans[SPANS];
    own_arena_fill(&a, spans, SPANS, SPAN_SLICES);
    cr_assert_eq(atomic_load(&a.segment_count), SEGMENTS);
    /* the segments in claim order (newest first) */
    lull_segment *seg[SEGMENTS];
    int k = 0;
    for (lull_segment *s = atomic_load(&a.segments); s; s = s->next)
        seg[k++] = s;
    cr_assert_eq(k, SEGMENTS);
    for (int i = 0; i < LOCKED_SEGMENTS; i++)
        lock_runs(seg[i], LULL_SLICES / LULL_EXTENT_SLICES);
    lock_runs(seg[LOCKED_SEGMENTS], LOCKED_EXTENTS_OF_THIRD);
    for (int i = 0; i < SPANS; i++)
        lull_arena_free_span(spans[i]);
    cr_assert_eq(lull_arena_count_slices(&a, 0), (size_t)SEGMENTS * FREE_SLICES);

    lull_reclaim_stats st;
    own_arena_purge_all(&a, &st);
    for (int i = 0; i < n_locked; i++)
        syscall(SYS_munlock, locked[i], 4096);

    cr_assert_geq(st.purge_failures, (uint64_t)n_locked,
                  "the locked runs were purged: this kernel purges locked pages");
    /* only the refused runs may stay dirty: two whole segments and the
     * first word of the third */
    size_t refused_slices = LOCKED_SEGMENTS * FREE_SLICES + 64 - LULL_META_SLICES;
    size_t dirty = lull_arena_count_slices(&a, 0);
    cr_assert_leq(dirty, refused_slices,
                  "%zu slices left dirty after a step over everything, of %zu free; the "
                  "refused runs hold %zu",
                  dirty, (size_t)SEGMENTS * FREE_SLICES, refused_slices);
}
