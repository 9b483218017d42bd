/* The step that purges MADV_FREE'd slices again with MADV_DONTNEED
 * (lull_step_lazy) when its first batch is nothing but runs the kernel
 * refuses to purge (a page the program locked with mlock: EINVAL). Over
 * everything (lull_purge_all's step), a claim that started over from the
 * newest segment each batch, and a batch that purged nothing, ended the
 * step: every lazy slice behind the refused runs stayed MADV_FREE'd
 * (resident until the kernel runs short) after lull_purge_all(), which
 * promises to purge everything. tests/test_step_refused_batch.c and
 * tests/test_step_refused_pages.c are the same case for dirty slices and
 * for parked pages.
 *
 * As there, an arena of the test's own (the library's reclaim thread only
 * walks lull_arenas[]), the steps run here with a plain madvise backend, as
 * lull_purge_all does when no reclaim thread runs. Also: a tick goes on past
 * refused lazy runs, and a refused lazy run is due again (as a dirty one)
 * only a purge delay after its refusal, not at the next tick. */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/resident.h"
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

/* one-slice spans filling two segments; every other slice freed and
 * MADV_FREE'd, so each lazy slice is a run of its own (its neighbours are
 * in use): more lazy runs than a batch claims */
#define SEGMENTS 2
#define FREE_SLICES (LULL_SLICES - LULL_META_SLICES) /* of a segment */
#define SPANS ((int)(SEGMENTS * FREE_SLICES))
#define LAZY_RUNS ((int)(SEGMENTS * FREE_SLICES / 2))
#define LOCKED LULL_STEP_RUNS

static void setup(void) {
    lull_set_purge_delay_ms(-1); /* the library's own thread purges nothing */
    void *p = lull_malloc(64);   /* the library is initialised: segments, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

static lull_arena a;
static char *locked[LOCKED];
/* the steps' backend (plain madvise: zeroed) and counts */
static purge_backend b;
static lull_reclaim_stats st;

/* lazy slices (clean and MADV_FREE'd) of the arena */
static size_t lazy_slices(void) {
    size_t n = 0;
    for (lull_segment *s = atomic_load(&a.segments); s; s = s->next)
        for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            n += (size_t)__builtin_popcountll(x.lazy & x.clean);
        }
    return n;
}

/* Every odd slice freed, written and MADV_FREE'd (a step over everything
 * with MADV_FREE); then a page locked in each of the first LULL_STEP_RUNS
 * lazy runs in claim order (newest segment first): the kernel refuses to
 * purge them again, and they are the whole first batch. */
static void lazy_everywhere(void) {
    static lull_span *spans[SPANS];
    own_arena_fill(&a, spans, SPANS, 1);
    cr_assert_eq(atomic_load(&a.segment_count), SEGMENTS);
    for (int i = 0; i < SPANS; i++) {
        uint8_t *start = lull_span_start(spans[i]);
        if (((uintptr_t)start >> LULL_SLICE_SHIFT) % 2 == 0) continue;
        memset(start, 0x5a, LULL_SLICE_SIZE);
        lull_arena_free_span(spans[i]);
    }
    lull_step_slices(&b, &st, &a, 0, true, MADV_FREE);
    cr_assert_eq(lazy_slices(), LAZY_RUNS);
    int n = 0;
    for (lull_segment *s = atomic_load(&a.segments); s && n < LOCKED; s = s->next)
        for (unsigned w = 0; w < LULL_SLICE_WORDS && n < LOCKED; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            for (uint64_t bits = x.lazy & x.clean; bits && n < LOCKED; bits &= bits - 1) {
                char *p = lull_slice_address(s, w * 64 + (unsigned)__builtin_ctzll(bits));
                /* the system call itself: the sanitizers' mlock() does nothing */
                if (syscall(SYS_mlock, p, 4096) != 0)
                    cr_skip_test("mlock refused (RLIMIT_MEMLOCK)");
                locked[n++] = p;
            }
        }
    cr_assert_eq(n, LOCKED);
    memset(&st, 0, sizeof st); /* the steps' counts from here on */
}

static void unlock_all(void) {
    for (int i = 0; i < LOCKED; i++)
        syscall(SYS_munlock, locked[i], 4096);
}

/* only the refused runs may be left: dirty again, nothing lazy */
static void check_after_steps(void) {
    cr_assert_geq(st.purge_failures, LOCKED,
                  "the locked runs were purged: this kernel purges locked pages");
    size_t lazy = lazy_slices();
    cr_assert_eq(lazy, 0,
                 "%zu MADV_FREE'd slices left after the steps, of %d; the refused batch "
                 "holds %d",
                 lazy, LAZY_RUNS, LOCKED);
    cr_assert_eq(lull_arena_count_slices(&a, 0), LOCKED, "the refused runs are dirty again");
}

Test(step_refused_lazy, purge_all_goes_past_a_batch_of_refused_lazy_runs, .init = setup) {
    lazy_everywhere();
    lull_step_lazy(&b, &st, &a, 0, true);
    unlock_all();
    check_after_steps();
}

/* A tick's step is one batch; the refused runs are dirty after it, so the
 * next tick's claim takes the lazy runs behind them. */
Test(step_refused_lazy, ticks_go_past_a_batch_of_refused_lazy_runs, .init = setup) {
    lazy_everywhere();
    uint32_t now = lull_now_ms();
    lull_step_lazy(&b, &st, &a, now, false);
    lull_step_lazy(&b, &st, &a, now, false);
    unlock_all();
    check_after_steps();
}

/* A refused lazy run is dirty again, freed from the refusal on: due a purge
 * delay later (tests/test_purge_refused.c), not claimed again by the next
 * tick's lazy or dirty step. */
Test(step_refused_lazy, a_refused_lazy_run_waits_a_purge_delay, .init = setup) {
    lazy_everywhere();
    uint32_t first_tick = lull_now_ms();
    lull_step_lazy(&b, &st, &a, first_tick, false); /* the refused batch */
    lull_step_lazy(&b, &st, &a, first_tick, false); /* the rest, purged */
    uint64_t refused = st.purge_failures;
    /* ticks whose slices are due if freed (or MADV_FREE'd) before the
     * first tick's time, less a millisecond: the refused runs are not */
    bool work = lull_step_lazy(&b, &st, &a, first_tick - 1, false);
    work |= lull_step_slices(&b, &st, &a, first_tick - 1, false, MADV_DONTNEED);
    unsigned claimed_again = (unsigned)(st.purge_failures - refused);
    unlock_all();
    cr_assert_geq(refused, LOCKED, "the locked runs were purged: this kernel purges locked pages");
    cr_assert(!work && claimed_again == 0,
              "the refused lazy runs were claimed again at once (%u refusals more)", claimed_again);
}

/* A refused lazy run, dirty again, joins the resident estimate without a
 * check (base/resident.h): its pages are resident whatever lull decides
 * (the locked one for sure), so the estimate, an upper bound on RSS,
 * counts them even past the heap limit. */
Test(step_refused_lazy, a_refused_lazy_run_is_counted_past_the_limit, .init = setup) {
    lazy_everywhere();
    uint64_t before = lull_resident_bytes();
    __atomic_store_n(&lull_config.heap_limit_bytes, (size_t)before, __ATOMIC_RELAXED);
    lull_step_lazy(&b, &st, &a, 0, true);
    uint64_t after = lull_resident_bytes();
    __atomic_store_n(&lull_config.heap_limit_bytes, 0, __ATOMIC_RELAXED);
    unlock_all();
    cr_assert_geq(st.purge_failures, LOCKED,
                  "the locked runs were purged: this kernel purges locked pages");
    cr_assert_eq(after - before, (uint64_t)LOCKED << LULL_SLICE_SHIFT,
                 "the estimate grew by %llu KiB, the refused runs are %d slices",
                 (unsigned long long)(after - before) >> 10, LOCKED);
}
