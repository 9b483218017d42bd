/* Thread heaps: creation, the thread-local pointer, abandonment at thread
 * exit and adoption by new threads (so that thread churn never grows the
 * number of heaps beyond the peak number of live threads). */
#ifndef LULL_HEAP_H
#define LULL_HEAP_H

#include "base/hidden.h"
#include "src/size_class.h"
#include "base/types.h"

/* Bytes of spans a heap keeps for reuse when they empty (the others go back
 * to the arena, where the reclaim thread can purge them): the most an idle
 * thread leaves resident. */
#define LULL_KEPT_EMPTY_MAX ((size_t)2 << 20)

/* Every thread starts with this heap: its spans are all the empty span, so
 * the first malloc takes the slow path, which gives the thread a real heap. */
extern LULL_HIDDEN lull_heap lull_heap_empty;
extern LULL_HIDDEN lull_span lull_span_empty;
extern __thread lull_heap *lull_tl_heap;

/* Make s the current span of class c (and of the direct slots of its
 * sizes, unless they point at the heap profile's windows, or at the
 * class's reuse list while it leads malloc there: src/reuse.h). */
static inline void lull_heap_set_current(lull_heap *h, unsigned c, lull_span *s) {
    h->current[c] = s;
    if (h->profile || h->reuse_direct[c]) return;
    lull_direct_point(h, c, s);
}

/* The calling thread's heap, created or adopted if it has none; NULL when
 * no memory for a heap is left. The core is initialised (lull_ensure_init)
 * before a thread's first call. */
lull_heap *lull_heap_get_or_create(void);
/* Collect remote frees of every span and give empty spans back. */
void lull_heap_collect(lull_heap *h, bool all);
/* A thread's end: collect, then leave the heap for the next new thread. */
void lull_heap_abandon(lull_heap *h);
/* Collect the thread-free list of one span into its local list; returns
 * the number of blocks collected. */
uint32_t lull_span_collect(lull_span *span);
/* Pop the spans other threads freed into, collecting each. */
void lull_heap_collect_remote(lull_heap *h);
/* A span whose last block a free brought back: keep it or give it to the
 * arena (for the free paths only: the heap must be in no other update). */
void lull_heap_span_empty(lull_heap *h, lull_span *span);
void lull_heap_queue_remove(lull_span_queue *q, lull_span *span);
void lull_heap_queue_push_front(lull_span_queue *q, lull_span *span);

/* True once lull's key destructor has run on this thread (it is exiting). */
bool lull_heap_thread_done(void);
/* The heap of allocations made after that, locked; NULL when no memory is
 * left (unlocked then). */
lull_heap *lull_heap_late_acquire(void);
void lull_heap_late_release(void);
/* Collect the remote frees of abandoned heaps and of the late heap
 * (the reclaim thread, each tick). */
void lull_heaps_collect_abandoned(void);
/* A thread that sent remote frees to h: if h is abandoned, collect them now
 * (under the registry lock, if it is free), not at the next reclaim tick. */
void lull_heap_collect_if_abandoned(lull_heap *h);

/* Is h one of the heaps (any state)? Without the lock: the registry only
 * grows, and heaps are never freed (a racy check's answer, for
 * the reuse check in src/alloc.c). */
bool lull_heap_is_one(const lull_heap *h);

/* Walk every heap (registry); the callback runs with the registry locked. */
void lull_heaps_foreach(void (*fn)(lull_heap *h, void *arg), void *arg);

void lull_heaps_init(void);
void lull_heaps_fork_prepare(void);
void lull_heaps_fork_parent(void);
void lull_heaps_fork_child(void);
/* Held around a remote free onto a span's own list by a thread without a
 * heap (src/alloc.c's remote_free), whose half-done queueing no heap
 * records: fork's prepare handler takes it, so no child is copied inside
 * one. Takes no other lock. */
void lull_heapless_remote_free_lock(void);
void lull_heapless_remote_free_unlock(void);
/* h's deferred free (h->deferred, src/alloc.h), if it has one, done now:
 * before anything reads its spans' used counts or lists, or hands the heap
 * on. Owner only; in alloc.c, with the free path. */
void lull_heap_free_deferred(lull_heap *h);

/* h's deferred slot made empty: it holds the slot's mark, h->deferred_none
 * (whose word a new heap sets, src/heap.c). */
static inline void lull_heap_deferred_clear(lull_heap *h) {
    h->deferred = &h->deferred_none;
    h->deferred_span = NULL;
}

#endif
