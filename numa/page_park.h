/* The page state machine of in-use spans (docs/architecture.md, "Parked
 * pages"): a 4 KiB page of a small span whose blocks are all free can be
 * parked by the span's owner, purged by the reclaim thread, and taken back
 * by the owner. Two bits a page, 16 pages of a slice in one word of the
 * segment's page_state (numa/parked_pages.h):
 *
 *   NONE     the owner's: its blocks are live or on the span's lists
 *   PENDING  parked: every block on it is free and on no list; the owner
 *            may take it back, the reclaim thread may claim it
 *   PURGING  claimed by the reclaim thread; nobody else changes it
 *   PURGED   purged (zero on next touch); the owner may take it back
 *
 * Only the owner leaves NONE (park) and enters it (take back); only the
 * reclaim thread enters and leaves PURGING. A take back is one CAS of the
 * whole word that turns PENDING and PURGED pages into NONE and leaves
 * PURGING pages alone, so of a take back and a claim exactly one wins a
 * page: a purge never zeroes a page the owner has re-threaded. Each claim..
 * finish is one reclaim step (step_lock), so fork never copies a PURGING
 * page. This module is the only code that changes the words. */
#ifndef LULL_PAGE_PARK_H
#define LULL_PAGE_PARK_H

#include "numa/parked_pages.h"
#include "base/types.h"

enum {
    LULL_PAGE_NONE = 0,
    LULL_PAGE_PENDING = 1,
    LULL_PAGE_PURGING = 2,
    LULL_PAGE_PURGED = 3,
};

/* pages `mask` (bit i: page i of the slice) in the 2-bit layout, each set
 * to `state` */
static inline uint32_t lull_pages_spread(uint32_t mask, uint32_t state) {
    uint32_t out = 0;
    for (; mask; mask &= mask - 1) {
        unsigned i = (unsigned)__builtin_ctz(mask);
        out |= state << (2 * i);
    }
    return out;
}

/* the pages of a word in `state`, as a 16-bit mask */
static inline uint32_t lull_pages_in(uint32_t word, uint32_t state) {
    uint32_t out = 0;
    for (unsigned i = 0; i < LULL_PAGES_PER_SLICE; i++)
        if ((word >> (2 * i) & 3) == state) out |= 1u << i;
    return out;
}

static inline uint32_t lull_pages_word(const lull_segment *s, unsigned slice) {
    return atomic_load_explicit(&lull_parked_pages_of(s)->page_state[slice], memory_order_acquire);
}

/* Owner side ----------------------------------------------------------- */

/* NONE -> PENDING for `mask` (pages of `slice` that are NONE), at `now`. */
void lull_pages_park(lull_segment *s, unsigned slice, uint32_t mask, uint32_t now_ms);
/* PENDING, PURGED -> NONE for the pages of `mask`; the pages taken (the
 * purged ones join the resident estimate again). */
uint32_t lull_pages_take_back(lull_segment *s, unsigned slice, uint32_t mask);

/* Reclaim side ---------------------------------------------------------- */

/* A run of pages of one slice, claimed together. */
typedef struct lull_page_run {
    lull_segment *segment;
    uint16_t slice;
    uint16_t mask; /* contiguous pages */
} lull_page_run;

/* PENDING -> PURGING for pages parked at or before `parked_before_ms`, as
 * runs, at most `max`, from slice *from on (NULL: the first); *from moves
 * past them, to LULL_SLICES when the claim reached the segment's end.
 * Returns the runs.
 * A step claims batch after batch from one cursor, once over the segment:
 * a page the kernel refused to purge (a locked page), PENDING again, is
 * behind the cursor and not claimed again by the same step. Claims that
 * each started at the segment's first slice took the same refused pages
 * again, and when they filled a batch, no page behind them was ever purged
 * (tests/test_step_refused_pages.c). */
size_t lull_pages_claim(lull_segment *s, uint32_t parked_before_ms, unsigned *from,
                        lull_page_run *out, size_t max);
/* Every PENDING page, whatever its age (lull_purge_all). */
size_t lull_pages_claim_all(lull_segment *s, unsigned *from, lull_page_run *out, size_t max);
/* PURGING -> PURGED (purged: out of the resident estimate, base/resident.h,
 * until taken back) or PENDING (the kernel refused). */
void lull_pages_finish(const lull_page_run *r, bool purged);
/* PURGING -> PENDING, the kernel having refused the purge (a locked page),
 * the slice stamped `now_ms`: due again a purge delay later, as a refused
 * run of free slices is. Claimed again at once, it was refused again at
 * every tick, which counted as work: with a locked page parked (every
 * one, under mlockall) the reclaim thread ticked every 2 ms for ever
 * (tests/test_step_refused_pages.c). */
void lull_pages_refused(const lull_page_run *r, uint32_t now_ms);
void *lull_page_run_address(const lull_page_run *r, size_t *len);

/* Statistics: bytes of PURGED and PURGING pages in slices [first, first+n). */
uint64_t lull_pages_purged_bytes(const lull_segment *s, unsigned first, unsigned n);
/* Of those, the bytes at or past offset `from` of the span that starts at
 * slice first (a span's tail past its last block parks too). */
uint64_t lull_pages_purged_bytes_from(const lull_segment *s, unsigned first, unsigned n,
                                      uint64_t from);

#endif
