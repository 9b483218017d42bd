/* An allocation that succeeds leaves errno as the caller had it, also when
 * lull's way to the memory met a system call that failed first: an mmap at
 * a 32 MiB boundary that something else holds (EEXIST), tried again at the
 * next one, or a huge block's growth in place refused, and copied instead.
 * A program that sets errno to 0, calls a library and then looks at errno
 * (strtol's callers, for one) saw EEXIST after a malloc() or realloc()
 * that worked. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/span.h"
#include "base/types.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MiB ((size_t)1 << 20)

/* A page of someone else's at addr (if it is free). */
static void take_page_at(uintptr_t addr) {
    void *p = mmap((void *)addr, 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    cr_assert(p == (void *)addr || (p == MAP_FAILED && errno == EEXIST),
              "mmap at %#lx: %p (errno %d)", (unsigned long)addr, p, errno);
}

/* The growth of a huge block finds the address space after its mapping
 * taken: realloc() copies, and succeeds. */
Test(errno_kept, realloc_that_copies_after_a_refused_growth) {
    uint8_t *a = lull_malloc(20 * MiB);
    cr_assert_not_null(a);
    memset(a, 0x5a, 20 * MiB);
    lull_huge *h = (lull_huge *)lull_segment_of(a);
    cr_assert_eq(h->magic, LULL_HUGE_MAGIC);
    take_page_at((uintptr_t)h->map_base + h->map_len);
    errno = EDOM;
    uint8_t *b = lull_realloc(a, 40 * MiB);
    cr_assert_not_null(b);
    cr_assert_eq(errno, EDOM, "realloc() succeeded and set errno to %d", errno);
    cr_assert_eq(b[0], 0x5a);
    cr_assert_eq(b[20 * MiB - 1], 0x5a);
    lull_free(b);
}

/* A new huge block whose first boundary is taken is mapped at the next. */
Test(errno_kept, malloc_at_the_next_boundary) {
    uint8_t *a = lull_malloc(20 * MiB);
    cr_assert_not_null(a);
    /* the next huge mapping is tried first at the boundary after this
     * one's 32 MiB (os.c's huge placement) */
    uintptr_t header = (uintptr_t)lull_segment_of(a);
    take_page_at(header + LULL_SEGMENT_SIZE);
    errno = EDOM;
    uint8_t *b = lull_malloc(20 * MiB);
    cr_assert_not_null(b);
    cr_assert_eq(errno, EDOM, "malloc() succeeded and set errno to %d", errno);
    lull_free(b);
    lull_free(a);
}
