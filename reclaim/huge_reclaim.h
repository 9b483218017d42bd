/* The reclaim thread's work on huge mappings, once a tick: unmap cached
 * mappings unused for huge_cache_idle_ms or beyond the huge_cache_mb bound
 * (oldest first); drain the queue of mappings freed while the cache was
 * full or off, oldest first, each claimed from its slot by one CAS that a
 * huge malloc taking it back may win instead (reclaim/huge_queue.c):
 * cache what the cache keeps (making room by unmapping older ones), unmap
 * the rest; and purge the cached ones that have been free for the purge
 * delay, as slices are purged. A mapping is purged before it is unmapped,
 * in ranges of at most 16 MiB, so munmap itself holds the mmap lock only
 * briefly. */
#ifndef LULL_HUGE_RECLAIM_H
#define LULL_HUGE_RECLAIM_H

#include <stdbool.h>
#include <stdint.h>

struct purge_backend;

typedef struct lull_huge_reclaim_counts {
    uint64_t unmapped;       /* mappings given back whole */
    uint64_t unmapped_bytes; /* their bytes, and the shrunk blocks' tails unmapped */
    uint64_t purged_bytes;   /* cached mappings purged */
    uint64_t purge_failures; /* purges the kernel refused (the entry stays dirty) */
} lull_huge_reclaim_counts;

/* delay: the purge delay in force (< 0: none); advice: MADV_DONTNEED or
 * MADV_FREE. Adds to *counts; true if anything was done. */
bool lull_huge_reclaim_tick(struct purge_backend *b, uint32_t now_ms, long delay, int advice,
                            lull_huge_reclaim_counts *counts);

/* Unmap every cached and queued mapping now, whatever its age and the
 * cache's bound (lull_purge_all, and the heap limit's purge). Adds to
 * *counts; true if anything was done. */
bool lull_huge_reclaim_all(struct purge_backend *b, uint32_t now_ms,
                           lull_huge_reclaim_counts *counts);

#endif
