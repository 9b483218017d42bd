/* Placement that fills huge pages densely (numa/region_filler.h, issue 16):
 * with thp on, a span smaller than a 2 MiB region goes into the fullest
 * region that has a run for it, not the first one that does.
 *
 * The run search is checked against a brute-force one; the placement on
 * an arena of the test's own (the library's reclaim thread walks only
 * lull_arenas[]), with the purge delay "never" so that no dirty slice is
 * purged meanwhile. */
#define _GNU_SOURCE
#include "numa/arena.h"
#include "numa/region_filler.h"
#include "numa/span_table.h"
#include "numa/thp.h"
#include "lull.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <string.h>

const char *lull_conf = "thp=auto";

#define REGION LULL_THP_REGION_SLICES

static int brute_run_start(uint32_t avail, unsigned n) {
    for (unsigned i = 0; i + n <= 32; i++) {
        unsigned k = 0;
        while (k < n && (avail >> (i + k) & 1))
            k++;
        if (k == n) return (int)i;
    }
    return -1;
}

Test(region_filler, the_run_search_finds_the_lowest_run_inside_the_region) {
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (unsigned round = 0; round < 20000; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* sparse and dense maps alike: AND or OR of two draws */
        uint32_t avail = round % 3 == 0   ? (uint32_t)x & (uint32_t)(x >> 32)
                         : round % 3 == 1 ? (uint32_t)x | (uint32_t)(x >> 32)
                                          : (uint32_t)x;
        unsigned n = 1 + (unsigned)(x >> 59) % 32;
        cr_assert_eq(lull_region_run_start(avail, n), brute_run_start(avail, n), "avail %#x, n %u",
                     avail, n);
    }
    cr_assert_eq(lull_region_run_start(0xffffffffu, 32), 0);
    cr_assert_eq(lull_region_run_start(0x7fffffffu, 32), -1);
    cr_assert_eq(lull_region_run_start(0xc0000000u, 2), 30);
    cr_assert_eq(lull_region_run_start(0x80000001u, 2), -1, "a run does not wrap around");
}

Test(region_filler, the_fullest_region_with_a_run_wins) {
    lull_region_choice best = {0};
    int seg_a, seg_b;
    /* word 0: region 0 has 20 free slices (a run of 3), region 1 has 5 free
     * slices but no run of 3 */
    uint64_t free0 = 0xfffffu | (uint64_t)0x15 << 32 | (uint64_t)0x3 << 40;
    lull_region_consider(&best, &seg_a, 0, free0, free0, 3);
    cr_assert_eq(best.segment, &seg_a);
    cr_assert_eq(best.first, 0);
    cr_assert_eq(best.region_free, 20);
    /* a fuller region elsewhere, with a run of 3 at its slice 4 */
    uint64_t free1 = (uint64_t)0x70 << 32 | (uint64_t)1 << 60;
    lull_region_consider(&best, &seg_b, 3, free1, free1, 3);
    cr_assert_eq(best.segment, &seg_b);
    cr_assert_eq(best.first, 3 * 64 + 32 + 4);
    cr_assert_eq(best.region_free, 4);
    /* as full, but later: the earlier choice stays */
    lull_region_consider(&best, &seg_a, 5, free1, free1, 3);
    cr_assert_eq(best.segment, &seg_b);
    /* only the pass's slices make a run: free ones it may not take count
     * toward fullness alone */
    lull_region_choice c = {0};
    lull_region_consider(&c, &seg_a, 0, 0x1, 0xff, 2);
    cr_assert_null(c.segment);
}

/* ---- placement in an arena ------------------------------------------- */

#define USABLE_SLICES (LULL_SLICES - LULL_META_SLICES)
static lull_span *spans[LULL_SLICES];

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* initialised: segments can be mapped */
    cr_assert_not_null(p);
    lull_free(p);
}

static unsigned first_of(lull_span *s) {
    return (unsigned)(s - lull_span_table_of(lull_segment_of(s))->slices);
}

static lull_span *take(lull_arena *a, unsigned n) {
    bool zeroed;
    lull_span *s = lull_arena_alloc_span(a, n, &zeroed);
    cr_assert_not_null(s);
    return s;
}

/* One segment of single-slice spans. */
static void fill(lull_arena *a) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    for (unsigned i = 0; i < USABLE_SLICES; i++) {
        lull_span *s = take(a, 1);
        spans[first_of(s)] = s;
    }
    cr_assert_eq(atomic_load(&a->segment_count), 1, "the fill left the first segment");
}

/* Then regions 3, 5 and 9 given back but for 1, 12 and 30 of their slices:
 * 31, 20 and 2 free. */
static void fragment(lull_arena *a) {
    fill(a);
    static const struct { unsigned region, kept; } holes[] = {{3, 1}, {5, 12}, {9, 30}};
    for (unsigned h = 0; h < 3; h++)
        for (unsigned i = holes[h].kept; i < REGION; i++)
            lull_arena_free_span(spans[holes[h].region * REGION + i]);
}

Test(region_filler, spans_fill_the_fullest_region_first, .init = setup) {
    if (!lull_thp_on()) cr_skip_test("thp unavailable here (system THP never?)");
    lull_arena a;
    fragment(&a);
    /* region 9 (2 free) before 5 (20) before 3 (31): first fit would take 3 */
    cr_assert_eq(first_of(take(&a, 1)) / REGION, 9);
    /* region 9 has one slice left: a 2-slice span goes to region 5 */
    lull_span *two = take(&a, 2);
    cr_assert_eq(first_of(two) / REGION, 5);
    cr_assert_eq(first_of(take(&a, 1)) / REGION, 9, "region 9's last slice");
    /* region 9 is full; 5 (18 free) before 3 (31) until 5 is full */
    for (unsigned i = 0; i < 18; i++)
        cr_assert_eq(first_of(take(&a, 1)) / REGION, 5, "slice %u of region 5's 18", i);
    cr_assert_eq(first_of(take(&a, 1)) / REGION, 3);
}

Test(region_filler, a_span_no_region_fits_takes_a_run_across_regions, .init = setup) {
    if (!lull_thp_on()) cr_skip_test("thp unavailable here (system THP never?)");
    lull_arena a;
    fill(&a);
    /* a run of 3 across regions 3 and 4 (slices 126-128), and one inside
     * region 9 (slices 298-300) */
    for (unsigned i = 126; i <= 128; i++)
        lull_arena_free_span(spans[i]);
    for (unsigned i = 298; i <= 300; i++)
        lull_arena_free_span(spans[i]);
    cr_assert_eq(first_of(take(&a, 3)), 298, "a run inside one region comes first");
    cr_assert_eq(first_of(take(&a, 3)), 126, "then any run");
}
