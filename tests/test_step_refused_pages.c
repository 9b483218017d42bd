/* A purge step of parked pages (lull_step_pages, numa/page_park.h) whose
 * first batch is nothing but runs the kernel refuses to purge (a page the
 * program locked with mlock: MADV_DONTNEED fails with EINVAL). Refused
 * pages go back to PENDING, and a claim that starts over from the
 * segment's first slice takes the very same runs again: the step saw a
 * batch that purged nothing and left the segment, and every parked page
 * behind the refused ones stayed resident, after lull_purge_all() as after
 * every tick. tests/test_step_refused_batch.c is the same case for free
 * slices (lull_step_slices).
 *
 * As there, an arena of the test's own (the library's reclaim thread only
 * walks lull_arenas[]), its pages parked here as an owner would
 * (lull_pages_park), and the step run here with a plain madvise backend,
 * as lull_purge_all does when no reclaim thread runs: once over everything
 * (lull_purge_all's step) and once as the tick's (pages parked a purge
 * delay ago). Also: the cursor where the run bound cuts a slice, and a
 * refused page is due again only a purge delay after its refusal. */
#define _GNU_SOURCE
#include "numa/arena.h"
#include "numa/page_park.h"
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
#include <time.h>
#include <unistd.h>

/* two spans fill a segment */
#define SPAN_SLICES 255
#define SPANS 2
#define PARKED_SLICES (SPANS * SPAN_SLICES)
#define ALL_PAGES 0xffffu

static void setup(void) {
    lull_set_purge_delay_ms(-1); /* the library's own thread purges nothing */
    void *p = lull_malloc(64);   /* the library is initialised: segments, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

static lull_arena a;
static lull_segment *seg;
static char *locked;

/* Every page of both spans touched and parked: one run a slice, and the
 * runs of a batch (LULL_STEP_RUNS of them, from the segment's first free
 * slice on) merged into one range, since they are adjacent. The first page
 * of that range locked: the kernel refuses the whole range, so the first
 * batch is LULL_STEP_RUNS refused runs. */
static void park_everything(void) {
    lull_span *spans[SPANS];
    own_arena_fill(&a, spans, SPANS, SPAN_SLICES);
    cr_assert_eq(atomic_load(&a.segment_count), 1);
    seg = atomic_load(&a.segments);
    char *first = lull_slice_address(seg, LULL_META_SLICES);
    memset(first, 0x5a, (size_t)PARKED_SLICES * LULL_SLICE_SIZE);
    uint32_t now = lull_now_ms();
    for (unsigned i = 0; i < PARKED_SLICES; i++)
        lull_pages_park(seg, LULL_META_SLICES + i, ALL_PAGES, now);
    /* the system call itself: the sanitizers' mlock() does nothing */
    if (syscall(SYS_mlock, first, 4096) != 0) cr_skip_test("mlock refused (RLIMIT_MEMLOCK)");
    locked = first;
}

/* the pages of the parked slices in `state` */
static unsigned pages_in(uint32_t state) {
    unsigned n = 0;
    for (unsigned i = 0; i < PARKED_SLICES; i++)
        n += (unsigned)__builtin_popcount(
            lull_pages_in(lull_pages_word(seg, LULL_META_SLICES + i), state));
    return n;
}

static void check_after_step(const lull_reclaim_stats *st) {
    syscall(SYS_munlock, locked, 4096);
    cr_assert_geq(st->purge_failures, 1,
                  "the locked range was purged: this kernel purges locked pages");
    /* only the refused batch may stay parked: LULL_STEP_RUNS slices */
    unsigned pending = pages_in(LULL_PAGE_PENDING);
    unsigned refused = LULL_STEP_RUNS * LULL_PAGES_PER_SLICE;
    cr_assert_leq(pending, refused,
                  "%u parked pages left unpurged after a step over everything, of %u parked; "
                  "the refused batch holds %u (purged: %u)",
                  pending, PARKED_SLICES * LULL_PAGES_PER_SLICE, refused,
                  pages_in(LULL_PAGE_PURGED));
    cr_assert_eq(pages_in(LULL_PAGE_PURGED) + pending, PARKED_SLICES * LULL_PAGES_PER_SLICE);
    cr_assert_eq(pages_in(LULL_PAGE_PURGING), 0);
}

Test(step_refused_pages, purge_all_goes_past_a_batch_of_refused_pages, .init = setup) {
    park_everything();
    purge_backend b;
    memset(&b, 0, sizeof b);
    lull_reclaim_stats st;
    memset(&st, 0, sizeof st);
    lull_step_pages(&b, &st, &a, 0, true);
    check_after_step(&st);
}

Test(step_refused_pages, a_tick_goes_past_a_batch_of_refused_pages, .init = setup) {
    park_everything();
    purge_backend b;
    memset(&b, 0, sizeof b);
    lull_reclaim_stats st;
    memset(&st, 0, sizeof st);
    /* every page was parked at or before now: all are due */
    lull_step_pages(&b, &st, &a, lull_now_ms(), false);
    check_after_step(&st);
}

/* The cursor where the run bound cuts a slice (a slice of every other page
 * parked is 8 runs): the next claim starts at the cut slice again, so no
 * page of it is left out of the walk, and the walk ends even though every
 * claim is refused (each run goes back to PENDING at once, as a refused
 * purge's). A refused page of a cut slice may be claimed twice, no more. */
#define CUT_SLICES 3
#define CUT_MAX 12 /* a slice and a half */
#define EVERY_OTHER_PAGE 0x5555u

Test(step_refused_pages, a_walk_cut_inside_a_slice_leaves_no_page_out, .init = setup) {
    lull_span *spans[1];
    own_arena_fill(&a, spans, 1, CUT_SLICES);
    seg = atomic_load(&a.segments);
    unsigned first =
        (unsigned)(((char *)lull_span_start(spans[0]) - (char *)seg) >> LULL_SLICE_SHIFT);
    for (unsigned i = 0; i < CUT_SLICES; i++)
        lull_pages_park(seg, first + i, EVERY_OTHER_PAGE, lull_now_ms());
    unsigned claimed[CUT_SLICES][LULL_PAGES_PER_SLICE] = {{0}};
    unsigned at = 0, claims = 0;
    do {
        lull_page_run runs[CUT_MAX];
        size_t n = lull_pages_claim_all(seg, &at, runs, CUT_MAX);
        cr_assert_leq(++claims, 2 * CUT_SLICES, "the walk does not end (at slice %u)", at);
        for (size_t i = 0; i < n; i++) {
            cr_assert_geq(runs[i].slice, first);
            cr_assert_lt(runs[i].slice, first + CUT_SLICES);
            for (uint32_t m = runs[i].mask; m; m &= m - 1)
                claimed[runs[i].slice - first][__builtin_ctz(m)]++;
            lull_pages_finish(&runs[i], false); /* refused: PENDING again */
        }
    } while (at < LULL_SLICES);
    for (unsigned i = 0; i < CUT_SLICES; i++)
        for (unsigned p = 0; p < LULL_PAGES_PER_SLICE; p++) {
            unsigned want_min = (EVERY_OTHER_PAGE >> p & 1) ? 1 : 0;
            unsigned want_max = (EVERY_OTHER_PAGE >> p & 1) ? 2 : 0;
            cr_assert(claimed[i][p] >= want_min && claimed[i][p] <= want_max,
                      "page %u of parked slice %u claimed %u times in one walk", p, i,
                      claimed[i][p]);
        }
}

/* A page the kernel refused is due again a purge delay after the refusal,
 * as a refused run of free slices is (tests/test_purge_refused.c): a tick
 * that claimed it again at once found the same refusal, counted work, and
 * the next tick came BUSY_TICK_MS later: with a locked page parked (every
 * parked page, under mlockall), the reclaim thread ticked every 2 ms for
 * ever, a failed madvise each time. */
Test(step_refused_pages, a_refused_page_waits_a_purge_delay, .init = setup) {
    park_everything();
    struct timespec pause = {0, 5 * 1000000L};
    nanosleep(&pause, NULL); /* the pages are 5 ms old */
    purge_backend b;
    memset(&b, 0, sizeof b);
    lull_reclaim_stats st;
    memset(&st, 0, sizeof st);
    uint32_t first_tick = lull_now_ms();
    lull_step_pages(&b, &st, &a, first_tick, false);
    uint64_t refused = st.purge_failures;
    unsigned pending = pages_in(LULL_PAGE_PENDING);
    /* a tick whose pages are due if parked before the first tick's time,
     * less a millisecond: the pages the first refused are not due yet */
    bool work = lull_step_pages(&b, &st, &a, first_tick - 1, false);
    unsigned claimed_again = (unsigned)(st.purge_failures - refused);
    syscall(SYS_munlock, locked, 4096);
    cr_assert_geq(refused, 1, "the locked range was purged: this kernel purges locked pages");
    cr_assert_eq(pages_in(LULL_PAGE_PENDING), pending);
    cr_assert(!work && claimed_again == 0,
              "the refused pages were claimed again at once (%u refusals more)", claimed_again);
}
