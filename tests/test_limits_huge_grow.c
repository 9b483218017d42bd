/* heap_limit_mb and a huge realloc that grows in place: the pages it grows
 * by must fit under the limit once the reclaim thread has purged what is
 * free, as a new block's must. Refused at once, the realloc fell back to a
 * copy, whose new block needs the whole grown size, and failed with ENOMEM
 * although the grown block fitted under the limit after that purge. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/resident.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("huge_cache_idle_ms", "600000"));
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

Test(limits_huge_grow, a_grow_in_place_that_fits_after_the_purge_succeeds, .init = setup) {
    /* two 40 MiB blocks (41 MiB of room each); the first one freed stays
     * cached, dirty, and counted in the estimate until a purge */
    char *cached = lull_malloc(40 * MiB);
    char *b = lull_malloc(40 * MiB);
    cr_assert(cached && b);
    cached[0] = 1;
    for (size_t i = 0; i < 40 * MiB; i += 4096)
        b[i] = (char)(i >> 12);
    size_t usable = lull_usable_size(b);
    lull_free(cached);
    /* room for 18-19 MiB more: less than the 19 MiB that growing b to
     * 60 MiB takes, until the cached mapping goes; then 59-60 MiB, less
     * than a new 60 MiB block takes (61 MiB of room and its header) */
    unsigned mb = (unsigned)((lull_resident_bytes() + MiB - 1) >> 20) + 18;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    cr_assert_lt(lull_resident_room(), 60 * MiB - usable);

    errno = 0;
    char *c = lull_realloc(b, 60 * MiB);
    cr_assert_not_null(c,
                       "realloc to 60 MiB refused (errno %d) under a limit that fits it once "
                       "the cached mapping is purged",
                       errno);
    cr_assert_eq(c, b, "moved: the address space after the block was taken");
    cr_assert_geq(lull_usable_size(c), 60 * MiB);
    for (size_t i = 0; i < 40 * MiB; i += 4096)
        cr_assert_eq(c[i], (char)(i >> 12), "byte %zu lost", i);
    memset(c + 40 * MiB, 3, 20 * MiB);
    cr_assert_leq(lull_resident_bytes(), lull_resident_limit());
    lull_free(c);
}
