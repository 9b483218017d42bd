/* Parked pages, the owner's side (docs/architecture.md, "Parked pages"):
 * when a span that was full thins out, its owner takes the pages that only
 * free blocks overlap off its free list and parks them (numa/page_park.h);
 * the reclaim thread purges them after the purge delay, while the span
 * stays in use; the owner takes them back when the span runs out of free
 * blocks or empties. Invariant: a block that overlaps a page not NONE is
 * free and on no list, and is threaded again only once every page it
 * overlaps is NONE. Only the span's owner calls these. */
#ifndef LULL_SPAN_PARK_H
#define LULL_SPAN_PARK_H

#include "base/types.h"

/* The span went on its heap's full list: its first park is due when its
 * count in use falls to its class's park_start. */
void lull_span_park_arm(lull_span *s);
/* A free brought the count to park_at: park what can be, arm the next. */
void lull_span_park_due(lull_span *s);
/* Park now what can be, whether or not a park is due (defrag.c, after a
 * move emptied a page); a kept span is left alone, as it is never armed. */
void lull_span_park_now(lull_span *s);
/* Take back every parked page the reclaim thread is not purging at this
 * moment and thread their blocks; true when no page stays parked. */
bool lull_span_unpark(lull_span *s);
/* A free of b, which overlaps a parked page (a double free: only free
 * blocks are there): aborts naming it. */
void lull_span_check_not_parked(const lull_span *s, const lull_block *b);

#endif
