/* The age of a slice's parked pages (numa/page_park.c). The purge delay
 * is counted per slice, from `parked_ms`. When each park stamped the
 * slice anew, a slice whose pages came free one after another, closer
 * together than the delay, never had any purged: the oldest page's wait
 * began again at every park. */
#include "lull.h"
#include "base/types.h"
#include "numa/page_park.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <stdint.h>

static void setup(void) {
    lull_set_purge_delay_ms(-1); /* the reclaim thread claims nothing */
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
}

/* Pages of a slice that no block of the test lives on: the second half of
 * a span of 512-byte blocks whose first block is the only one handed out.
 * The test parks them by hand and takes them back at the end. */
static void *g_block;

static unsigned a_slice(lull_segment **seg) {
    g_block = lull_malloc(512);
    cr_assert_not_null(g_block);
    *seg = lull_segment_of(g_block);
    unsigned slice = (unsigned)(((uintptr_t)g_block - (uintptr_t)*seg) >> LULL_SLICE_SHIFT);
    cr_assert_eq(lull_pages_word(*seg, slice), 0, "the slice has parked pages already");
    return slice;
}

#define OLD_PAGE 10
#define NEW_PAGE 11

static void take_back(lull_segment *seg, unsigned slice, const lull_page_run *runs, size_t n) {
    for (size_t i = 0; i < n; i++)
        lull_pages_finish(&runs[i], false); /* PURGING -> PENDING */
    lull_pages_take_back(seg, slice, 1u << OLD_PAGE | 1u << NEW_PAGE);
    cr_assert_eq(lull_pages_word(seg, slice), 0);
    lull_free(g_block);
}

static bool claimed(const lull_page_run *runs, size_t n, unsigned page) {
    for (size_t i = 0; i < n; i++)
        if (runs[i].mask >> page & 1) return true;
    return false;
}

/* A page parked at 1000 ms, another of its slice at 1500: a claim of what
 * was parked by 1200 takes the first (and the second with it: the delay is
 * the slice's). */
Test(page_park_age, a_later_park_does_not_delay_an_older_page, .init = setup) {
    lull_segment *seg;
    unsigned slice = a_slice(&seg);
    lull_pages_park(seg, slice, 1u << OLD_PAGE, 1000);
    lull_pages_park(seg, slice, 1u << NEW_PAGE, 1500);
    lull_page_run runs[LULL_PAGES_PER_SLICE];
    size_t n = lull_pages_claim(seg, 1200, NULL, runs, LULL_PAGES_PER_SLICE);
    bool old_claimed = claimed(runs, n, OLD_PAGE);
    take_back(seg, slice, runs, n);
    cr_assert(old_claimed, "the page parked at 1000 ms waits past 1200 ms: the park at 1500 "
                           "restamped its slice");
}

/* Once the older page is taken back, nothing of the slice is parked: the
 * next park's own time counts. */
Test(page_park_age, a_park_after_a_take_back_counts_from_its_own_time, .init = setup) {
    lull_segment *seg;
    unsigned slice = a_slice(&seg);
    lull_pages_park(seg, slice, 1u << OLD_PAGE, 1000);
    lull_pages_take_back(seg, slice, 1u << OLD_PAGE);
    lull_pages_park(seg, slice, 1u << NEW_PAGE, 1500);
    lull_page_run runs[LULL_PAGES_PER_SLICE];
    size_t n = lull_pages_claim(seg, 1200, NULL, runs, LULL_PAGES_PER_SLICE);
    bool new_claimed = claimed(runs, n, NEW_PAGE);
    take_back(seg, slice, runs, n);
    cr_assert_not(new_claimed, "a page parked at 1500 ms was claimed as parked by 1200 ms");
}
