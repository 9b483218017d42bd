/* A segment's span table: for each slice, which span covers it, and the
 * span descriptors (lull_span, base/types.h), slices[i] the descriptor of
 * the span whose head is slice i. numa/arena.c's part of the segment's
 * metadata (base/types.h, LULL_META_SPAN_TABLE): only the arena writes
 * span_head, when it hands out a run of slices (each leads to the run's
 * head) and when it takes one back (each to 0); src/ finds a block's span
 * through the table (src/span.h, lull_span_of) and fills the descriptors.
 *
 * span_head[i] is the byte offset, from slices[0], of the descriptor of the
 * span that covers slice i; 0 (slices[0], the metadata slice's: never a
 * span) for a free slice. A table, not a distance stored in every
 * descriptor, makes free() find its span in one load and one add (11
 * instructions fewer than a distance in descriptors of 96 bytes,
 * callgrind), and zero memory (a fresh segment, a huge block's header)
 * reads as "no span". */
#ifndef LULL_SPAN_TABLE_H
#define LULL_SPAN_TABLE_H

#include "base/types.h"

typedef struct lull_span_table {
    uint16_t span_head[LULL_SLICES];
    lull_span slices[LULL_SLICES];
} lull_span_table;
LULL_META_PART_CHECK(lull_span_table, SPAN_TABLE);
_Static_assert((LULL_SLICES - 1) * sizeof(lull_span) < 65536, "span_head offsets must fit 16 bits");
/* free() of a pointer into a huge block reads the huge mapping as a segment
 * (the segment map has both): span_head, then the descriptor it leads to
 * (slices[0], the entry being zero), before it sees the huge header's
 * magic. Both must lie in the mapping's header slice, zero but for the
 * lull_huge at its start, not in the block's data. */
_Static_assert(LULL_META_SPAN_TABLE_AT >= sizeof(lull_huge) &&
                   LULL_META_SPAN_TABLE_AT + offsetof(lull_span_table, slices) +
                           sizeof(lull_span) <=
                       LULL_SLICE_SIZE,
               "span_head and descriptor 0 in a huge mapping's header slice");

static inline lull_span_table *lull_span_table_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_SPAN_TABLE_AT);
}

#endif
