/* Remote frees in batches: a thread that frees blocks of spans other heaps
 * own puts them in its outbox, one message per owner heap, and sends a
 * message (one CAS onto the owner's inbox) when it holds
 * LULL_OUTBOX_BATCH blocks or LULL_OUTBOX_BYTES, when the slot is needed
 * for another owner, or when the thread takes a new span or a large or
 * huge block, collects or exits. The
 * owner applies its inbox as local frees (heap.c). The protocol, its states
 * and why it is safe: docs/architecture.md, "remote frees". */
#ifndef LULL_OUTBOX_H
#define LULL_OUTBOX_H

#include "base/types.h"
#include "src/span.h"

#define LULL_OUTBOX_BATCH 64
#define LULL_OUTBOX_BYTES ((uint32_t)64 << 10)

/* Heaps are 64-byte aligned in their chunks: the bits above those pick the
 * slot, so a thread that frees into a few heaps rarely has two share one. */
static inline unsigned lull_outbox_slot_of(const lull_heap *owner) {
    return (unsigned)(((uintptr_t)owner >> 6) * 0x9e3779b97f4a7c15ull >> 61);
}

_Static_assert(LULL_OUTBOX_SLOTS == 8, "lull_outbox_slot_of() takes the top 3 bits of the product");

/* lull_outbox_put when a message goes out (the slot's, for its former
 * owner, or b's own, full with b). */
lull_heap *lull_outbox_put_sending(lull_heap *h, lull_heap *owner, lull_block *b,
                                   uint32_t block_size, lull_heap **first_sent_to);

/* Links b, a block of the slot's owner, into slot i's message. The
 * slot's words are read before b's are written, which may alias them. */
static inline void lull_outbox_add(lull_heap *h, unsigned i, lull_block *b, uint32_t block_size) {
    lull_outbox_slot *o = &h->outbox[i];
    lull_block *head = o->head;
    uint32_t count = o->count + 1, bytes = o->bytes + block_size;
    lull_message_link(b, head);
    lull_message_set_hints(b, block_size, head);
    if (!head) o->tail = b;
    o->head = b;
    o->count = count;
    o->bytes = bytes;
    h->outbox_pending |= 1u << i;
}

/* Put block b of a span that `owner` owns (not h) in h's outbox. Returns
 * the heap a message went to, if one did, or NULL. A put may send two:
 * the slot's message for its former owner, then b's own at once (a block
 * of LULL_OUTBOX_BYTES); *first_sent_to (if not NULL) gets the first of
 * those two, else NULL.
 * Most puts add to the slot's message for the same owner and send
 * nothing: inline, with no call (a thread that only frees, as
 * bench_throughput prodcons's consumer, puts every block it frees). */
static inline lull_heap *lull_outbox_put(lull_heap *h, lull_heap *owner, lull_block *b,
                                         uint32_t block_size, lull_heap **first_sent_to) {
    unsigned i = lull_outbox_slot_of(owner);
    const lull_outbox_slot *o = &h->outbox[i];
    if (__builtin_expect(o->dest != owner || o->count + 1 >= LULL_OUTBOX_BATCH ||
                             o->bytes + block_size >= LULL_OUTBOX_BYTES,
                         0))
        return lull_outbox_put_sending(h, owner, b, block_size, first_sent_to);
    if (first_sent_to) *first_sent_to = NULL;
    lull_outbox_add(h, i, b, block_size);
    return NULL;
}

/* Send every message h holds. */
void lull_outbox_flush(lull_heap *h);

#endif
