/* Reuse lists; see reuse.h. */
#include "src/reuse.h"
#include "src/outbox.h"
#include "src/size_class.h"
#include "src/span.h"

#include <string.h>

uint32_t lull_reuse_max_bytes = LULL_REUSE_MAX_BYTES;

/* A class of sizes near 1 KiB has 16 direct words: pointing them away
 * and back for every block cost more than the message it saved
 * (callgrind, larson-live: 77 instructions a kept block), so they are
 * pointed away only once LULL_REUSE_BATCH blocks wait; fewer are taken
 * when the class's span runs dry (the slow path looks at the list first). */
static void point_direct(lull_heap *h, unsigned c, lull_span *s) {
    h->reuse_direct[c] = s == &h->reuse[c];
    lull_direct_point(h, c, s);
}

void lull_reuse_point_away(lull_heap *h, unsigned c) {
    if (!h->profile) point_direct(h, c, &h->reuse[c]);
}

void lull_reuse_point_back(lull_heap *h, unsigned c) {
    point_direct(h, c, h->current[c]);
}

lull_block *lull_reuse_point_back_with(lull_heap *h, unsigned c, lull_block *b) {
    lull_reuse_point_back(h, c);
    return b;
}

bool lull_reuse_recount_fits(lull_heap *h, uint32_t bs) {
    if (h->reuse_recount_wait) {
        h->reuse_recount_wait--;
        return false;
    }
    uint32_t bytes = 0;
    for (unsigned w = 0; w < sizeof h->reuse_listed / sizeof h->reuse_listed[0]; w++)
        for (uint64_t bits = h->reuse_listed[w]; bits; bits &= bits - 1) {
            unsigned c = w * 64 + (unsigned)__builtin_ctzll(bits);
            if (!h->reuse[c].free && !h->reuse_other[c]) {
                h->reuse_listed[w] &= ~((uint64_t)1 << (c % 64));
                continue;
            }
            bytes +=
                (lull_reuse_count(h, c) + h->reuse_other_count[c]) * lull_classes[c].block_size;
        }
    h->reuse_bytes = bytes;
    if (bytes + bs <= lull_reuse_max_bytes) return true;
    h->reuse_recount_wait = LULL_REUSE_RECOUNT_WAIT;
    return false;
}

bool lull_reuse_put_other(lull_heap *h, lull_block *b, const lull_span *span) {
    unsigned c = span->size_class;
    const lull_span *list = &h->reuse[c];
    if ((int32_t)list->used <= -LULL_REUSE_MAX_BLOCKS || /* closed lists read full */
        lull_reuse_count(h, c) + h->reuse_other_count[c] >= LULL_REUSE_MAX_BLOCKS ||
        lull_segment_of(b)->node != h->node ||
        !(lull_reuse_bytes_fit(h, span) || lull_reuse_recount_fits(h, span->block_size)))
        return false;
    lull_message_link(b, h->reuse_other[c]);
    h->reuse_other[c] = b;
    h->reuse_other_count[c]++;
    h->reuse_listed[c / 64] |= (uint64_t)1 << (c % 64);
    h->reuse_bytes += span->block_size;
    return true;
}

static bool reuse_closed(const lull_heap *h, unsigned c) {
    return h->profile || lull_classes[c].block_size < 2 * sizeof(uintptr_t);
}

/* Writes only what is not zero, and reads nothing: the stand-in spans and
 * second lists are 15 KiB of a heap, whose pages a new heap (on memory
 * mmap gave zeroed) and a thread that never keeps a block of most classes
 * need not touch, not even by a read (lull_reuse_listed). A memset of the
 * second lists and a closed mark in every list past the last class made
 * 6 of a new heap's 8 pages resident, and so did reading each list to
 * write only what differed, where reads fault pages in (a PVM guest); now
 * 2 (tests/test_heap_pages.c). */
void lull_reuse_init(lull_heap *h) {
    for (unsigned c = 0; c < lull_class_count; c++)
        if (reuse_closed(h, c)) h->reuse[c].used = LULL_REUSE_CLOSED;
}

/* Only the classes that took a block since their lists were last found
 * empty (reuse_listed) may hold one, or a count: the others are as
 * lull_reuse_init left them (a closed list never takes one). */
void lull_reuse_reset(lull_heap *h) {
    for (unsigned w = 0; w < sizeof h->reuse_listed / sizeof h->reuse_listed[0]; w++)
        for (uint64_t bits = h->reuse_listed[w]; bits; bits &= bits - 1) {
            unsigned c = w * 64 + (unsigned)__builtin_ctzll(bits);
            h->reuse[c].free = NULL;
            h->reuse[c].used = reuse_closed(h, c) ? LULL_REUSE_CLOSED : 0;
            h->reuse_other[c] = NULL;
            h->reuse_other_count[c] = 0;
        }
    memset(h->reuse_listed, 0, sizeof h->reuse_listed);
    h->reuse_bytes = 0;
}

/* A kept block into the outbox, to its span's owner: no free counted (the
 * free was, when the block was kept) and no collection (alloc.c's
 * send_remote_free does both for a block freed now). */
static void send_kept_block_home(lull_heap *h, lull_block *b) {
    lull_span *span = lull_span_of(lull_segment_of(b), b);
    lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_relaxed);
    lull_outbox_put(h, owner, b, span->block_size, NULL);
}

void lull_reuse_flush(lull_heap *h) {
    if (!h->reuse_bytes) return;
    for (unsigned c = 0; c < LULL_CLASSES; c++) {
        if (lull_reuse_listed(h, c)) {
            /* each next link read before the outbox links the block its way */
            for (lull_block *b = h->reuse[c].free, *next; b; b = next) {
                next = lull_block_next(b);
                send_kept_block_home(h, b);
            }
            for (lull_block *b = h->reuse_other[c], *next; b; b = next) {
                next = lull_message_next(b);
                send_kept_block_home(h, b);
            }
        }
        /* set still where a count cleared the class's bit after pops
         * emptied the list under direct[] */
        if (h->reuse_direct[c]) lull_reuse_point_back(h, c);
    }
    lull_reuse_reset(h);
}
