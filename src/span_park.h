/* Parked pages, the owner's side (docs/architecture.md, "Parked pages").
 * A span that was full and thins out to its class's park_start starts
 * parking: its free list is dissolved into a free bitmap and per-page live
 * counts, kept in its segment's metadata (classes of 112 bytes and more:
 * src/size_class.c checks that they fit), and from then on
 * each free into it (every one takes the slow path) sets the block's bit
 * and, when a page's live count falls to zero, parks the page
 * (numa/page_park.h), which the reclaim thread purges after the purge
 * delay while the span stays in use. The owner stops parking (takes every
 * page back, threads the free blocks again) when it refills from the span
 * or empties it. Invariant: while parking, the span's free blocks are
 * exactly the bitmap's, none is on a list, and a parked page holds free
 * blocks only. Only the span's owner calls these. */
#ifndef LULL_SPAN_PARK_H
#define LULL_SPAN_PARK_H

#include "base/types.h"

/* The span went on its heap's full list: parking starts when its count in
 * use falls to its class's park_start. */
void lull_span_park_arm(lull_span *s);
/* A free brought the count to park_at: start parking. */
void lull_span_park_start(lull_span *s);
/* While parking: every block on the span's list (just freed: the free
 * paths push before the slow path runs) goes into the bitmap, and pages
 * left with no live block are parked. Aborts on a double free. */
void lull_span_park_absorb(lull_span *s);
/* While parking: a free block on resident pages taken out of the bitmap
 * (as malloc would pop one; the caller counts it in `used`), or NULL; a
 * block on a parked page is not taken, which would fault the page in. */
lull_block *lull_span_park_take(lull_span *s);
bool lull_span_park_has_resident_free(const lull_span *s);
/* Does the block at p overlap a page that is not NONE (parked, being
 * purged or purged)? Racy, and only a hint, for another heap's span. */
bool lull_span_block_on_parked_page(const lull_span *s, const void *p);
/* While parking: is the block at p free (its bit set)? */
bool lull_span_parking_has(const lull_span *s, const void *p);
/* Stop parking: take every page back and, if `thread`, put the free blocks
 * back on the list (not for a span about to be released). False, and the
 * span goes on parking, when the reclaim thread is purging one of its
 * pages at this moment. True at once for a span that is not parking. */
bool lull_span_unpark(lull_span *s, bool thread);

#endif
