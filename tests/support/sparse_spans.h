/* Three spans of one class, as tests/test_defrag.c builds them: a keeps a
 * tenth of its blocks (sparse), b nine tenths (dense), c half (current).
 * A live block of a is what a defrag move helps. */
#ifndef TESTS_SUPPORT_SPARSE_SPANS_H
#define TESTS_SUPPORT_SPARSE_SPANS_H

#include "lull.h"
#include "src/size_class.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <sys/mman.h>

/* A live block of the sparse span; NULL if it kept none. */
static inline void *sparse_block(size_t size) {
    unsigned cap = lull_classes[lull_class_of(size)].capacity;
    /* not the allocator's memory: the blocks' pointers stay out of it */
    void **blocks = mmap(NULL, 3 * cap * sizeof(void *), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(blocks, MAP_FAILED);
    for (unsigned i = 0; i < 3 * cap; i++)
        blocks[i] = lull_malloc(size);
    static const unsigned keep[3] = {10, 90, 50};
    for (unsigned s = 3; s-- > 0;)
        for (unsigned k = 0; k < cap; k++)
            if ((k * 37 % 100) >= keep[s]) {
                lull_free(blocks[s * cap + k]);
                blocks[s * cap + k] = NULL;
            }
    void *live = NULL;
    for (unsigned k = 0; k < cap && !live; k++)
        live = blocks[k];
    munmap(blocks, 3 * cap * sizeof(void *));
    return live;
}

#endif
