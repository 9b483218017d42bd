/* Runs of set bits in the slice maps (LULL_SLICE_WORDS words of 64). */
#ifndef LULL_BITMAP_H
#define LULL_BITMAP_H

#include "base/types.h"

/* First index >= from where `n` consecutive bits are set in w, or -1. */
static inline int lull_bitmap_find_run(const uint64_t *w, unsigned from, unsigned n) {
    unsigned run = 0, start = from;
    for (unsigned i = from; i < LULL_SLICES;) {
        uint64_t word = w[i / 64] >> (i % 64);
        if (word == 0) { /* rest of this word is clear */
            run = 0;
            i = (i / 64 + 1) * 64;
            start = i;
            continue;
        }
        if ((word & 1) == 0) {
            unsigned skip = (unsigned)__builtin_ctzll(word);
            run = 0;
            i += skip;
            start = i;
            continue;
        }
        /* all ones: ctz of 0 is undefined, the run goes to the word's end */
        unsigned ones = ~word ? (unsigned)__builtin_ctzll(~word) : 64 - i % 64;
        if (ones > 64 - i % 64) ones = 64 - i % 64;
        if (run == 0) start = i;
        run += ones;
        i += ones;
        if (run >= n) return (int)start;
    }
    return -1;
}

static inline uint64_t lull_bits_mask(unsigned from, unsigned count) {
    /* bits [from, from+count) of one word; count in 1..64 */
    uint64_t m = count == 64 ? ~(uint64_t)0 : (((uint64_t)1 << count) - 1);
    return m << from;
}

#endif
