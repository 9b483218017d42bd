/* The segment run (base/segment_map.h): free() takes a pointer inside it
 * for a pointer inside a segment, and goes to the segment map for any
 * other. So the run must hold segments only, back to back: huge blocks
 * are placed in a region of their own (base/os.c), whose hint starts over
 * when it passes the region's end; a segment that could not be placed at
 * the run's end is freed through the map, and a second free of one of its
 * blocks still aborts naming it. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/os.h"
#include "base/segment_map.h"
#include "numa/span_table.h"
#include "src/span.h"

#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define MiB ((size_t)1 << 20)

static uintptr_t run_end(void) {
    return atomic_load(&lull_the_segment_run.lo) + atomic_load(&lull_the_segment_run.len);
}

static void warm(void) {
    lull_free(lull_malloc(16));
    cr_assert_gt(atomic_load(&lull_the_segment_run.len), 0, "the first segment is in the run");
}

static char a_global[64];

Test(segment_run, small_and_large_blocks_are_in_it_and_nothing_else_is, .init = warm) {
    static const size_t sizes[] = {16, 48, 1024, 4000, 64 << 10, MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        char *p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        cr_assert(lull_in_segment_run(p), "%zu B at %p: not in the run", sizes[k], (void *)p);
        cr_assert(lull_in_segment_run(p + sizes[k] - 1));
        lull_free(p);
    }
    char *huge = lull_malloc(64 * MiB);
    cr_assert_not_null(huge);
    cr_assert(!lull_in_segment_run(huge), "a huge block at %p is in the run", (void *)huge);
    cr_assert(lull_owns(huge));
    lull_free(huge);
    long on_stack = 0;
    cr_assert(!lull_in_segment_run(NULL));
    cr_assert(!lull_in_segment_run(&on_stack));
    cr_assert(!lull_in_segment_run(a_global));
    cr_assert(!lull_in_segment_run((void *)run_end()));
}

/* Huge blocks taken between two segments would end the run at the first:
 * with them placed among the segments (one hint for both, as before the
 * run), the segments made after them were outside it. */
Test(segment_run, segments_made_after_huge_blocks_join_it, .init = warm) {
    enum { HUGE = 6, LARGE = 120 };
    void *huge[HUGE], *large[LARGE];
    for (int i = 0; i < HUGE; i++) {
        huge[i] = lull_malloc(40 * MiB);
        cr_assert_not_null(huge[i]);
    }
    uintptr_t len_before = atomic_load(&lull_the_segment_run.len);
    for (int i = 0; i < LARGE; i++) { /* 120 MiB: new segments */
        large[i] = lull_malloc(MiB);
        cr_assert_not_null(large[i]);
        cr_assert(lull_in_segment_run(large[i]), "block %d (%p) is outside the run [%#lx, %#lx)", i,
                  large[i], (unsigned long)atomic_load(&lull_the_segment_run.lo),
                  (unsigned long)run_end());
    }
    cr_assert_geq(atomic_load(&lull_the_segment_run.len), len_before + 2 * LULL_SEGMENT_SIZE,
                  "the run grew by the new segments");
    for (int i = 0; i < LARGE; i++)
        lull_free(large[i]);
    for (int i = 0; i < HUGE; i++)
        lull_free(huge[i]);
}

static void do_free(void *p) {
    lull_free(p);
}

static void do_free_twice(void *p) {
    lull_free(p);
    lull_free(p);
}

/* Something else at the run's end: the next segment goes past it, and its
 * blocks are found through the map. */
Test(segment_run, a_segment_placed_past_it_is_freed_through_the_map, .init = warm) {
    void *blocker = MAP_FAILED;
    for (int attempt = 0; attempt < 8 && blocker == MAP_FAILED; attempt++) {
        /* the reclaim thread may map a spare segment there meanwhile */
        void *at = (void *)run_end();
        blocker = mmap(at, LULL_SEGMENT_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (blocker != MAP_FAILED && blocker != at) {
            munmap(blocker, LULL_SEGMENT_SIZE);
            blocker = MAP_FAILED;
        }
    }
    cr_assert_neq(blocker, MAP_FAILED, "no mapping could be placed at the run's end");
    uintptr_t len_blocked = atomic_load(&lull_the_segment_run.len);
    enum { LARGE = 200 };
    void *large[LARGE];
    char *outside = NULL;
    int n = 0;
    while (n < LARGE && !outside) { /* at most 200 MiB: a new segment */
        large[n] = lull_malloc(MiB);
        cr_assert_not_null(large[n]);
        if (!lull_in_segment_run(large[n])) outside = large[n];
        n++;
    }
    cr_assert_not_null(outside, "no block outside the run after %d MiB", n);
    cr_assert_eq(atomic_load(&lull_the_segment_run.len), len_blocked,
                 "the run grew over the mapping at its end");
    cr_assert(lull_owns(outside));
    memset(outside, 0x5a, MiB);
    lull_free(outside);
    char *again = lull_malloc(MiB);
    cr_assert_not_null(again);
    child_result r;
    run_in_child(do_free_twice, again, &r);
    expect_abort(&r, again, "double free");
    run_in_child(do_free, (char *)blocker + 4096, &r);
    expect_abort(&r, (char *)blocker + 4096, "not allocated by lull");
    lull_free(again);
    for (int i = 0; i < n - 1; i++)
        lull_free(large[i]);
    munmap(blocker, LULL_SEGMENT_SIZE);
}

/* Placement hints never come back by themselves, and one past the end of
 * the address space fails as a limit would: the huge blocks' hint starts
 * over at its region's start. Each mapping here is unmapped at once, as
 * the reclaim thread unmaps a freed huge block; one more than the region
 * holds must wrap. */
Test(segment_run, the_huge_hint_starts_over_at_its_region_end, .init = warm) {
    uintptr_t lo, hi;
    lull_os_huge_region(&lo, &hi);
    cr_assert(lo && hi > lo);
    size_t rounds = (hi - lo) / LULL_SEGMENT_SIZE + 2;
    uintptr_t last = 0;
    bool wrapped = false;
    for (size_t i = 0; i < rounds; i++) {
        void *p = lull_os_huge_map_aligned(LULL_SEGMENT_SIZE, LULL_SEGMENT_SIZE, 0);
        cr_assert_not_null(p, "mapping %zu of %zu failed (errno %d)", i, rounds, errno);
        cr_assert((uintptr_t)p >= lo && (uintptr_t)p + LULL_SEGMENT_SIZE <= hi,
                  "mapping %zu at %p outside [%#lx, %#lx)", i, p, (unsigned long)lo,
                  (unsigned long)hi);
        if ((uintptr_t)p < last) wrapped = true;
        last = (uintptr_t)p;
        munmap(p, LULL_SEGMENT_SIZE);
    }
    cr_assert(wrapped);
}

/* The run's span table (numa/span_table.h) is what free() reads for a
 * pointer inside the run: for every slice of every segment in it, its
 * entry must lead where span_head does, with spans taken, split and given
 * back. */
static void expect_run_table_matches_span_heads(void) {
    uintptr_t lo = atomic_load(&lull_the_segment_run.lo);
    uintptr_t len = atomic_load(&lull_the_segment_run.len);
    cr_assert_leq(len, LULL_RUN_MAX_BYTES);
    for (uintptr_t seg = lo; seg < lo + len; seg += LULL_SEGMENT_SIZE) {
        lull_span_table *table = lull_span_table_of((lull_segment *)seg);
        for (unsigned i = 0; i < LULL_SLICES; i++) {
            lull_span *want = (lull_span *)((char *)table->slices + table->span_head[i]);
            lull_span *got = lull_run_spans[((seg - lo) >> LULL_SLICE_SHIFT) + i];
            cr_assert_eq(got, want,
                         "segment %#lx slice %u: the run's table leads to %p, span_head to %p",
                         (unsigned long)seg, i, (void *)got, (void *)want);
        }
    }
}

Test(segment_run, its_span_table_leads_every_slice_where_span_head_does, .init = warm) {
    enum { N = 300 };
    static const size_t sizes[] = {16, 200, 1024, 9000, 70 << 10, 700 << 10, 3 * MiB};
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = lull_malloc(sizes[i % 7]);
        cr_assert_not_null(p[i]);
        cr_assert(lull_in_segment_run(p[i]));
        uintptr_t off = (uintptr_t)p[i] - atomic_load(&lull_the_segment_run.lo);
        cr_assert_eq(lull_run_span_at(off), lull_span_of(lull_segment_of(p[i]), p[i]));
    }
    expect_run_table_matches_span_heads();
    for (int i = 0; i < N; i += 2) /* every other block: spans given back among live ones */
        lull_free(p[i]);
    lull_thread_collect();
    expect_run_table_matches_span_heads();
    for (int i = 1; i < N; i += 2)
        lull_free(p[i]);
    lull_thread_collect();
    expect_run_table_matches_span_heads();
}

/* The run stops where its span table ends: a segment that lies back to
 * back past LULL_RUN_MAX_BYTES stays outside it (found through the map),
 * or free() would read past the table. The run is made to reach one
 * segment short of its end (the segments between are not there, and
 * nothing frees into them), then two stand-ins are published: the first
 * joins, the second must not. */
Test(segment_run, it_never_reaches_past_its_span_table, .init = warm) {
    uintptr_t lo = atomic_load(&lull_the_segment_run.lo);
    uintptr_t len_before = atomic_load(&lull_the_segment_run.len);
    uintptr_t at[2] = {lo + LULL_RUN_MAX_BYTES - LULL_SEGMENT_SIZE, lo + LULL_RUN_MAX_BYTES};
    void *m[2];
    for (int k = 0; k < 2; k++) {
        m[k] = mmap((void *)at[k], LULL_SEGMENT_SIZE, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        /* a ThreadSanitizer build's huge region starts there */
        if (m[k] != (void *)at[k]) cr_skip_test("%#lx is taken", (unsigned long)at[k]);
        ((lull_segment *)m[k])->magic = LULL_SEGMENT_MAGIC;
    }
    atomic_store(&lull_the_segment_run.len, LULL_RUN_MAX_BYTES - LULL_SEGMENT_SIZE);
    lull_segment_publish(at[0]);
    lull_segment_publish(at[1]);
    uintptr_t len = atomic_load(&lull_the_segment_run.len);
    lull_segment_map_set(at[0], false);
    lull_segment_map_set(at[1], false);
    atomic_store(&lull_the_segment_run.len, len_before);
    cr_assert_eq(len, LULL_RUN_MAX_BYTES, "the run reaches %#lx bytes, its table %#lx",
                 (unsigned long)len, (unsigned long)LULL_RUN_MAX_BYTES);
}
