#include "base/segment_map.h"
#include "base/race.h"
/* The map itself; see segment_map.h. */
_Atomic uint8_t lull_segment_map[LULL_SEGMAP_ENTRIES];

_Atomic uint64_t lull_aligned_huge_map[LULL_SEGMAP_WORDS];

lull_segment_run lull_the_segment_run;

void lull_segment_run_init(uintptr_t lo) {
    atomic_store_explicit(&lull_the_segment_run.lo, lo, memory_order_relaxed);
}

static void segment_run_grow(void) {
    uintptr_t lo = atomic_load_explicit(&lull_the_segment_run.lo, memory_order_relaxed);
    uintptr_t len = atomic_load_explicit(&lull_the_segment_run.len, memory_order_relaxed);
    if (!lo) return;
    for (;;) {
        uintptr_t next = lo + len;
        uintptr_t i = next >> LULL_SEGMENT_SHIFT;
        /* the run's span table ends there (numa/span_table.h) */
        if (len + LULL_SEGMENT_SIZE > LULL_RUN_MAX_BYTES) return;
        /* mapped (the map says so; acquire: its header is written) and a
         * segment, not a huge block's header */
        if (i >= LULL_SEGMAP_ENTRIES ||
            !atomic_load_explicit(&lull_segment_map[i], memory_order_acquire) ||
            ((const lull_segment *)next)->magic != LULL_SEGMENT_MAGIC)
            return;
        /* release: a free that finds a pointer inside sees the segment's
         * metadata written (it was, before the map's entry was set) */
        if (atomic_compare_exchange_weak_explicit(&lull_the_segment_run.len, &len,
                                                  len + LULL_SEGMENT_SIZE, memory_order_release,
                                                  memory_order_relaxed))
            len += LULL_SEGMENT_SIZE;
    }
}

void lull_segment_publish(uintptr_t segment) {
    lull_segment_map_set(segment, true);
    LULL_RACE_POINT(LULL_RACE_SEGMENT_RUN);
    segment_run_grow();
}
