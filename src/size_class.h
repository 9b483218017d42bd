/* Size classes: 8, 16-byte steps to 128, then eight classes per power of
 * two up to 512 KiB, so a class wastes less than 12.5 % of its size above
 * 128 bytes (and at most one 16-byte quantum below); every class from 16 up
 * is a multiple of 16, so blocks are aligned for any fundamental type. Each
 * class has a span length chosen so that the span's unused tail is small. */
#ifndef LULL_SIZE_CLASS_H
#define LULL_SIZE_CLASS_H

#include "base/hidden.h"
#include "base/types.h"

typedef struct lull_class_info {
    uint32_t block_size;
    uint16_t span_slices;
    uint32_t capacity;  /* blocks per span */
    uint64_t div_magic; /* ceil(2^64 / block_size): span.h's lull_block_misaligned */
    /* src/span_park.c: a span that was full starts parking when its count
     * of blocks in use falls to park_start; 0: never */
    uint32_t park_start;
} lull_class_info;

extern LULL_HIDDEN lull_class_info lull_classes[LULL_CLASSES];
extern LULL_HIDDEN uint8_t lull_small_class_of[129]; /* (size + 7) >> 3 for size <= 1024 */
extern LULL_HIDDEN unsigned lull_class_count;
/* The (size + 7) >> 3 words of class c, for classes up to 1 KiB: first and
 * last (last < first: none). */
extern LULL_HIDDEN uint8_t lull_class_first_word[LULL_CLASSES], lull_class_last_word[LULL_CLASSES];

/* Point the direct[] slots of every size of class c (a heap's malloc fast
 * path table, base/types.h) at s. */
static inline void lull_direct_point(lull_heap *h, unsigned c, lull_span *s) {
    for (unsigned w = lull_class_first_word[c]; w <= lull_class_last_word[c]; w++)
        h->direct[w] = s;
}

void lull_size_classes_init(void);

static inline unsigned lull_class_of(size_t size) {
    if (__builtin_expect(size <= 1024, 1)) return lull_small_class_of[(size + 7) >> 3];
    /* above 1 KiB: eight classes per power of two */
    size_t s = size - 1;
    unsigned msb = 63u - (unsigned)__builtin_clzl(s);
    unsigned step = msb - 3;
    unsigned k = (unsigned)(s >> step) & 7u; /* 0..7 within the doubling */
    /* class index of 1024 is lull_small_class_of[128]; each doubling adds 8 */
    return lull_small_class_of[128] + (msb - 10) * 8 + k + 1;
}

#endif
