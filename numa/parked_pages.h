/* The page states of a segment's in-use spans (numa/page_park.h has the
 * state machine): numa/page_park.c's part of the segment's metadata
 * (base/types.h, LULL_META_PARKED_PAGES), and only page_park.c changes it.
 * A header of its own so that numa/thp.c, which page_park.c calls, reads
 * the states without a circle between the two modules. */
#ifndef LULL_PARKED_PAGES_H
#define LULL_PARKED_PAGES_H

#include "base/types.h"

typedef struct lull_parked_pages {
    /* pages of in-use small spans given to the reclaim thread while their
     * span stays in use: 2 bits a page, a word a slice */
    _Atomic uint32_t page_state[LULL_SLICES];
    _Atomic uint64_t parked_slices[LULL_SLICE_WORDS]; /* slices with a PENDING page */
    _Atomic uint32_t parked_ms[LULL_SLICES];          /* when a page of it was last parked */
} lull_parked_pages;
LULL_META_PART_CHECK(lull_parked_pages, PARKED_PAGES);

static inline lull_parked_pages *lull_parked_pages_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_PARKED_PAGES_AT);
}

#endif
