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
 * - while class c's list holds blocks, the direct[] slots of c point at
 *   a span with no free block, so malloc of those sizes takes the slow path, which
 *   pops the list; the last pop points them back at current[c];
 * - a list holds blocks of spans on the heap's node only (placement stays
 *   NUMA-local), at most LULL_REUSE_MAX_BLOCKS a class and
 *   LULL_REUSE_MAX_BYTES a heap (what an idle thread can hold, besides its
 *   outbox); lull_reuse_flush sends every block home (a thread's collect
 *   and exit).
 * Off while the heap profile is on: its windows own direct[]. */
#ifndef LULL_REUSE_H
#define LULL_REUSE_H

#include "base/types.h"

#define LULL_REUSE_MAX_BLOCKS 32
#define LULL_REUSE_BATCH 4
#define LULL_REUSE_MAX_BYTES ((uint32_t)64 << 10)
/* LULL_REUSE_MAX_BYTES; the tests of messages set 0 (no reuse) */
extern uint32_t lull_reuse_max_bytes;

/* Keep block b (of `span`, owned by another heap) for h's own mallocs;
 * false if it does not fit (then it goes out in a message). */
bool lull_reuse_put(lull_heap *h, lull_block *b, const lull_span *span);
/* A block of class c from h's list (which must hold one), handed out
 * (counted, its mark cleared). */
lull_block *lull_reuse_take(lull_heap *h, unsigned c);
/* Every kept block into the outbox, to its owner (not sent yet). */
void lull_reuse_flush(lull_heap *h);

#endif
