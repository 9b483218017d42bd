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

#define LULL_OUTBOX_BATCH 64
#define LULL_OUTBOX_BYTES ((uint32_t)64 << 10)

/* Put block b of a span that `owner` owns (not h) in h's outbox. Returns
 * the heap a message went to, if one did, or NULL. A put may send two:
 * the slot's message for its former owner, then b's own at once (a block
 * of LULL_OUTBOX_BYTES); *first_sent_to (if not NULL) gets the first of
 * those two, else NULL. */
lull_heap *lull_outbox_put(lull_heap *h, lull_heap *owner, lull_block *b, uint32_t block_size,
                           lull_heap **first_sent_to);
/* Send every message h holds. */
void lull_outbox_flush(lull_heap *h);

#endif
