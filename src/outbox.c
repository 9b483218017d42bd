/* The sending half of batched remote frees; see outbox.h. */
#include "src/outbox.h"
#include "base/race.h"
#include "src/span.h"

/* Heaps are 64-byte aligned in their chunks: the bits above those pick the
 * slot, so a thread that frees into a few heaps rarely has two share one. */
static inline unsigned slot_of(const lull_heap *owner) {
    return (unsigned)(((uintptr_t)owner >> 6) * 0x9e3779b97f4a7c15ull >> 61);
}

_Static_assert(LULL_OUTBOX_SLOTS == 8, "slot_of() takes the top 3 bits of the product");

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

/* Links b into slot o's message (whose owner it is). */
static inline void add(lull_heap *h, unsigned i, lull_block *b, uint32_t block_size) {
    lull_outbox_slot *o = &h->outbox[i];
    lull_message_link(b, o->head);
    lull_message_set_hints(b, block_size, o->head);
    if (!o->head) o->tail = b;
    o->head = b;
    o->bytes += block_size;
    o->count++;
    h->outbox_pending |= 1u << i;
}

/* lull_outbox_put when a message goes out: the slot's, for its former
 * owner, or b's own, full with b. */
__attribute__((noinline)) static lull_heap *put_sending(lull_heap *h, lull_heap *owner,
                                                        lull_block *b, uint32_t block_size,
                                                        lull_heap **first_sent_to) {
    unsigned i = slot_of(owner);
    lull_outbox_slot *o = &h->outbox[i];
    lull_heap *sent_to = NULL;
    if (first_sent_to) *first_sent_to = NULL;
    if (o->dest != owner) {
        if (o->count) sent_to = send(h, i);
        o->dest = owner;
    }
    add(h, i, b, block_size);
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

/* Most puts add to the slot's message for the same owner and send
 * nothing: that case needs no frame (a thread that only frees, as
 * bench_throughput prodcons's consumer, puts every block it frees). The
 * slot's words are read before b's are written, which may alias them. */
lull_heap *lull_outbox_put(lull_heap *h, lull_heap *owner, lull_block *b, uint32_t block_size,
                           lull_heap **first_sent_to) {
    unsigned i = slot_of(owner);
    lull_outbox_slot *o = &h->outbox[i];
    lull_block *head = o->head;
    uint32_t count = o->count + 1, bytes = o->bytes + block_size;
    if (o->dest != owner || count >= LULL_OUTBOX_BATCH || bytes >= LULL_OUTBOX_BYTES)
        return put_sending(h, owner, b, block_size, first_sent_to);
    if (first_sent_to) *first_sent_to = NULL;
    lull_message_link(b, head);
    lull_message_set_hints(b, block_size, head);
    if (!head) o->tail = b;
    o->head = b;
    o->count = count;
    o->bytes = bytes;
    h->outbox_pending |= 1u << i;
    return NULL;
}

void lull_outbox_flush(lull_heap *h) {
    while (h->outbox_pending)
        send(h, (unsigned)__builtin_ctz(h->outbox_pending));
}
