/* Size classes (src/size_class.c): every small size maps to the smallest
 * class that holds it, classes waste less than 12.5 % above 128 bytes, every
 * class's span wastes less than 12.5 % at its tail, and what lull_malloc hands
 * out agrees with the tables. */
#define _GNU_SOURCE
#include "src/size_class.h"
#include "lull.h"

#include <criterion/criterion.h>
#include <stdint.h>

static void init(void) {
    lull_size_classes_init();
}

Test(size_class, table_is_sorted_aligned_and_ends_at_small_max, .init = init) {
    cr_assert_gt(lull_class_count, 12u);
    cr_assert_leq(lull_class_count, (unsigned)LULL_CLASSES);
    for (unsigned c = 2; c < lull_class_count; c++) {
        cr_assert_gt(lull_classes[c].block_size, lull_classes[c - 1].block_size,
                     "class %u (%u B) is not larger than class %u (%u B)", c,
                     lull_classes[c].block_size, c - 1, lull_classes[c - 1].block_size);
    }
    for (unsigned c = 1; c < lull_class_count; c++) {
        /* a block must hold a free-list link and keep malloc's 8-byte alignment */
        cr_assert_eq(lull_classes[c].block_size % 8, 0, "class %u: %u B", c,
                     lull_classes[c].block_size);
        /* above 64 bytes the classes move in 16-byte granules */
        if (lull_classes[c].block_size > 64)
            cr_assert_eq(lull_classes[c].block_size % 16, 0, "class %u: %u B", c,
                         lull_classes[c].block_size);
    }
    cr_assert_eq(lull_classes[1].block_size, 8u);
    cr_assert_eq(lull_classes[lull_class_count - 1].block_size, (uint32_t)LULL_SMALL_MAX);
}

Test(size_class, every_size_gets_the_smallest_class_that_holds_it, .init = init) {
    unsigned expect = 1;
    for (size_t size = 1; size <= LULL_SMALL_MAX; size++) {
        while (lull_classes[expect].block_size < size)
            expect++;
        unsigned c = lull_class_of(size);
        if (c != expect)
            cr_assert_fail("lull_class_of(%zu) = %u (%u B), expected class %u (%u B)", size, c,
                           c < lull_class_count ? lull_classes[c].block_size : 0, expect,
                           lull_classes[expect].block_size);
    }
    /* the 1 KiB lookup table agrees with the computed classes */
    for (size_t size = 1; size <= 1024; size++) {
        unsigned c = lull_small_class_of[(size + 7) >> 3];
        cr_assert_geq(lull_classes[c].block_size, size);
        cr_assert(c == 1 || lull_classes[c - 1].block_size < size, "table entry for %zu", size);
    }
    /* zero bytes is a valid request: the smallest class */
    cr_assert_eq(lull_class_of(0), 1u);
}

Test(size_class, waste_is_under_an_eighth_above_128_bytes, .init = init) {
    for (size_t size = 1; size <= LULL_SMALL_MAX; size++) {
        uint32_t bs = lull_classes[lull_class_of(size)].block_size;
        if (size > 128) {
            if ((bs - size) * 8 >= size)
                cr_assert_fail("size %zu gets a %u-byte block: %.2f %% waste", size, bs,
                               100.0 * (double)(bs - size) / (double)size);
        } else {
            if (bs - size >= 16) cr_assert_fail("size %zu gets a %u-byte block", size, bs);
        }
    }
}

Test(size_class, spans_hold_their_blocks_with_a_small_tail, .init = init) {
    for (unsigned c = 1; c < lull_class_count; c++) {
        const lull_class_info *ci = &lull_classes[c];
        size_t span = (size_t)ci->span_slices * LULL_SLICE_SIZE;
        cr_assert_geq(ci->span_slices, 1, "class %u", c);
        /* a span fits in a segment next to its metadata slice */
        cr_assert_leq(ci->span_slices, LULL_SLICES - LULL_META_SLICES, "class %u", c);
        cr_assert_geq(ci->capacity, 1u, "class %u", c);
        cr_assert_leq((size_t)ci->capacity * ci->block_size, span,
                      "class %u: %u blocks of %u B overflow a %zu-byte span", c, ci->capacity,
                      ci->block_size, span);
        /* the capacity is the most that fits */
        cr_assert_gt((size_t)(ci->capacity + 1) * ci->block_size, span, "class %u", c);
        size_t tail = span - (size_t)ci->capacity * ci->block_size;
        cr_assert_lt(tail * 8, span, "class %u (%u B): tail %zu of a %zu-byte span", c,
                     ci->block_size, tail, span);
        /* a span holds several blocks, so a span per block is never needed */
        cr_assert_geq(ci->capacity, 4u, "class %u (%u B) holds %u blocks per span", c,
                      ci->block_size, ci->capacity);
    }
}

/* What malloc hands out matches the table: usable size is the class size and
 * a block lies inside its span at a multiple of the block size. */
Test(size_class, malloc_uses_the_table, .init = init) {
    for (size_t size = 1; size <= LULL_SMALL_MAX; size = size < 256 ? size + 1 : size + size / 7) {
        void *p = lull_malloc(size);
        cr_assert_not_null(p, "malloc(%zu)", size);
        unsigned c = lull_class_of(size);
        cr_assert_eq(lull_usable_size(p), lull_classes[c].block_size, "malloc(%zu)", size);
        cr_assert_eq((uintptr_t)p % 8, 0, "malloc(%zu) = %p", size, p);
        lull_free(p);
    }
}
