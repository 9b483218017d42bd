/* A purge step over everything (lull_purge_all's) in which the kernel
 * refuses one run: the step must still go on to the dirty slices its first
 * batch left for the next one. A batch is cut at LULL_STEP_BYTES of claimed
 * slices; a batch that purged less than that because one of its runs was
 * refused (a page the program locked with mlock) read as the last, short
 * batch, and every dirty slice past it stayed dirty after lull_purge_all().
 *
 * The test uses an arena of its own (the library's reclaim thread only
 * walks lull_arenas[]) and runs the step itself, with a backend that is
 * plain madvise, as lull_purge_all does when no reclaim thread runs. */
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

/* two spans a segment, six spans: three segments, more dirty slices than
 * one batch claims (LULL_STEP_BYTES is 1024 slices) */
#define SPAN_SLICES 255
#define SPANS 6
#define LOCKED 4

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* the library is initialised: segments, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

Test(step_refused_run, a_refused_run_does_not_end_the_step_early, .init = setup) {
    _Static_assert((size_t)SPANS * SPAN_SLICES * LULL_SLICE_SIZE > LULL_STEP_BYTES,
                   "more dirty slices than one batch takes");
    static lull_arena a;
    lull_span *spans[SPANS];
    own_arena_fill(&a, spans, SPANS, SPAN_SLICES);
    cr_assert_eq(atomic_load(&a.segment_count), 3);
    /* a locked page in LOCKED extents of the newest segment, which the
     * first batch claims first: the kernel refuses to purge their runs
     * (EINVAL), more slices than the batch claims past its bound (the rest
     * of the 64-slice word that reached it) */
    lull_segment *seg = lull_segment_of(spans[SPANS - 1]);
    char *locked[LOCKED];
    for (int k = 0; k < LOCKED; k++) {
        locked[k] = lull_slice_address(seg, (unsigned)(LULL_SLICES - (k + 1) * LULL_EXTENT_SLICES));
        /* the system call itself: the sanitizers' mlock() does nothing */
        if (syscall(SYS_mlock, locked[k], 4096) != 0)
            cr_skip_test("mlock refused (RLIMIT_MEMLOCK)");
    }
    for (int i = 0; i < SPANS; i++)
        lull_arena_free_span(spans[i]);

    lull_reclaim_stats st;
    own_arena_purge_all(&a, &st);
    for (int k = 0; k < LOCKED; k++)
        syscall(SYS_munlock, locked[k], 4096);

    cr_assert_gt(st.purge_failures, 0,
                 "the locked run was purged: this kernel purges locked pages");
    /* only the refused runs (one 2 MiB extent each) may stay dirty */
    size_t dirty = lull_arena_count_slices(&a, 0);
    cr_assert_leq(dirty, LOCKED * LULL_EXTENT_SLICES,
                  "%zu slices left dirty after a step over everything (%d runs of at most %d "
                  "slices were refused)",
                  dirty, LOCKED, LULL_EXTENT_SLICES);
}
