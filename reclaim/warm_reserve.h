/* The warm reserve: when purged slices are coming back into use (the
 * policy's refault evidence), the reclaim thread prefaults a bounded number
 * of clean slices
 * (MADV_POPULATE_WRITE) so that the next burst takes them without a page
 * fault, and maps a spare segment ahead of demand so that it needs no mmap
 * either. When that demand stops for LULL_WARM_IDLE_MS the reserve is
 * purged again. Bounded by warm_reserve_mb. With thp on, the reserve is
 * whole 2 MiB regions made huge pages instead, and follows the heap's
 * growth (first use included) rather than refaults (warm_reserve.c). */
#ifndef LULL_WARM_RESERVE_H
#define LULL_WARM_RESERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LULL_WARM_IDLE_MS 3000

typedef struct lull_warm_stats {
    uint64_t prefaulted_bytes; /* count */
    uint64_t drained_bytes;    /* count */
    uint64_t spare_segments;   /* count */
    uint64_t target_bytes;     /* gauge */
} lull_warm_stats;

struct purge_backend;
/* One step on the reclaim tick; true if it did work. A prefault never
 * takes the resident estimate past the heap limit (base/resident.h). */
bool lull_warm_reserve_tick(struct purge_backend *b, uint32_t now_ms);
/* Purge the whole reserve now and forget the demand seen so far (no
 * prefault until purged slices are used again): lull_purge_all. The bytes
 * purged. Inside one step, as the tick. */
uint64_t lull_warm_reserve_drain_all(struct purge_backend *b);
void lull_warm_reserve_stats(lull_warm_stats *out);
/* thp on: the heap grew within the reserve's hold (its 2 MiB regions are
 * wanted). Reclaim thread. */
bool lull_warm_reserve_growing(uint32_t now_ms);

#endif
