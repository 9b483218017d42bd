/* The reclaim steps: each takes memory out of the map, slot or queue that
 * records it (a claim), gives it to the kernel through a purge backend, and
 * records where it went (a finish), as one step under the step lock, which
 * fork's prepare handler takes (reclaim.h): a fork never copies memory in
 * the middle of a step. A step is one batch (at most LULL_STEP_RUNS runs /
 * LULL_STEP_BYTES), so a fork waits for one batch's purge at most; the huge
 * mappings' and the warm reserve's work are one step each (their own files
 * interleave their claims and finishes).
 *
 * The reclaim thread's tick runs them with its backend, for what has been
 * free for the purge delay (reclaim_thread.c); lull_purge_all runs them for
 * everything, whatever its age (purge_now.c), on the reclaim thread or,
 * when there is none, on the caller with a backend of its own. Each adds
 * what it did to the statistics it is given, atomically: a caller's steps
 * and a reclaim thread started meanwhile may both count. */
#ifndef LULL_RECLAIM_STEPS_H
#define LULL_RECLAIM_STEPS_H

#include "numa/arena.h"
#include "reclaim/reclaim.h"

#include <stdbool.h>
#include <stdint.h>

struct purge_backend;

#define LULL_STEP_RUNS 256
#define LULL_STEP_BYTES ((size_t)64 << 20)

void lull_steps_lock(void);
void lull_steps_unlock(void);
/* In a fork child: the lock is new (the parent's holder is not here). */
void lull_steps_after_fork_child(void);

/* Dirty slices of arena a freed at or before freed_before_ms (any_age:
 * all of them), purged with advice, batch after batch until none is left. */
bool lull_step_slices(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                      uint32_t freed_before_ms, bool any_age, int advice);
/* MADV_FREE'd slices purged at or before purged_before_ms, purged again
 * with MADV_DONTNEED: one batch (any_age: every one, batch after batch). */
bool lull_step_lazy(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                    uint32_t purged_before_ms, bool any_age);
/* Pages parked in spans in use at or before parked_before_ms (any_age: all
 * of them), with MADV_DONTNEED. */
bool lull_step_pages(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                     uint32_t parked_before_ms, bool any_age);
/* The huge mappings' tick (reclaim/huge_reclaim.h); all: unmap every cached
 * and queued one instead. */
bool lull_step_huge(struct purge_backend *b, lull_reclaim_stats *st, uint32_t now_ms, long delay,
                    int advice, bool all);
/* The warm reserve's tick (reclaim/warm_reserve.h); all: purge all of it. */
bool lull_step_warm(struct purge_backend *b, uint32_t now_ms, bool all);

#endif
