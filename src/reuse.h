/* Reuse lists: a block of another heap's span that this thread frees is
 * kept for this thread's next malloc of its class, instead of going back to
 * its owner in a message (src/outbox.h). The block stays counted in use in
 * its span, exactly as while it waits in a message, so its owner's view
 * does not change: nothing is shared and no protocol is added. What it
 * saves is the round trip: the owner's walk of the message (a cache miss a
 * block, one after the other) and the blocks' lines moving to the owner's
 * core and back, where the freeing thread has them in its cache already
 * (tcmalloc's and jemalloc's thread caches get the same from holding any
 * block).
 *
 * Each class's list is the free list of a stand-in span descriptor in the
 * heap (h->reuse[c]): linked through the first word, safe-linked as a
 * span's list, so that once LULL_REUSE_BATCH blocks wait, the class's
 * direct[] slots lead malloc's fast path to it and a reused block costs a
 * fast-path pop (larson-live: nine mallocs in ten are such pops; through
 * the slow path each cost 38 instructions instead of 12, callgrind).
 *
 * Invariants, all the owner thread's (only it writes h->reuse):
 * - a list holds blocks of one segment, so that the first word of each
 *   decodes to an address in its own segment (or to NULL, the last):
 *   lull_block_looks_free() is true for it, and a second free of it, by
 *   anyone, takes the checked path; its second word names the heap that
 *   keeps it (lull_reuse_mark), whose list the check walks
 *   (src/alloc.c) before it aborts naming the block;
 * - its span descriptor's `used` is minus the count (a fast-path pop adds
 *   one, a keep takes one off); at most LULL_REUSE_MAX_BLOCKS on it (the
 *   class's second list takes a block only while the two together hold
 *   fewer, so a class holds at most twice that less one) and
 *   LULL_REUSE_MAX_BYTES a heap on all lists (what an idle thread can
 *   hold, besides its outbox), and only blocks of spans on the heap's node when the list
 *   took its first block (placement stays NUMA-local; a thread that moves
 *   to another node keeps the old node's blocks until the list empties);
 * - direct[] of class c leads to h->reuse[c] only while reuse_direct[c];
 *   the slow path points it back when the list runs dry under it;
 * - lull_reuse_flush sends every block home (a thread's collect and exit).
 * A block popped by the fast path keeps its second word: a later free of
 * it that looks free finds the old keeper's list without it, and goes on.
 * Off while the heap profile is on: its windows own direct[]. */
#ifndef LULL_REUSE_H
#define LULL_REUSE_H

#include "base/hidden.h"
#include "src/size_class.h"
#include "src/span.h"

/* Bounds of what a heap keeps. With 32 blocks a class and 256 KiB a heap,
 * bench_throughput larson-live sent most remote frees home in messages
 * and ran 0.74x tcmalloc; 128 blocks and 512 KiB ran it 10 % faster with
 * 12 % less peak RSS (26.0 MiB against 29.6; tcmalloc 27.7), fewer blocks
 * waiting in messages (docs/status.md, session 23). The block bound is
 * what mattered: 32 blocks with 4 MiB gained nothing, 240 blocks or 1-4
 * MiB no more. The byte bound is what a thread that stops freeing holds
 * of other heaps' spans (counted live: test_abandoned's churn, whose main
 * thread frees the last blocks of exited threads, allows 1 MiB). */
#define LULL_REUSE_MAX_BLOCKS 128
#define LULL_REUSE_BATCH 4
#define LULL_REUSE_MAX_BYTES ((uint32_t)512 << 10)
_Static_assert(LULL_REUSE_MAX_BLOCKS <= UINT8_MAX, "reuse_other_count holds a class's count");
/* LULL_REUSE_MAX_BYTES; the tests of messages set 0 (no reuse) */
extern LULL_HIDDEN uint32_t lull_reuse_max_bytes;

/* direct[] of class c pointed at the class's list (away) or back at
 * current[c]; out of line: up to 16 stores */
void lull_reuse_point_away(lull_heap *h, unsigned c);
void lull_reuse_point_back(lull_heap *h, unsigned c);
/* lull_reuse_point_back, returning b: the pop of the list's last block
 * tail-calls it, so that the pop needs no frame */
lull_block *lull_reuse_point_back_with(lull_heap *h, unsigned c, lull_block *b);

/* The count of a list that takes no block: the empty heap's (every thread's
 * heap until its first malloc), the 8-byte class's (no room for the
 * mark), and every list while the heap profile is on. It reads as full,
 * so that the free path's bound check answers all three. */
#define LULL_REUSE_CLOSED (0u - LULL_REUSE_MAX_BLOCKS)

/* The lists of a new heap (its memory zero, or its heap profile just
 * attached): closed as above, the rest empty and open as they are. */
void lull_reuse_init(lull_heap *h);
/* The lists after a flush: empty, closed as above. */
void lull_reuse_reset(lull_heap *h);

/* May class c's lists hold a block? Its bit in reuse_listed is set while
 * they may (set by every keep, cleared only by a count that found both
 * empty), so that a thread that keeps no block of a class never reads the
 * class's lists: a line each, on pages of the heap nothing else touches.
 * On a kernel that maps no shared zero page for reads (a PVM guest's
 * pvm_no_zero_page=1) such a read made the page resident: a new heap's
 * reset and first mallocs read every list, 6 of a heap's 7 pages
 * (tests/test_heap_pages.c). */
static inline bool lull_reuse_listed(const lull_heap *h, unsigned c) {
    return (h->reuse_listed[c / 64] >> (c % 64)) & 1;
}

/* Blocks on class c's list. */
static inline uint32_t lull_reuse_count(const lull_heap *h, unsigned c) {
    return h->reuse[c].used == LULL_REUSE_CLOSED && !h->reuse[c].free ? 0 : 0u - h->reuse[c].used;
}

/* The second word of a kept block: the heap that keeps it. */
static inline void lull_reuse_mark(lull_block *b, const lull_heap *keeper) {
    (&b->next_encoded)[1] = (uintptr_t)keeper ^ lull_link_key(b);
}

/* The heap bound was reached by the count that pops do not lower: count
 * the lists' bytes again; true if bs more fit. It reads the lists that
 * took blocks since it last found them empty (reuse_listed): reading all
 * 112, a line each, was most of larson-live's added L1 misses (callgrind
 * --cache-sim). A count that finds the lists full waits
 * LULL_REUSE_RECOUNT_WAIT frees past the bound before the next (in
 * bench_throughput --mode larson, whose lists stay near the bound,
 * counting at every such free cost 4 % of the instructions). */
#define LULL_REUSE_RECOUNT_WAIT 32
bool lull_reuse_recount_fits(lull_heap *h, uint32_t bs);

/* Does the list of the span's class hold its bound (or is it closed)? Then
 * a block of the class goes out in a message: asked first, so that a
 * thread that only frees (its lists full) goes there without a look at
 * the second list (bench_throughput prodcons: 10 % more instructions). */
static inline bool lull_reuse_full(const lull_heap *h, const lull_span *span) {
    return (int32_t)h->reuse[span->size_class].used <= -LULL_REUSE_MAX_BLOCKS;
}

/* May block b (of `span`, owned by another heap) be kept on its class's
 * list (not full), the heap's byte bound aside (lull_reuse_bytes_fit)? If
 * not, it may go on the second list, or out in a message. h may be the
 * empty heap (closed: full), b of any small class.
 * Inline, as lull_reuse_put: with the free path's own call, a remote free
 * was 46 instructions of frame and checks (callgrind, larson-live). */
static inline bool lull_reuse_fits(const lull_heap *h, const lull_block *b, const lull_span *span) {
    const lull_span *list = &h->reuse[span->size_class];
    /* a list's blocks are of one segment, which was on the heap's node when
     * the list took its first: the node is looked at only then (a load of
     * the segment's header fewer) */
    if (list->free) return (((uintptr_t)list->free ^ (uintptr_t)b) >> LULL_SEGMENT_SHIFT) == 0;
    return lull_segment_of(b)->node == h->node;
}

/* The byte bound, by the count that may be high (then
 * lull_reuse_recount_fits says). */
static inline bool lull_reuse_bytes_fit(const lull_heap *h, const lull_span *span) {
    return h->reuse_bytes + span->block_size <= lull_reuse_max_bytes;
}

/* Keep b (lull_reuse_fits said it may be); true when the class's direct[]
 * slots are due to lead to its list now (the caller tail-calls
 * lull_reuse_point_away, so that the free needs no frame). */
static inline bool lull_reuse_put(lull_heap *h, lull_block *b, const lull_span *span) {
    unsigned c = span->size_class;
    lull_span *list = &h->reuse[c];
    if (!list->free) h->reuse_listed[c / 64] |= (uint64_t)1 << (c % 64);
    lull_block_set_next(b, list->free);
    lull_reuse_mark(b, h);
    list->free = b;
    h->reuse_bytes += span->block_size;
    return --list->used == 0u - LULL_REUSE_BATCH;
}

/* A block lull_reuse_fits refused for its segment alone (its class's list
 * holds another segment's blocks): kept on the class's second list,
 * linked and marked as in a message (lull_block_in_message: a second free
 * aborts as for a block in a message), popped by the slow path when the
 * first list is empty, within the same bounds. Without it, bench_footprint
 * pool_larson (blocks of two segments) peaked at 60-63 MiB instead of
 * 42-44: the refused blocks went home to a thread that waits in
 * pthread_join. Out of line: the free's slow path. */
bool lull_reuse_put_other(lull_heap *h, lull_block *b, const lull_span *span);

static inline lull_block *lull_reuse_take_other(lull_heap *h, unsigned c) {
    lull_block *b = h->reuse_other[c];
    h->reuse_other[c] = lull_message_next(b);
    h->reuse_other_count[c]--;
    h->reuse_bytes -= lull_classes[c].block_size;
    b->next_encoded = 0; /* its mark: its free would take it for a second one */
    h->allocs++;
    return b;
}

/* A block of class c from h's list (which must hold one), handed out by
 * the slow path (counted, its link cleared). */
static inline lull_block *lull_reuse_take(lull_heap *h, unsigned c) {
    lull_span *list = &h->reuse[c];
    lull_block *b = list->free;
    lull_block *next = lull_block_next(b);
    list->free = next;
    list->used++;
    h->reuse_bytes -= lull_classes[c].block_size;
    b->next_encoded = 0; /* see lull_malloc_inline */
    h->allocs++;
    if (!next && h->reuse_direct[c]) return lull_reuse_point_back_with(h, c, b);
    return b;
}

/* Every kept block into the outbox, to its owner (not sent yet). */
void lull_reuse_flush(lull_heap *h);

#endif
