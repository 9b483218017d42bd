/* Which 32 MiB-aligned addresses start a lull segment or huge mapping: one
 * bit per possible segment of the 47-bit user address space (512 KiB of
 * zero pages until used). free() checks it before it reads any metadata, so
 * a pointer lull never handed out is reported instead of dereferenced. */
#ifndef LULL_SEGMENT_MAP_H
#define LULL_SEGMENT_MAP_H

#include "src/types.h"

#define LULL_ADDRESS_BITS 47
#define LULL_SEGMAP_WORDS (((size_t)1 << (LULL_ADDRESS_BITS - LULL_SEGMENT_SHIFT)) / 64)

extern _Atomic uint64_t lull_segment_map[LULL_SEGMAP_WORDS];
/* Huge blocks aligned to 32 MiB or more start on a segment boundary
 * themselves, so the mask finds the block, not its header: this second map
 * marks those block addresses; their header is one segment below. */
extern _Atomic uint64_t lull_aligned_huge_map[LULL_SEGMAP_WORDS];

static inline bool lull_map_has(_Atomic uint64_t *map, uintptr_t segment) {
    uintptr_t i = segment >> LULL_SEGMENT_SHIFT;
    if (__builtin_expect(i >= LULL_SEGMAP_WORDS * 64, 0)) return false;
    uint64_t w = atomic_load_explicit(&map[i / 64], memory_order_relaxed);
    return (w >> (i % 64)) & 1;
}

static inline void lull_map_set(_Atomic uint64_t *map, uintptr_t segment, bool present) {
    uintptr_t i = segment >> LULL_SEGMENT_SHIFT;
    uint64_t bit = (uint64_t)1 << (i % 64);
    if (present) atomic_fetch_or_explicit(&map[i / 64], bit, memory_order_release);
    else atomic_fetch_and_explicit(&map[i / 64], ~bit, memory_order_release);
}

static inline bool lull_segment_map_has(uintptr_t segment) {
    return lull_map_has(lull_segment_map, segment);
}

static inline void lull_segment_map_set(uintptr_t segment, bool present) {
    lull_map_set(lull_segment_map, segment, present);
}

/* The huge header of an over-aligned huge block starting at p, or NULL. */
static inline lull_huge *lull_aligned_huge_of(const void *p) {
    if (((uintptr_t)p & LULL_SEGMENT_MASK) || !lull_map_has(lull_aligned_huge_map, (uintptr_t)p))
        return NULL;
    return (lull_huge *)((uintptr_t)p - LULL_SEGMENT_SIZE);
}

#endif
