/* The sending half of batched remote frees; see outbox.h. */
#include "src/outbox.h"
#include "base/race.h"
#include "src/span.h"

static lull_heap *send(lull_heap *h, unsigned i) {
    lull_outbox_slot *o = &h->outbox[i];
    lull_heap *dest = o->dest;
    LULL_RACE_POINT(LULL_RACE_OUTBOX_SEND);
    lull_block *old = atomic_load_explicit(&dest->inbox, memory_order_relaxed);
    do {
        lull_message_link(o->tail, old);
        /* release: the owner's exchange sees every link of the message */
    } while (!atomic_compare_exchange_weak_explicit(&dest->inbox, &old, o->head,
                                                    memory_order_release, memory_order_relaxed));
    o->head = o->tail = NULL;
    o->count = o->bytes = 0;
    h->outbox_pending &= ~(1u << i);
    return dest;
}

lull_heap *lull_outbox_put_sending(lull_heap *h, lull_heap *owner, lull_block *b,
                                   uint32_t block_size, lull_heap **first_sent_to) {
    unsigned i = lull_outbox_slot_of(owner);
    lull_outbox_slot *o = &h->outbox[i];
    lull_heap *sent_to = NULL;
    if (first_sent_to) *first_sent_to = NULL;
    if (o->dest != owner) {
        if (o->count) sent_to = send(h, i);
        o->dest = owner;
    }
    lull_outbox_add(h, i, b, block_size);
    if (o->count >= LULL_OUTBOX_BATCH || o->bytes >= LULL_OUTBOX_BYTES) {
        /* a second send in this put (a block of 64 KiB or more, after the
         * slot's message for its former owner went out above): the first
         * is reported too, so that the caller collects its owner if it
         * exited, not a reclaim tick later (test_outbox_two_sends) */
        if (first_sent_to) *first_sent_to = sent_to;
        sent_to = send(h, i);
    }
    return sent_to;
}

void lull_outbox_flush(lull_heap *h) {
    while (h->outbox_pending)
        send(h, (unsigned)__builtin_ctz(h->outbox_pending));
}
