/* malloc's direct table (src/heap.h): for every size up to 1 KiB,
 * direct[(size + 7) >> 3] must be the current span of that size's class,
 * whatever the heap did meanwhile (spans filled, emptied, given back,
 * remote frees collected); a stale slot would hand out blocks of the wrong
 * size. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/size_class.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

static void assert_in_step(const char *when) {
    lull_heap *h = lull_tl_heap;
    for (unsigned w = 0; w < LULL_DIRECT_WORDS; w++) {
        unsigned c = lull_small_class_of[w];
        cr_assert_eq(h->direct[w], h->current[c], "%s: direct[%u] is not current[%u]", when, w, c);
    }
}

Test(heap_direct, word_ranges_cover_every_small_size_once) {
    lull_free(lull_malloc(1)); /* size classes are set up */
    for (unsigned w = 0; w < LULL_DIRECT_WORDS; w++) {
        unsigned c = lull_small_class_of[w];
        cr_assert_leq(lull_class_first_word[c], w, "word %u (class %u)", w, c);
        cr_assert_geq(lull_class_last_word[c], w, "word %u (class %u)", w, c);
    }
    for (unsigned c = 1; c < lull_class_count; c++)
        if (lull_class_first_word[c] <= lull_class_last_word[c])
            cr_assert_leq(lull_classes[c].block_size, 1024, "class %u has direct words", c);
}

Test(heap_direct, the_table_follows_the_current_spans) {
    enum { N = 20000 };
    static void *p[N];
    static size_t sz[N];
    uint64_t rng = 7;
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            sz[i] = (size_t)(rng >> 33) % 1025;
            p[i] = lull_malloc(sz[i]);
            cr_assert_not_null(p[i]);
            cr_assert_geq(lull_usable_size(p[i]), sz[i]);
        }
        assert_in_step("after the allocations");
        /* free every other block, then the rest: spans go from full to
         * partly free to empty (and back to the arena) */
        for (int i = 0; i < N; i += 2)
            lull_free(p[i]);
        assert_in_step("after half the frees");
        for (int i = 1; i < N; i += 2)
            lull_free(p[i]);
        assert_in_step("after all the frees");
    }
}
