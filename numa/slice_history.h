/* What the arena remembers of each slice of a segment: when it was freed,
 * when it was last purged, and whether it was taken again after a purge.
 * numa/arena.c's part of the segment's metadata (base/types.h,
 * LULL_META_SLICE_HISTORY) and only it stamps the times: freed_ms when a
 * span gives the slice back (purged_ms back to 0 then), purged_ms when a
 * purge of it finishes; when it hands out a slice purged with
 * MADV_DONTNEED it sets the slice's refault_watch bit. The arena reads the
 * times to choose what to purge and to feed the purge policy; the refault
 * monitor (reclaim/refault.c) takes the watch bits (clears those it scans)
 * and reads purged_ms. Relaxed atomics: each value is a hint read alone. */
#ifndef LULL_SLICE_HISTORY_H
#define LULL_SLICE_HISTORY_H

#include "base/types.h"

typedef struct lull_slice_history {
    _Atomic uint32_t freed_ms[LULL_SLICES];  /* when each slice became free (0: never used) */
    _Atomic uint32_t purged_ms[LULL_SLICES]; /* when it was last purged (0: not since use) */
    _Atomic uint64_t refault_watch[LULL_SLICE_WORDS]; /* reused after a purge: scan its pages */
} lull_slice_history;
LULL_META_PART_CHECK(lull_slice_history, SLICE_HISTORY);

static inline lull_slice_history *lull_slice_history_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_SLICE_HISTORY_AT);
}

#endif
