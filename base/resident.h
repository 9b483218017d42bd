/* What lull keeps resident, as one estimate kept up to date where it
 * changes, and the hard limit on it (heap_limit_mb, docs/configuration.md).
 *
 * The estimate is the statistics' resident bound, mapped - purged
 * (lull_counters_resident_bound in include/lull/counters.h), kept as a
 * counter instead of a walk: slices in use (less their span's purged parked
 * pages), dirty, purging and warm slices, each segment's 128 KiB header,
 * each thread heap's structure, and huge blocks live, freed and cached
 * (header slice and, unless purged, block). Purged slices (MADV_FREE'd ones
 * too, which the kernel takes when it needs them), purged pages and cached
 * blocks, alignment slack and the untouched rest of the heap chunks are
 * mapped but not counted. Every term is counted whole (a span is resident
 * as soon as it is taken), so it bounds lull's part of RSS from above, and
 * with no thread in the middle of a step it equals the statistics' figure.
 *
 * Invariant: the estimate grows only with lull_resident_try_grow(), which
 * never takes it past the limit, at the few places where lull takes memory
 * that was not resident: a span taking purged slices (numa/slice_state.c),
 * a new segment's header (numa/arena.c, before it maps one), a huge block
 * mapped, grown, or taken back purged from the cache (numa/huge.c,
 * reclaim/huge_cache.c), the warm reserve's prefault (reclaim/warm_reserve.c).
 * Three additions are not checked, and may pass it: a thread's heap (a
 * thread without one cannot free either; sizeof(lull_heap), 28 KiB on
 * x86-64), a span owner taking back its parked pages (the span is the
 * owner's; refusing would strand its blocks), and MADV_FREE'd memory whose
 * purge again the kernel refused (a lazy slice run or cached huge block with
 * a locked page, dirty again: it is resident whatever lull decides). So the
 * estimate passes the limit by at most what these added since it was last
 * within it: the parked pages purged at that time, 28 KiB a thread started
 * since, and the refused lazy memory (probe of two threads at 64 MiB: at
 * most 340 KiB, all parked pages and one heap). Besides, the warm reserve's
 * hold and the runs it finishes count the same slices until its step gives
 * the hold back: the figure passes the limit by up to the runs finished for
 * that step, the memory it counts does not (and other growths are refused
 * meanwhile). It shrinks where memory is purged or unmapped. No fast path
 * touches it. */
#ifndef LULL_RESIDENT_H
#define LULL_RESIDENT_H

#include <stdbool.h>
#include <stdint.h>

/* How long a request thread over the limit waits for the reclaim thread's
 * purge, at most. */
#define LULL_LIMIT_WAIT_MS 100

/* Counted without a check (see above), and uncounted. */
void lull_resident_add(uint64_t bytes);
void lull_resident_sub(uint64_t bytes);
/* Grow the estimate by `bytes` if that stays within the limit (always
 * without one): one atomic step, so two threads never pass it together. */
bool lull_resident_try_grow(uint64_t bytes);
/* Bytes left under the limit (UINT64_MAX without a limit). */
uint64_t lull_resident_room(void);
uint64_t lull_resident_bytes(void);
/* The limit in force, bytes; 0: none. */
uint64_t lull_resident_limit(void);

/* An allocation found no room: ask for the reclaim thread's purge and wait
 * for it, at most LULL_LIMIT_WAIT_MS. False when none can come (no reclaim
 * thread, or the caller is that thread): the caller then fails at once. A
 * request thread never purges here itself. The caller holds no lull lock. */
bool lull_resident_relieve(void);
/* The same, waiting until the purge is done, however long it takes: for a
 * mapping the kernel refused (an address space limit) while freed huge
 * mappings hold the room, where the one alternative is NULL. Bounded by
 * LULL_LIMIT_WAIT_MS, such a malloc failed whenever the reclaim thread's
 * tick took longer (test_huge_cache under ASan in a loaded CI run). */
bool lull_resident_relieve_until_done(void);
/* Set by reclaim/ when it registers; NULL until then (no relief). Waits at
 * most wait_ms for the purge, or until it is done if wait_ms < 0. */
extern bool (*lull_resident_relief_hook)(long wait_ms);
/* An allocation refused for the limit: counted, errno ENOMEM. */
void lull_resident_refuse(void);
/* Allocations refused for the limit so far (lull_print_stats). */
uint64_t lull_resident_refusals(void);

#endif
