/* Which 32 MiB-aligned addresses start a lull segment or huge mapping: one
 * word per possible segment of the 47-bit user address space (32 MiB of
 * zero pages until used; a page of it covers 16 GiB). free() reads it
 * before it reads any metadata, so that a pointer lull never handed out is
 * reported instead of dereferenced.
 *
 * A word holds the segment's address XOR the stand-in's, and 0 (the zero
 * page's) where lull has nothing: XOR with the stand-in then gives free()
 * the segment, or the stand-in, whose metadata is all zero like a huge
 * mapping's header (its span descriptors have no owner), so a pointer of
 * no segment leaves free()'s fast path at the owner compare it makes
 * anyway. That is 3 instructions fewer on every free than a byte map's
 * load, test and branch before the segment is formed (callgrind: the
 * malloc(32)+free pair 72 -> 69). The entry of a segment is written before
 * any block of it is handed out and cleared only after its last block is
 * freed, so free() of a valid block reads it plainly (no other thread
 * writes that word meanwhile); everything else reads it atomically. */
#ifndef LULL_SEGMENT_MAP_H
#define LULL_SEGMENT_MAP_H

#include "base/types.h"

#define LULL_ADDRESS_BITS 47
#define LULL_SEGMAP_ENTRIES ((size_t)1 << (LULL_ADDRESS_BITS - LULL_SEGMENT_SHIFT))
#define LULL_SEGMAP_WORDS (LULL_SEGMAP_ENTRIES / 64)

extern uintptr_t lull_segment_map[LULL_SEGMAP_ENTRIES];
/* Zero bytes shaped like a segment's metadata (base/types.h's table of
 * parts): what the map leads to where lull has no segment. */
extern uint8_t lull_segment_stand_in[LULL_META_SLICES * LULL_SLICE_SIZE];

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
    if (present)
        atomic_fetch_or_explicit(&map[i / 64], bit, memory_order_release);
    else
        atomic_fetch_and_explicit(&map[i / 64], ~bit, memory_order_release);
}

static inline bool lull_segment_map_has(uintptr_t segment) {
    uintptr_t i = segment >> LULL_SEGMENT_SHIFT;
    if (__builtin_expect(i >= LULL_SEGMAP_ENTRIES, 0)) return false;
    return __atomic_load_n(&lull_segment_map[i], __ATOMIC_RELAXED) != 0;
}

/* free()'s lookup, for p below 2^47 (the caller checks
 * lull_segment_map_covers): p's segment, or the stand-in when lull has
 * none there. A plain read (see above); TSan builds read atomically, as
 * TSan cannot know the rule that makes the plain read safe. */
static inline bool lull_segment_map_covers(const void *p) {
    return ((uintptr_t)p >> LULL_SEGMENT_SHIFT) < LULL_SEGMAP_ENTRIES;
}

static inline lull_segment *lull_segment_or_stand_in(const void *p) {
    uintptr_t i = (uintptr_t)p >> LULL_SEGMENT_SHIFT;
#ifdef __SANITIZE_THREAD__
    uintptr_t entry = __atomic_load_n(&lull_segment_map[i], __ATOMIC_RELAXED);
#else
    uintptr_t entry = lull_segment_map[i];
#endif
    return (lull_segment *)(entry ^ (uintptr_t)lull_segment_stand_in);
}

static inline void lull_segment_map_set(uintptr_t segment, bool present) {
    uintptr_t entry = present ? segment ^ (uintptr_t)lull_segment_stand_in : 0;
    __atomic_store_n(&lull_segment_map[segment >> LULL_SEGMENT_SHIFT], entry, __ATOMIC_RELEASE);
}

/* The huge header of an over-aligned huge block starting at p, or NULL. */
static inline lull_huge *lull_aligned_huge_of(const void *p) {
    if (((uintptr_t)p & LULL_SEGMENT_MASK) || !lull_map_has(lull_aligned_huge_map, (uintptr_t)p))
        return NULL;
    return (lull_huge *)((uintptr_t)p - LULL_SEGMENT_SIZE);
}

#endif
