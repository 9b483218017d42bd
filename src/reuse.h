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
 * Invariants, all the owner thread's (only it touches h->reuse):
 * - a block on a list is linked as in a message (lull_message_link: its
 *   first word carries the mark), so any second free of it, by anyone,
 *   aborts naming it (lull_block_in_message), as for a block in a message;
 * - malloc's slow path pops the list of the size's class first; once
 *   LULL_REUSE_BATCH blocks wait, the class's direct[] slots point at a
 *   span with no free block (reuse_direct[c] set), so that every malloc of
 *   those sizes takes the slow path, until the last pop points them back
 *   at current[c]: they point away only while the list holds blocks;
 * - a list holds blocks of spans on the heap's node only (placement stays
 *   NUMA-local), at most LULL_REUSE_MAX_BLOCKS a class and
 *   LULL_REUSE_MAX_BYTES a heap (what an idle thread can hold, besides its
 *   outbox); lull_reuse_flush sends every block home (a thread's collect
 *   and exit).
 * Off while the heap profile is on: its windows own direct[]. */
#ifndef LULL_REUSE_H
#define LULL_REUSE_H

#include "src/size_class.h"
#include "src/span.h"

#define LULL_REUSE_MAX_BLOCKS 32
#define LULL_REUSE_BATCH 4
#define LULL_REUSE_MAX_BYTES ((uint32_t)256 << 10)
/* LULL_REUSE_MAX_BYTES; the tests of messages set 0 (no reuse) */
extern uint32_t lull_reuse_max_bytes;

/* direct[] of class c pointed at the waiting span (away) or back at
 * current[c]; out of line: up to 16 stores */
void lull_reuse_point_away(lull_heap *h, unsigned c);
void lull_reuse_point_back(lull_heap *h, unsigned c);

/* Keep block b (of `span`, owned by another heap) for h's own mallocs;
 * false if it does not fit (then it goes out in a message). h is a real
 * heap and the block at least 16 bytes. Inline: with the free path's own
 * call, a remote free was 46 instructions of frame and checks (callgrind,
 * larson-live). */
static inline bool lull_reuse_put(lull_heap *h, lull_block *b, const lull_span *span) {
    unsigned c = span->size_class;
    uint32_t bs = span->block_size;
    if (h->profile || h->reuse_count[c] >= LULL_REUSE_MAX_BLOCKS ||
        h->reuse_bytes + bs > lull_reuse_max_bytes || lull_segment_of(b)->node != h->node)
        return false;
    lull_message_link(b, h->reuse[c]);
    h->reuse[c] = b;
    h->reuse_bytes += bs;
    if (++h->reuse_count[c] == LULL_REUSE_BATCH) lull_reuse_point_away(h, c);
    return true;
}

/* A block of class c from h's list (which must hold one), handed out
 * (counted, its mark cleared). */
static inline lull_block *lull_reuse_take(lull_heap *h, unsigned c) {
    lull_block *b = h->reuse[c];
    h->reuse[c] = lull_message_next(b);
    h->reuse_count[c]--;
    h->reuse_bytes -= lull_classes[c].block_size;
    if (!h->reuse[c] && h->reuse_direct[c]) lull_reuse_point_back(h, c);
    b->next_encoded = 0; /* its mark: its free would take it for a second one */
    h->allocs++;
    return b;
}

/* Every kept block into the outbox, to its owner (not sent yet). */
void lull_reuse_flush(lull_heap *h);

#endif
