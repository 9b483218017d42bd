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

#include "base/hidden.h"
#include "base/segment_map.h"
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

/* The run's span table: for each slice of the segment run's reach
 * (base/segment_map.h, LULL_RUN_MAX_BYTES from its start), the descriptor
 * span_head leads to, as a pointer. free() finds a block's span from the
 * run offset it has already (lull_in_segment_run_at) in one shift and one
 * load: no segment address, no mask of the offset's segment bits and no
 * add of the 16-bit offset to the table's (3 instructions fewer a free,
 * callgrind). It mirrors span_head, written with it (lull_span_head_set)
 * for every segment inside the reach, run or not: a segment placed past a
 * gap joins the run when the gap fills, with its entries already right.
 * Hidden, static and zero until a segment is made (4 MiB of address
 * space, 4 KiB resident a segment); no entry of a segment in the run is
 * ever NULL (lull_span_table_init_segment runs before it is published). */
#define LULL_RUN_SLICES (LULL_RUN_MAX_BYTES / LULL_SLICE_SIZE)
extern LULL_HIDDEN lull_span *lull_run_spans[LULL_RUN_SLICES];

/* The span of the block at run offset `off` (p - the run's start), which
 * lull_in_segment_run_at found inside the run. */
static inline lull_span *lull_run_span_at(uintptr_t off) {
    return lull_run_spans[off >> LULL_SLICE_SHIFT];
}

/* Segment s's LULL_SLICES entries in the run's table, or NULL when s
 * lies outside its reach. */
static inline lull_span **lull_run_spans_of(const lull_segment *s) {
    uintptr_t off =
        (uintptr_t)s - atomic_load_explicit(&lull_the_segment_run.lo, memory_order_relaxed);
    return off < LULL_RUN_MAX_BYTES ? &lull_run_spans[off >> LULL_SLICE_SHIFT] : NULL;
}

/* Slice `slice` of segment s leads to the descriptor `head_off` bytes
 * from slices[0] (0: no span), in both tables. */
static inline void lull_span_head_set(lull_segment *s, unsigned slice, uint16_t head_off) {
    lull_span_table *table = lull_span_table_of(s);
    table->span_head[slice] = head_off;
    lull_span **run = lull_run_spans_of(s);
    if (run) run[slice] = (lull_span *)((char *)table->slices + head_off);
}

/* A new segment's entries in the run's table, all "no span" (span_head
 * is zero already): before it is published, so that a free of a stray
 * pointer into it reads a descriptor, never NULL. */
void lull_span_table_init_segment(lull_segment *s);

#endif
