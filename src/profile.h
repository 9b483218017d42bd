/* Sampled heap profile (profile_sample_kb; docs/heap-profile.md).
 *
 * Sampling: each size class of each heap runs its own Poisson process over
 * the bytes of the blocks it hands out (as tcmalloc and jemalloc do over
 * all bytes; the superposition of the classes' processes is one process of
 * the same rate), with mean interval lull_profile_interval; large and huge
 * blocks share one more. The allocation that crosses a sample point is
 * sampled: its stack is recorded and it is served from a span of its own
 * (a one-block large span marked `sampled`), so that its free, which goes
 * through the large-block path, forgets it without a lookup on any other
 * free.
 *
 * Zero instructions on the fast paths: with profiling on, a heap's
 * direct[] slots point at per-class windows (src/profile_window.c), span
 * descriptors that hold a run of blocks cut from the class's current span
 * and counted as in use there. malloc's fast path pops from a window as
 * from any span; frees go to the blocks' own spans, never into a window,
 * so a window empties after exactly the allocations it was cut for, and
 * the slow path it falls to then knows how many bytes went out. A window
 * is cut to end just before the next sample point. */
#ifndef LULL_PROFILE_H
#define LULL_PROFILE_H

#include "base/hidden.h"
#include "base/types.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Mean bytes between samples; 0 when profiling is off (the default). Set
 * once when lull's core starts (profile_sample_kb is a start-up key);
 * read with lull_profile_interval_now(): another thread's first malloc may
 * read it while the core starts (TSan saw that race). */
extern LULL_HIDDEN _Atomic uint64_t lull_profile_interval;
static inline uint64_t lull_profile_interval_now(void) {
    return atomic_load_explicit(&lull_profile_interval, memory_order_relaxed);
}

#define LULL_PROFILE_SPARE_SPANS 4

/* A heap's profiling state: the windows, and the bytes left to each
 * class's next sample point. Owner only. */
typedef struct lull_heap_profile {
    lull_span window[LULL_CLASSES];
    uint32_t window_cut[LULL_CLASSES]; /* blocks the window was cut with */
    int64_t until_sample[LULL_CLASSES];
    int64_t large_until_sample; /* large and huge blocks */
    /* one-slice spans of sampled blocks this heap's thread freed, kept for
     * its next sampled small blocks (lull_profile_keep_span): a span from
     * the arena and back cost about 800 instructions a sample */
    lull_span *spare[LULL_PROFILE_SPARE_SPANS];
    uint32_t spares;
    uint64_t rng;
} lull_heap_profile;

/* The heap's windows (with profiling on, once per heap; false, and the
 * heap samples nothing, if no memory for them is left). */
bool lull_profile_heap_attach(lull_heap *h);
/* A small allocation of class c with profiling on (alloc_in_heap). */
void *lull_profile_alloc_small(lull_heap *h, unsigned c, size_t size, bool *zeroed);
/* malloc's fast path found class c's window empty: the next window, cut
 * from the whole list of the class's current span, when no sample point
 * falls in it and cut_window would not carve; NULL when the allocation
 * needs lull_profile_alloc_small (a refill, a sample, a cut list). Called
 * before the rest of the slow path: a trip down all of it cost about 200
 * instructions, once every 25 pairs of bench/'s mixed loop. */
void *lull_profile_next_window(lull_heap *h, unsigned c);
/* A large or huge allocation of `size` bytes with profiling on: true if it
 * is to be sampled (lull_profile_sampled once it is made). */
bool lull_profile_large_due(lull_heap *h, size_t size);
/* The freeing thread's heap h keeps the span of a sampled block just
 * freed (its kind LULL_SPAN_NONE, its slices still taken) if it is one
 * slice and h keeps fewer than LULL_PROFILE_SPARE_SPANS: true if it did. */
bool lull_profile_keep_span(lull_heap *h, lull_span *span);
/* Every window's blocks back to their spans, and the kept span to the
 * arena (a collection before the heap's spans are released: thread exit,
 * lull_thread_collect). */
void lull_profile_heap_flush(lull_heap *h);
/* Is b in the heap's profile window of its class: free, counted in use in
 * its span, never handed out? The owner's double-free check and defrag
 * ask. */
bool lull_profile_window_has(const lull_heap *h, const lull_span *span, const lull_block *b);

/* The profile's own side (src/profile.c). */
void lull_profile_register(void);
/* Record the sampled block p of `size` bytes asked for, sampled at
 * `sampled_bytes` (its block size: the bytes the process ran over). The
 * stack is the calling thread's, from the frame above `boundary` (the CFA
 * of lull's outermost frame, lull_profile_set_boundary). */
void lull_profile_sampled(const void *p, size_t size, size_t sampled_bytes);
/* A sampled block is freed, or a huge block that may have been (its free
 * asks): its sample, if any, is forgotten. */
void lull_profile_forget(const void *p);
/* A block realloc() kept in place now holds `size` bytes asked for: its
 * sample, if any, counts that size as in use from now on (it was sampled
 * with its old size's probability, so its weight stays: the in-use
 * estimate stays unbiased). Its allocation figures are the allocation's. */
void lull_profile_resized(const void *p, size_t size);
/* Where lull's frames end on this thread's stack (see lull_profile_sampled). */
extern __thread uintptr_t lull_profile_boundary;

#endif
