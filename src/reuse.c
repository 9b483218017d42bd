/* Reuse lists; see reuse.h. */
#include "src/reuse.h"
#include "src/outbox.h"
#include "src/size_class.h"
#include "src/span.h"

uint32_t lull_reuse_max_bytes = LULL_REUSE_MAX_BYTES;

/* What direct[] points at while a list holds blocks: a span with no free
 * block, so that the fast path falls through to the slow one */
static lull_span reuse_waiting;

static void point_direct(lull_heap *h, unsigned c, lull_span *s) {
    for (unsigned w = lull_class_first_word[c]; w <= lull_class_last_word[c]; w++)
        h->direct[w] = s;
}

bool lull_reuse_put(lull_heap *h, lull_block *b, const lull_span *span) {
    unsigned c = span->size_class;
    uint32_t bs = span->block_size;
    if (h->profile || h->reuse_count[c] >= LULL_REUSE_MAX_BLOCKS ||
        h->reuse_bytes + bs > lull_reuse_max_bytes || lull_segment_of(b)->node != h->node)
        return false;
    lull_message_link(b, h->reuse[c]);
    if (!h->reuse[c]) point_direct(h, c, &reuse_waiting);
    h->reuse[c] = b;
    h->reuse_count[c]++;
    h->reuse_bytes += bs;
    return true;
}

lull_block *lull_reuse_take(lull_heap *h, unsigned c) {
    lull_block *b = h->reuse[c];
    h->reuse[c] = lull_message_next(b);
    h->reuse_count[c]--;
    h->reuse_bytes -= lull_classes[c].block_size;
    if (!h->reuse[c]) point_direct(h, c, h->current[c]);
    return b;
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
            point_direct(h, c, h->current[c]);
        }
    }
    h->reuse_bytes = 0;
}
