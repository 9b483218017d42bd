/* Node arenas and the slice-state invariant (design.md #1, numa/arena.c): a
 * slice claimed for purging is never handed out while PURGING; purge_done
 * makes it allocatable again, known zero after MADV_DONTNEED and not after
 * MADV_FREE; purge_failed puts it back as dirty; and concurrently, a purge
 * never destroys a span in use.
 *
 * The tests use arenas of their own (the library's reclaim thread only walks
 * lull_arenas[]), and set the purge delay to "never" so that the library's
 * reclaim thread leaves every dirty slice alone. */
#define _GNU_SOURCE
#include "numa/arena.h"
#include "lull.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef LULL_SANITIZED
#define SCALE 4
#else
#define SCALE 1
#endif

#define USABLE_SLICES (LULL_SLICES - LULL_META_SLICES)

static void arena_init(lull_arena *a) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    a->node = 0;
}

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    /* the library is initialised: segments can be mapped, the clock runs */
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
}

static lull_segment *seg_of_span(lull_span *s) {
    return lull_segment_of(s);
}
static unsigned first_of(lull_span *s) {
    return (unsigned)(s - lull_span_table_of(seg_of_span(s))->slices);
}

static bool bit(const _Atomic uint64_t *map, unsigned i) {
    return (atomic_load(&map[i / 64]) >> (i % 64)) & 1;
}

/* Far in the future: every freed slice is old enough. */
static uint32_t future(void) {
    return lull_now_ms() + 100000000u;
}

/* Fill one segment of a with single-slice spans; returns its spans. */
static lull_segment *fill_segment(lull_arena *a, lull_span **spans) {
    lull_segment *seg = NULL;
    for (unsigned i = 0; i < USABLE_SLICES; i++) {
        bool zeroed;
        lull_span *s = lull_arena_alloc_span(a, 1, &zeroed);
        cr_assert_not_null(s);
        if (!seg) seg = seg_of_span(s);
        cr_assert_eq(seg_of_span(s), seg, "span %u left the first segment", i);
        cr_assert(zeroed, "a fresh segment's slice is not known zero");
        cr_assert_eq(s->slice_count, 1);
        spans[first_of(s)] = s;
    }
    cr_assert_eq(atomic_load(&a->segment_count), 1);
    return seg;
}

/* The slices freed by the tests: runs that cross 2 MiB extents and 64-slice
 * words. */
static bool in_freed_set(unsigned i) {
    return (i >= 10 && i < 20) || (i >= 40 && i < 100) || i == 300 || (i >= 500 && i < 512);
}

static void free_set(lull_span **spans) {
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++)
        if (in_freed_set(i)) {
            memset(lull_span_start(spans[i]), 0xc3, LULL_SLICE_SIZE);
            lull_arena_free_span(spans[i]);
        }
}

/* Claim every dirty slice; check the runs are exactly the freed set, cut at
 * extents. Returns the number of runs. */
static size_t claim_all(lull_arena *a, lull_segment *seg, lull_slice_run *runs, size_t max) {
    size_t n = lull_arena_claim_dirty(a, future(), NULL, runs, max, (size_t)1 << 40);
    cr_assert_gt(n, 0);
    uint64_t claimed[LULL_SLICE_WORDS] = {0};
    for (size_t r = 0; r < n; r++) {
        cr_assert_eq(runs[r].segment, seg);
        cr_assert_gt(runs[r].count, 0);
        unsigned first = runs[r].first, last = first + runs[r].count - 1;
        cr_assert_eq(first / LULL_EXTENT_SLICES, last / LULL_EXTENT_SLICES,
                     "run %u+%u crosses a 2 MiB extent", first, runs[r].count);
        for (unsigned i = first; i <= last; i++) {
            cr_assert_not((claimed[i / 64] >> (i % 64)) & 1, "slice %u claimed twice", i);
            claimed[i / 64] |= (uint64_t)1 << (i % 64);
        }
    }
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++) {
        bool c = (claimed[i / 64] >> (i % 64)) & 1;
        cr_assert_eq(c, in_freed_set(i), "slice %u: claimed %d, freed %d", i, c, in_freed_set(i));
        cr_assert_eq(bit(lull_slice_maps_of(seg)->purging, i), c, "slice %u purging bit", i);
        cr_assert_not(bit(lull_slice_maps_of(seg)->dirty, i),
                      "slice %u still dirty after the claim", i);
    }
    return n;
}

static bool overlaps_runs(lull_span *s, const lull_slice_run *runs, size_t n) {
    for (size_t r = 0; r < n; r++) {
        if (runs[r].segment != seg_of_span(s)) continue;
        unsigned a0 = first_of(s), a1 = a0 + s->slice_count;
        unsigned b0 = runs[r].first, b1 = b0 + runs[r].count;
        if (a0 < b1 && b0 < a1) return true;
    }
    return false;
}

Test(arena, purging_slices_are_never_handed_out, .init = setup) {
    static lull_arena a;
    arena_init(&a);
    static lull_span *spans[LULL_SLICES];
    lull_segment *seg = fill_segment(&a, spans);
    free_set(spans);
    lull_slice_run runs[64];
    size_t n = claim_all(&a, seg, runs, 64);

    /* the first segment has no free slice but the PURGING ones: every
     * allocation, of every length, comes from elsewhere */
    for (int i = 0; i < 300; i++) {
        bool zeroed;
        unsigned len = 1 + (unsigned)(i % 12);
        lull_span *s = lull_arena_alloc_span(&a, len, &zeroed);
        cr_assert_not_null(s);
        cr_assert_not(overlaps_runs(s, runs, n), "span %u+%u overlaps a PURGING run", first_of(s),
                      len);
        cr_assert_neq(seg_of_span(s), seg);
        if (i % 3 == 0) lull_arena_free_span(s); /* some dirty slices elsewhere */
    }
    for (size_t r = 0; r < n; r++)
        for (unsigned i = runs[r].first; i < runs[r].first + runs[r].count; i++)
            cr_assert(bit(lull_slice_maps_of(seg)->purging, i));

    /* purge failed: the slices are dirty again, allocatable, not zero */
    for (size_t r = 0; r < n; r++)
        lull_arena_purge_failed(&runs[r]);
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++) {
        cr_assert_not(bit(lull_slice_maps_of(seg)->purging, i));
        cr_assert_eq(bit(lull_slice_maps_of(seg)->dirty, i), in_freed_set(i), "slice %u", i);
    }
    /* a 60-slice span fits only in the run 40..99 of the first segment */
    bool zeroed = true;
    lull_span *s = lull_arena_alloc_span(&a, 60, &zeroed);
    cr_assert_not_null(s);
    cr_assert_eq(seg_of_span(s), seg, "the dirty run given back by purge_failed was not reused");
    cr_assert_eq(first_of(s), 40);
    cr_assert_not(zeroed, "dirty slices reported zero");
    cr_assert_eq(((unsigned char *)lull_span_start(s))[LULL_SLICE_SIZE * 59], 0xc3,
                 "purge_failed lost the contents of a dirty slice");
}

static void purge_done_case(bool lazy) {
    static lull_arena a;
    arena_init(&a);
    static lull_span *spans[LULL_SLICES];
    lull_segment *seg = fill_segment(&a, spans);
    free_set(spans);
    lull_slice_run runs[64];
    size_t n = claim_all(&a, seg, runs, 64);
    for (size_t r = 0; r < n; r++) {
        /* what the purge does to the memory (MADV_FREE may keep it) */
        if (!lazy)
            memset(lull_slice_address(seg, runs[r].first), 0,
                   (size_t)runs[r].count * LULL_SLICE_SIZE);
        lull_arena_purge_done(&runs[r], lazy);
    }
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++) {
        cr_assert_not(bit(lull_slice_maps_of(seg)->purging, i));
        cr_assert_not(bit(lull_slice_maps_of(seg)->dirty, i));
        cr_assert_eq(bit(lull_slice_maps_of(seg)->clean, i), in_freed_set(i), "slice %u", i);
        cr_assert_eq(bit(lull_slice_maps_of(seg)->lazy, i), lazy && in_freed_set(i), "slice %u", i);
    }
    /* the first segment is the arena's only one: its clean slices serve the
     * next allocations, which must not map a new segment */
    static const unsigned lens[] = {60, 10, 12, 1};
    static const unsigned firsts[] = {40, 10, 500, 300};
    for (int k = 0; k < 4; k++) {
        bool zeroed = !lazy;
        lull_span *s = lull_arena_alloc_span(&a, lens[k], &zeroed);
        cr_assert_not_null(s);
        cr_assert_eq(seg_of_span(s), seg, "purged slices were not reused");
        cr_assert_eq(first_of(s), firsts[k]);
        cr_assert_eq(zeroed, !lazy, "purge_done(lazy=%d) slices reported zeroed=%d", lazy, zeroed);
        if (zeroed) {
            const unsigned char *m = lull_span_start(s);
            for (size_t i = 0; i < (size_t)lens[k] * LULL_SLICE_SIZE; i += 512)
                cr_assert_eq(m[i], 0);
        }
    }
    cr_assert_eq(atomic_load(&a.segment_count), 1);
    /* the lazy bit went with the claim: nothing is left behind */
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        cr_assert_eq(atomic_load(&lull_slice_maps_of(seg)->lazy[w]), 0);
        cr_assert_eq(atomic_load(&lull_slice_maps_of(seg)->clean[w]), 0);
    }
}

Test(arena, purge_done_dontneed_gives_zeroed_slices, .init = setup) {
    purge_done_case(false);
}

Test(arena, purge_done_lazy_gives_slices_not_known_zero, .init = setup) {
    purge_done_case(true);
}

Test(arena, a_span_over_clean_and_dirty_slices_is_not_zeroed, .init = setup) {
    static lull_arena a;
    arena_init(&a);
    bool zeroed;
    lull_span *s1 = lull_arena_alloc_span(&a, 4, &zeroed);
    cr_assert_not_null(s1);
    cr_assert(zeroed);
    cr_assert_eq(first_of(s1), LULL_META_SLICES);
    lull_arena_free_span(s1);
    /* 8 slices: the 4 dirty ones and 4 clean ones after them */
    lull_span *s2 = lull_arena_alloc_span(&a, 8, &zeroed);
    cr_assert_not_null(s2);
    cr_assert_eq(first_of(s2), LULL_META_SLICES, "dirty slices were not preferred");
    cr_assert_not(zeroed);
    /* every slice of the span knows its head */
    lull_segment *seg = seg_of_span(s2);
    for (unsigned i = 0; i < 8; i++) {
        char *addr = (char *)lull_slice_address(seg, LULL_META_SLICES + i) + 100;
        cr_assert_eq(lull_span_of(seg, addr), s2);
    }
    cr_assert_eq(s2->slice_count, 8);
}

Test(arena, claim_respects_the_free_time_and_the_run_limit, .init = setup) {
    static lull_arena a;
    arena_init(&a);
    static lull_span *spans[LULL_SLICES];
    lull_segment *seg = fill_segment(&a, spans);
    free_set(spans);
    lull_slice_run runs[64];
    /* freed after the deadline: nothing is old enough */
    uint32_t now = lull_now_ms();
    cr_assert_eq(lull_arena_claim_dirty(&a, now - 60000, NULL, runs, 64, (size_t)1 << 40), 0);
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++)
        cr_assert_eq(bit(lull_slice_maps_of(seg)->dirty, i), in_freed_set(i));
    /* one run at a time: the rest stays dirty and comes in later claims */
    unsigned got = 0, claims = 0;
    for (;;) {
        size_t n = lull_arena_claim_dirty(&a, future(), NULL, runs, 1, (size_t)1 << 40);
        if (!n) break;
        cr_assert_eq(n, 1);
        claims++;
        got += runs[0].count;
        for (unsigned i = runs[0].first; i < runs[0].first + runs[0].count; i++) {
            cr_assert(in_freed_set(i));
            cr_assert(bit(lull_slice_maps_of(seg)->purging, i));
        }
        lull_arena_purge_done(&runs[0], false);
        cr_assert_lt(claims, 100u);
    }
    unsigned expect = 0;
    for (unsigned i = 0; i < LULL_SLICES; i++)
        expect += in_freed_set(i);
    cr_assert_eq(got, expect, "claims one run at a time lost slices: %u of %u", got, expect);
    /* 10..19 | 40..63 64..95 96..99 (extent cuts at 64 and 96, word cut at
     * 64) | 300 | 500..511 */
    cr_assert_eq(claims, 6u);
}

/* ---- concurrency: a purge never destroys a span in use ------------------ */

#define CONC_ITERS (20000 / SCALE)
/* The purger must have competed for this many slices before the allocators
 * stop: they run on until it has (an event), not for CONC_ITERS alone. On
 * a loaded machine the purger was scheduled late and claimed 83 slices
 * while the allocators did their 20,000 spans, and the test failed. */
#define CONC_CLAIMED_MIN 100ul

static lull_arena conc_arena;
static atomic_bool conc_stop;
static atomic_ulong conc_claimed_slices, conc_allocs;
static char conc_fail[256];
static atomic_bool conc_failed;

static void conc_report(const char *msg, void *addr, unsigned len) {
    if (atomic_exchange(&conc_failed, true)) return;
    snprintf(conc_fail, sizeof conc_fail, "%s (span %p, %u slices)", msg, addr, len);
}

static void *purger(void *arg) {
    (void)arg;
    lull_slice_run runs[32];
    unsigned k = 0;
    while (!atomic_load(&conc_stop)) {
        size_t n = lull_arena_claim_dirty(&conc_arena, future(), NULL, runs, 32, (size_t)64 << 20);
        for (size_t r = 0; r < n; r++) {
            char *addr = lull_slice_address(runs[r].segment, runs[r].first);
            size_t len = (size_t)runs[r].count * LULL_SLICE_SIZE;
            memset(addr, 0xee, len); /* a marker: any owner would notice */
            memset(addr, 0, len);    /* the purge */
            atomic_fetch_add(&conc_claimed_slices, runs[r].count);
            switch (k++ % 3) {
            case 0:
                lull_arena_purge_done(&runs[r], false);
                break;
            case 1:
                lull_arena_purge_done(&runs[r], true);
                break;
            default:
                lull_arena_purge_failed(&runs[r]);
                break;
            }
        }
    }
    return NULL;
}

static void *allocator(void *arg) {
    uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ULL + 1;
    lull_span *held[4] = {0};
    uint64_t tag[4] = {0};
    for (int it = 0; (it < CONC_ITERS || atomic_load(&conc_claimed_slices) <= CONC_CLAIMED_MIN) &&
                     !atomic_load(&conc_failed);
         it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned slot = (unsigned)(x % 4);
        if (held[slot]) {
            lull_span *s = held[slot];
            uint64_t *m = (uint64_t *)lull_span_start(s);
            size_t words = lull_span_bytes(s) / 8;
            for (size_t i = 0; i < words; i += 61)
                if (m[i] != (tag[slot] ^ i)) {
                    conc_report("a span in use was overwritten", m, s->slice_count);
                    return NULL;
                }
            lull_arena_free_span(s);
            held[slot] = NULL;
        }
        unsigned len = 1 + (unsigned)((x >> 20) % 8);
        bool zeroed;
        lull_span *s = lull_arena_alloc_span(&conc_arena, len, &zeroed);
        if (!s) {
            conc_report("alloc_span failed", NULL, len);
            return NULL;
        }
        atomic_fetch_add(&conc_allocs, 1);
        uint64_t *m = (uint64_t *)lull_span_start(s);
        size_t words = lull_span_bytes(s) / 8;
        if (zeroed)
            for (size_t i = 0; i < words; i += 509)
                if (m[i] != 0) {
                    conc_report("a span reported zeroed is not", m, len);
                    return NULL;
                }
        tag[slot] = x | 1;
        for (size_t i = 0; i < words; i += 61)
            m[i] = tag[slot] ^ i;
        held[slot] = s;
    }
    for (int i = 0; i < 4; i++)
        if (held[i]) lull_arena_free_span(held[i]);
    return NULL;
}

Test(arena, concurrent_purges_never_destroy_a_span_in_use, .init = setup, .timeout = 120) {
    arena_init(&conc_arena);
    pthread_t p, t1, t2;
    cr_assert_eq(pthread_create(&p, NULL, purger, NULL), 0);
    cr_assert_eq(pthread_create(&t1, NULL, allocator, (void *)1), 0);
    cr_assert_eq(pthread_create(&t2, NULL, allocator, (void *)2), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    atomic_store(&conc_stop, true);
    pthread_join(p, NULL);
    cr_assert_not(atomic_load(&conc_failed), "%s", conc_fail);
    cr_log_info("%lu spans, %lu slices claimed, %u segments", atomic_load(&conc_allocs),
                atomic_load(&conc_claimed_slices), atomic_load(&conc_arena.segment_count));
    cr_assert_geq(atomic_load(&conc_allocs), 2ul * CONC_ITERS);
    /* the purger really competed for slices */
    cr_assert_gt(atomic_load(&conc_claimed_slices), CONC_CLAIMED_MIN, "only %lu slices claimed",
                 atomic_load(&conc_claimed_slices));
    /* two threads holding at most 4 spans of 8 slices each need little,
     * however many slices the purger holds at a time */
    cr_assert_leq(atomic_load(&conc_arena.segment_count), 8u);
}

/* Slices given back with MADV_FREE are still resident until the kernel
 * needs the memory: a span takes them before never-touched clean slices
 * (else each burst of a workload touches fresh memory and RSS climbs past
 * its working set), and after dirty ones. */
Test(arena, lazy_slices_are_taken_before_fresh_clean_ones, .init = setup) {
    static lull_arena a;
    arena_init(&a);
    bool zeroed;
    lull_span *low = lull_arena_alloc_span(&a, 4, &zeroed);
    lull_span *high = lull_arena_alloc_span(&a, 4, &zeroed);
    lull_span *keep = lull_arena_alloc_span(&a, 4, &zeroed);
    cr_assert(low && high && keep);
    lull_segment *seg = seg_of_span(low);
    unsigned high_first = first_of(high);
    cr_assert_gt(high_first, first_of(low));
    /* high: purged with MADV_FREE (lazy); low: purged with MADV_DONTNEED */
    lull_arena_free_span(high);
    lull_slice_run runs[8];
    size_t n = lull_arena_claim_dirty(&a, future(), NULL, runs, 8, (size_t)1 << 40);
    cr_assert_eq(n, 1);
    lull_arena_purge_done(&runs[0], true);
    lull_arena_free_span(low);
    n = lull_arena_claim_dirty(&a, future(), NULL, runs, 8, (size_t)1 << 40);
    cr_assert_eq(n, 1);
    memset(lull_slice_address(seg, runs[0].first), 0, (size_t)runs[0].count * LULL_SLICE_SIZE);
    lull_arena_purge_done(&runs[0], false);
    /* a dirty span elsewhere is still taken first */
    lull_arena_free_span(keep);
    lull_span *s = lull_arena_alloc_span(&a, 4, &zeroed);
    cr_assert_eq(s, keep, "dirty slices were not taken first");
    s = lull_arena_alloc_span(&a, 4, &zeroed);
    cr_assert_eq(first_of(s), high_first, "took slices at %u, not the lazily freed ones at %u",
                 first_of(s), high_first);
    cr_assert_not(zeroed, "MADV_FREE'd slices are not known to be zero");
    for (unsigned i = high_first; i < high_first + 4; i++)
        cr_assert_not(bit(lull_slice_maps_of(seg)->lazy, i), "slice %u still marked lazy", i);
}

/* A steady churn takes the same slices again: the search is first fit from
 * the newest segment, not next fit from where the last search succeeded, so
 * the dirty slices a churn does not need stop being taken, age, and are
 * purged. Next fit walked a working set larger than a segment through every
 * dirty slice of the arena, each taken again before it was old enough to
 * purge (tests/soak with a 2 s delay: 490 MiB dirty at 64 MiB live). */
Test(arena, a_steady_churn_takes_the_same_slices_again, .init = setup) {
    enum { SLICES = 16, PER_SEGMENT = USABLE_SLICES / SLICES, SEGMENTS = 6 };
    enum { ALL = PER_SEGMENT * SEGMENTS, LIVE = PER_SEGMENT + PER_SEGMENT / 2 };
    static lull_arena a;
    arena_init(&a);
    bool zeroed;
    static lull_span *span[ALL];
    for (int i = 0; i < ALL; i++)
        cr_assert_not_null(span[i] = lull_arena_alloc_span(&a, SLICES, &zeroed));
    for (int i = 0; i < ALL; i++)
        lull_arena_free_span(span[i]); /* all of them dirty */
    /* a FIFO of LIVE spans, one taken and the oldest given back each round */
    static lull_span *fifo[LIVE], *seen[ALL];
    int distinct = 0;
    for (int r = 0; r < 4 * ALL; r++) {
        if (r >= LIVE) lull_arena_free_span(fifo[r % LIVE]);
        lull_span *s = fifo[r % LIVE] = lull_arena_alloc_span(&a, SLICES, &zeroed);
        cr_assert_not_null(s);
        int k = 0;
        while (k < distinct && seen[k] != s)
            k++;
        if (k == distinct) seen[distinct++] = s;
    }
    cr_assert_leq(distinct, LIVE, "a churn of %d spans took %d places of %d", LIVE, distinct, ALL);
    for (int r = 0; r < LIVE; r++)
        lull_arena_free_span(fifo[r]);
}
