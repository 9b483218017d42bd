/* Is the page at `at` (page-aligned) mapped? Asked with a mapping that may
 * not replace anything there: EEXIST says something is. For tests that
 * need the page after a segment's end to be unmapped. */
#ifndef TESTS_SUPPORT_PAGE_MAPPED_H
#define TESTS_SUPPORT_PAGE_MAPPED_H

#include <stdbool.h>
#include <sys/mman.h>

static inline bool page_mapped(const void *at) {
    void *q =
        mmap((void *)at, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (q == MAP_FAILED) return true; /* EEXIST */
    munmap(q, 4096);
    return q != at;
}

#endif
