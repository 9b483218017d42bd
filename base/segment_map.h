/* Which 32 MiB-aligned addresses start a lull segment or huge mapping: one
 * byte per possible segment of the 47-bit user address space (4 MiB of zero
 * pages until used; a page of it covers 128 GiB). free() checks it before it
 * reads any metadata, so a pointer lull never handed out is reported instead
 * of dereferenced. A byte, not a bit: the test is one compare on the free
 * path (3 instructions fewer than a bit test, callgrind). */
#ifndef LULL_SEGMENT_MAP_H
#define LULL_SEGMENT_MAP_H

#include "base/asm_operands.h"
#include "base/hidden.h"
#include "base/types.h"

#define LULL_ADDRESS_BITS 47
#define LULL_SEGMAP_ENTRIES ((size_t)1 << (LULL_ADDRESS_BITS - LULL_SEGMENT_SHIFT))
#define LULL_SEGMAP_WORDS (LULL_SEGMAP_ENTRIES / 64)

extern LULL_HIDDEN _Atomic uint8_t lull_segment_map[LULL_SEGMAP_ENTRIES];
/* Huge blocks aligned to 32 MiB or more start on a segment boundary
 * themselves, so the mask finds the block, not its header: this second map
 * marks those block addresses; their header is one segment below. */
extern LULL_HIDDEN _Atomic uint64_t lull_aligned_huge_map[LULL_SEGMAP_WORDS];

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

/* The segment run: the segments that lie back to back from the first
 * boundary of the segments' region (base/os.c), [lo, lo + len). Segments
 * are never unmapped and nothing else is placed in the run (huge blocks
 * have a region of their own), so a pointer inside it is inside a segment,
 * and free() asks that first: a subtraction and a compare against two
 * globals, where the map's test is a shift, a bound, the map's address and
 * its byte (4 instructions fewer a free, callgrind). A pointer outside it
 * (NULL, a huge block, a segment placed elsewhere because the region was
 * taken, anything not lull's) goes on to the map. lo is set once, at start,
 * before any block exists; len only grows (lull_segment_publish). Hidden,
 * so that the compiler addresses them directly, not through the GOT (one
 * instruction each). */
typedef struct lull_segment_run {
    _Atomic uintptr_t lo, len;
} lull_segment_run;
extern LULL_HIDDEN lull_segment_run lull_the_segment_run;

/* How far the run reaches: it never grows past this many bytes from its
 * start, the reach of the run's span table (numa/span_table.h, 8 bytes a
 * slice: 4 MiB for 32 GiB of segments). Segments beyond it are found
 * through the map, a few instructions more a free. */
#define LULL_RUN_MAX_BYTES ((uintptr_t)1 << 35)

/* p inside the run? *off: p - lo, whose low LULL_SEGMENT_SHIFT bits are
 * p's offset in its segment (lo is a segment boundary) wherever p is: the
 * free path finds the span from it (the copy of p it would make for that
 * is 1 instruction). Both loads are operands of the subtraction and the
 * compare (2 instructions fewer; base/asm_operands.h). */
static inline bool lull_in_segment_run_at(const void *p, uintptr_t *off) {
#if LULL_ASM_OPERANDS
    uintptr_t x = (uintptr_t)p;
    bool inside;
    __asm__("sub %[lo], %[x]\n\tcmp %[len], %[x]"
            : [x] "+r"(x), "=@ccb"(inside)
            : [lo] "m"(lull_the_segment_run.lo), [len] "m"(lull_the_segment_run.len));
    *off = x;
    return inside;
#else
    *off = (uintptr_t)p - atomic_load_explicit(&lull_the_segment_run.lo, memory_order_relaxed);
    return *off < atomic_load_explicit(&lull_the_segment_run.len, memory_order_relaxed);
#endif
}

static inline bool lull_in_segment_run(const void *p) {
    uintptr_t off;
    return lull_in_segment_run_at(p, &off);
}

/* The run starts at `lo` (once, before the first segment). */
void lull_segment_run_init(uintptr_t lo);
/* A segment mapped and initialised (its header written) is set in the map,
 * then the run takes in every segment that now follows it back to back:
 * another thread's too, so that of two threads that publish the two
 * segments after the run's end at once, whichever grows it last takes
 * both (tests/test_race_segment_run.c, point segment_run between the two
 * steps). */
void lull_segment_publish(uintptr_t segment);

static inline bool lull_segment_map_has(uintptr_t segment) {
    uintptr_t i = segment >> LULL_SEGMENT_SHIFT;
    if (__builtin_expect(i >= LULL_SEGMAP_ENTRIES, 0)) return false;
    return atomic_load_explicit(&lull_segment_map[i], memory_order_relaxed) != 0;
}

static inline void lull_segment_map_set(uintptr_t segment, bool present) {
    atomic_store_explicit(&lull_segment_map[segment >> LULL_SEGMENT_SHIFT], present,
                          memory_order_release);
}

/* The huge header of an over-aligned huge block starting at p, or NULL. */
static inline lull_huge *lull_aligned_huge_of(const void *p) {
    if (((uintptr_t)p & LULL_SEGMENT_MASK) || !lull_map_has(lull_aligned_huge_map, (uintptr_t)p))
        return NULL;
    return (lull_huge *)((uintptr_t)p - LULL_SEGMENT_SIZE);
}

/* The huge header of the huge block starting at p, over-aligned or not, or
 * NULL for a block of a segment's spans. p must be lull's: its segment (or
 * over-aligned block) is mapped. */
static inline lull_huge *lull_huge_block_of(const void *p) {
    lull_huge *h = lull_aligned_huge_of(p);
    if (h) return h;
    lull_segment *seg = (lull_segment *)((uintptr_t)p & ~LULL_SEGMENT_MASK);
    return seg->magic == LULL_HUGE_MAGIC ? (lull_huge *)seg : NULL;
}

#endif
