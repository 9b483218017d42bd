/* Reuse lists; see reuse.h. */
#include "src/reuse.h"
#include "src/outbox.h"
#include "src/size_class.h"
#include "src/span.h"

uint32_t lull_reuse_max_bytes = LULL_REUSE_MAX_BYTES;

/* What direct[] points at while a batch waits: a span with no free block,
 * so that the fast path falls through to the slow one */
static lull_span reuse_waiting;

/* A class of sizes near 1 KiB has 16 direct words: pointing them away
 * and back for every block cost more than the message it saved
 * (callgrind, larson-live: 77 instructions a kept block), so they are
 * pointed away only once LULL_REUSE_BATCH blocks wait; fewer are taken
 * when the class's span runs dry (the slow path looks at the list first). */
static void point_direct(lull_heap *h, unsigned c, lull_span *s) {
    h->reuse_direct[c] = s == &reuse_waiting;
    lull_direct_point(h, c, s);
}

void lull_reuse_point_away(lull_heap *h, unsigned c) {
    if (!h->profile) point_direct(h, c, &reuse_waiting);
}

void lull_reuse_point_back(lull_heap *h, unsigned c) {
    point_direct(h, c, h->current[c]);
}

void lull_reuse_flush(lull_heap *h) {
    if (!h->reuse_bytes) return;
    for (unsigned c = 0; c < LULL_CLASSES; c++) {
        for (lull_block *b = h->reuse[c], *next; b; b = next) {
            next = lull_message_next(b);
            lull_span *span = lull_span_of(lull_segment_of(b), b);
            lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_relaxed);
            lull_outbox_put(h, owner, b, span->block_size);
        }
        if (h->reuse[c]) {
            h->reuse[c] = NULL;
            h->reuse_count[c] = 0;
            if (h->reuse_direct[c]) lull_reuse_point_back(h, c);
        }
    }
    h->reuse_bytes = 0;
}
