/* Node arenas: the segments of one NUMA node, and which of their slices a
 * span takes (dirty first, then lazy, warm, clean) or the reclaim thread
 * claims (the oldest dirty ones, lazy ones to purge again, clean ones for
 * the warm reserve). The states themselves and every change of them are
 * numa/slice_state.h's: request threads move slices FREE_* -> IN_USE
 * (lull_arena_alloc_span) and IN_USE -> FREE_DIRTY (lull_arena_free_span);
 * only the reclaim thread moves them through PURGING (lull_arena_claim_*,
 * lull_arena_purge_done and the warm reserve's calls). */
#ifndef LULL_ARENA_H
#define LULL_ARENA_H

#include "base/hidden.h"
#include "numa/slice_state.h"
#include "base/types.h"

typedef struct lull_arena {
    pthread_mutex_t lock;           /* request threads' span search and growth */
    lull_segment *_Atomic segments; /* newest first; never removed */
    _Atomic uint32_t segment_count;
    int node;
    _Atomic uint64_t fallback_allocs; /* spans taken from another node's arena */
} lull_arena;

extern LULL_HIDDEN lull_arena lull_arenas[LULL_MAX_NODES];
extern LULL_HIDDEN int lull_arena_count;

/* What the reclaim side wants to hear of the arenas (its purge policy, and
 * a deferred reclaim thread), installed by reclaim/ when it
 * registers; each NULL until then. numa/ knows nothing of reclaim/. */
typedef struct lull_arena_listener {
    /* n slices taken again, freed interval_ms ago; purged: they had been
     * purged since_purge_ms before */
    void (*reused)(uint32_t interval_ms, uint32_t n, bool purged, uint32_t since_purge_ms);
    void (*purged)(uint32_t slices); /* a run was purged */
    void (*span_given_back)(void);   /* a span went back (any thread, mid heap update) */
    void (*span_taking)(void);       /* a span is about to be taken (no heap update under way) */
} lull_arena_listener;
void lull_arena_listen(const lull_arena_listener *l);

/* Called when a segment is mapped, before it is published: NUMA binding and
 * refault-monitor registration hook in here (whole segments, once). */
extern void (*lull_segment_prepare_hook)(void *segment, size_t len, int node);

void lull_arenas_init(int nodes);

/* Take a run of `slices` slices from the arena (dirty first, then warm,
 * then clean), mapping a new segment if none has room. Returns the head
 * span descriptor with the segment's span_head set for every slice, or NULL (ENOMEM).
 * *zeroed tells whether the memory is known to be zero. Clean slices and a
 * new segment must fit under the heap limit (base/resident.h): when they
 * do not, the reclaim thread is asked to purge (the caller waits for it,
 * bounded) and the search runs once more; then NULL, counted as refused. */
lull_span *lull_arena_alloc_span(lull_arena *a, unsigned slices, bool *zeroed);
/* The same for a span the caller can do without (the heap profile's sample,
 * served unsampled otherwise): over the heap limit, NULL at once, with no
 * purge asked for or waited on and no refusal counted; errno untouched. */
lull_span *lull_arena_try_alloc_span(lull_arena *a, unsigned slices, bool *zeroed);
/* Give a span's slices back as FREE_DIRTY, stamped with the time. */
void lull_arena_free_span(lull_span *span);

/* Where the next of a series of dirty (or lazy) claims starts: one walk
 * over the arena, batch after batch. Each claim starts where the last one
 * stopped, so a run the kernel refused to purge (a locked page), which goes
 * back to dirty, is not claimed again by the same walk: a walk that began
 * each batch at the newest segment took the same refused runs for ever,
 * and when they filled a batch, nothing behind them was purged
 * (tests/test_step_refused_batch.c; the lazy step ended at a batch that
 * purged nothing: tests/test_step_refused_lazy.c). Zeroed: the newest segment's first
 * word. Segments are never removed, so the segment stays valid; segments
 * mapped meanwhile (before it in the list) are not walked. */
typedef struct lull_claim_cursor {
    lull_segment *segment;
    unsigned word; /* LULL_SLICE_WORDS: past the segment */
} lull_claim_cursor;

/* Claim FREE_DIRTY slices that became free at or before `freed_before_ms`,
 * as runs cut at 2 MiB extent boundaries, at most `max` runs and about
 * `max_bytes`, from *at on (NULL: from the newest segment), and move *at
 * past them. They are PURGING on return. */
size_t lull_arena_claim_dirty(lull_arena *a, uint32_t freed_before_ms, lull_claim_cursor *at,
                              lull_slice_run *out, size_t max, size_t max_bytes);
/* The same, whatever their age (lull_purge_all). */
size_t lull_arena_claim_all_dirty(lull_arena *a, lull_claim_cursor *at, lull_slice_run *out,
                                  size_t max, size_t max_bytes);
/* The purge of a run finished: PURGING -> FREE_CLEAN (lazy: MADV_FREE, so
 * not known to be zero). */
void lull_arena_purge_done(const lull_slice_run *run, bool lazy);
/* Claim FREE_CLEAN slices that were purged with MADV_FREE at or before
 * `purged_before_ms` (still resident unless the kernel took them), to
 * purge them again with MADV_DONTNEED, as lull_arena_claim_dirty claims
 * (runs, bounds, cursor): PURGING and lazy no more on return. */
size_t lull_arena_claim_lazy(lull_arena *a, uint32_t purged_before_ms, lull_claim_cursor *at,
                             lull_slice_run *out, size_t max, size_t max_bytes);
/* Every MADV_FREE'd slice, whatever its age (lull_purge_all). */
size_t lull_arena_claim_all_lazy(lull_arena *a, lull_claim_cursor *at, lull_slice_run *out,
                                 size_t max, size_t max_bytes);
/* The purge failed: PURGING -> FREE_DIRTY, nothing lost. */
void lull_arena_purge_failed(const lull_slice_run *run);
/* Warm reserve (reclaim thread): take up to max_slices FREE_CLEAN (zeroed)
 * or WARM slices into PURGING; finish each run with make_warm (prefaulted:
 * WARM) or return_clean / lull_arena_purge_done (FREE_CLEAN). */
size_t lull_arena_take_clean(lull_arena *a, size_t max_slices, lull_slice_run *out, size_t max);
size_t lull_arena_take_warm(lull_arena *a, size_t max_slices, lull_slice_run *out, size_t max);
/* With thp on: up to max_regions whole 2 MiB regions (32 slices, clean and
 * zeroed: not lazy), each one run in PURGING, for the reserve to make huge
 * pages of (numa/thp.h); finish them as take_clean's. */
size_t lull_arena_take_clean_regions(lull_arena *a, size_t max_regions, lull_slice_run *out,
                                     size_t max);
/* make_warm for a run the reserve made resident itself (thp on): a span
 * that takes it faults nothing, so its earlier purge is no refault (the
 * auto purge mode counted them as wasted purges and chose MADV_FREE:
 * bench_stall kept 518 MiB 1.2 s after its bulk free in 2 runs of 5). */
void lull_arena_make_warm_prefaulted(const lull_slice_run *run);
/* Warm slices the reserve lets go of without a purge (in a huge region
 * that is kept, where a purge would split it): FREE_DIRTY, free from now
 * on, for the purge policy (and its bound on what huge regions keep). */
void lull_arena_warm_to_dirty(const lull_slice_run *run);
void lull_arena_make_warm(const lull_slice_run *run);
void lull_arena_return_clean(const lull_slice_run *run);
/* Slices in a state: 0 dirty, 1 warm, 2 clean. */
size_t lull_arena_count_slices(lull_arena *a, int which);
/* Map one more segment now, so a burst finds its slices without an mmap
 * (not past the heap limit: its header is resident). */
bool lull_arena_add_spare_segment(lull_arena *a);
/* The reclaim thread's, each tick: the metadata of segments made since the
 * last call made resident (MADV_POPULATE_WRITE), so that request threads
 * take no page fault in it, which would wait for whoever holds the mmap
 * lock (a huge-page collapse, an munmap). The segments' list is newest
 * first: the walk stops at the first segment done. Without MADV_POPULATE_WRITE (before Linux 5.14)
 * the pages fault in as they are first written, as they always did. */
void lull_arena_populate_metadata(lull_arena *a);
/* After fork in the child: no reclaim thread survived, so any PURGING
 * slice goes back to FREE_DIRTY. The reclaim thread's claim..finish steps
 * hold a lock fork's prepare handler takes (reclaim/reclaim_thread.c), so
 * no slice it was moving is in two maps or in none at fork. */
void lull_arenas_after_fork_child(void);

static inline void *lull_slice_address(const lull_segment *s, unsigned slice) {
    return (char *)s + ((size_t)slice << LULL_SLICE_SHIFT);
}

/* Monotonic milliseconds since start, from the vDSO (no system call). */
uint32_t lull_now_ms(void);

#endif
