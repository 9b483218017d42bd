/* The interior-pointer test of free() (src/span.h, lull_block_misaligned):
 * for every small class, at spans placed anywhere in a segment, a pointer
 * is taken for a block start exactly when its offset in the span is a
 * multiple of the block size. Checked against `%` at every offset of the
 * spans of classes up to 1 KiB and, for the larger classes, around every
 * block start and at random offsets. */
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t next_random(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

/* A descriptor of class c whose span starts at `start`, as span taking
 * sets it up (src/alloc.c): only the two fields the test reads. */
static lull_span span_at(const lull_class_info *c, uintptr_t start) {
    lull_span s = {0};
    s.div_magic = c->div_magic;
    s.start_magic = (uint64_t)start * c->div_magic;
    return s;
}

static void check_offset(const lull_span *s, uintptr_t start, uint32_t size, size_t off) {
    bool want = off % size != 0;
    cr_assert_eq(lull_block_misaligned(s, (void *)(start + off)), want,
                 "block size %u, span at %#lx, offset %zu: misaligned should be %d", size,
                 (unsigned long)start, off, want);
}

/* Span starts: the first slice after the metadata, one in the middle, the
 * last a span of this length fits in, in segments low and high in the
 * address space. */
static void for_each_start(const lull_class_info *c,
                           void (*check)(const lull_class_info *, const lull_span *, uintptr_t)) {
    const uintptr_t segments[] = {(uintptr_t)1 << 32, (uintptr_t)0x7f12 << 32};
    size_t span_bytes = (size_t)c->span_slices << LULL_SLICE_SHIFT;
    for (unsigned k = 0; k < sizeof segments / sizeof segments[0]; k++) {
        uintptr_t first = segments[k] + ((uintptr_t)LULL_META_SLICES << LULL_SLICE_SHIFT);
        uintptr_t last = segments[k] + LULL_SEGMENT_SIZE - span_bytes;
        uintptr_t starts[] = {first, first + (((last - first) / 2) & ~(LULL_SLICE_SIZE - 1)), last};
        for (unsigned j = 0; j < 3; j++) {
            lull_span s = span_at(c, starts[j]);
            check(c, &s, starts[j]);
        }
    }
}

static void every_offset(const lull_class_info *c, const lull_span *s, uintptr_t start) {
    size_t span_bytes = (size_t)c->span_slices << LULL_SLICE_SHIFT;
    for (size_t off = 0; off < span_bytes; off++)
        check_offset(s, start, c->block_size, off);
}

static void around_block_starts(const lull_class_info *c, const lull_span *s, uintptr_t start) {
    size_t span_bytes = (size_t)c->span_slices << LULL_SLICE_SHIFT;
    for (size_t b = 0; b < span_bytes; b += c->block_size) {
        check_offset(s, start, c->block_size, b);
        if (b) check_offset(s, start, c->block_size, b - 1);
        if (b + 1 < span_bytes) check_offset(s, start, c->block_size, b + 1);
        if (b + 16 < span_bytes) check_offset(s, start, c->block_size, b + 16);
    }
    for (unsigned i = 0; i < 4096; i++)
        check_offset(s, start, c->block_size, next_random() % span_bytes);
}

Test(block_misaligned, every_offset_of_the_classes_up_to_1_kib) {
    lull_size_classes_init();
    unsigned checked = 0;
    for (unsigned i = 1; i < lull_class_count; i++) {
        if (lull_classes[i].block_size > 1024) continue;
        for_each_start(&lull_classes[i], every_offset);
        checked++;
    }
    cr_assert_gt(checked, 20, "only %u classes of at most 1 KiB", checked);
}

Test(block_misaligned, around_every_block_start_of_the_larger_classes) {
    lull_size_classes_init();
    unsigned checked = 0;
    for (unsigned i = 1; i < lull_class_count; i++) {
        if (lull_classes[i].block_size <= 1024) continue;
        for_each_start(&lull_classes[i], around_block_starts);
        checked++;
    }
    cr_assert_gt(checked, 50, "only %u classes above 1 KiB", checked);
    cr_assert_eq(lull_classes[lull_class_count - 1].block_size, LULL_SMALL_MAX);
}
