/* Inline helpers on blocks and spans shared by the malloc and free paths.
 *
 * Free-list links are safe-linked (as glibc does): a block stores
 * next ^ (its own address >> 12). A stray write of a plain pointer into a
 * free block then decodes to garbage instead of steering malloc to an
 * address of the attacker's choice, and a live block's first word rarely
 * decodes to an address in its own segment, which makes the double-free
 * check on free one compare in the common case. */
#ifndef LULL_SPAN_H
#define LULL_SPAN_H

#include "src/types.h"

static inline lull_block *lull_block_next(const lull_block *b) {
    return (lull_block *)(b->next_encoded ^ ((uintptr_t)b >> 12));
}

static inline void lull_block_set_next(lull_block *b, lull_block *next) {
    b->next_encoded = (uintptr_t)next ^ ((uintptr_t)b >> 12);
}

static inline lull_segment *lull_segment_of(const void *p) {
    return (lull_segment *)((uintptr_t)p & ~LULL_SEGMENT_MASK);
}

static inline lull_span *lull_span_of(lull_segment *s, const void *p) {
    uint16_t off = s->span_head[((uintptr_t)p & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT];
    return (lull_span *)((char *)s->slices + off);
}

static inline uint8_t *lull_span_start(const lull_span *span) {
    lull_segment *s = lull_segment_of(span);
    return (uint8_t *)s + ((size_t)(span - s->slices) << LULL_SLICE_SHIFT);
}

static inline size_t lull_span_bytes(const lull_span *span) {
    return (size_t)span->slice_count << LULL_SLICE_SHIFT;
}

/* True when a stale first word of a block being freed decodes to an address
 * in the block's own segment: the block may already be on a free list. */
static inline bool lull_block_looks_free(const lull_block *b) {
    uintptr_t next = (uintptr_t)lull_block_next(b);
    /* next == 0: the last block of a free list (its word is b >> 12) */
    return next == 0 || ((next ^ (uintptr_t)b) >> LULL_SEGMENT_SHIFT) == 0;
}

#endif
