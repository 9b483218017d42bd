/* An allocation that succeeds leaves errno as the caller had it, also when
 * it met the heap limit on the way and waited for the reclaim thread's
 * purge (base/resident.h, lull_resident_relieve): that wait is a futex
 * wait, which ends with ETIMEDOUT (or EAGAIN, EINTR), and a malloc of a
 * large block, or a realloc that grew a huge block in place, that then
 * found room returned its memory with errno ETIMEDOUT. A huge malloc put
 * errno back; the spans' path and the growth in place did not.
 *
 * Made deterministic, with no clock in the outcome: the reclaim thread is
 * held in its tick (tests/support/reclaim_hold.h), so the relief's wait
 * can only end by its own bound, in a futex call that fails; the relief
 * hook is wrapped so that, once the real relief has returned, the limit is
 * lifted on the allocating thread itself: the retry that follows finds
 * room, whatever the time. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/resident.h"
#include "tests/support/reclaim_hold.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static bool (*real_relief)(long wait_ms);
static int reliefs; /* the allocating thread's own calls */

static bool relief_then_no_limit(long wait_ms) {
    bool relieved = real_relief(wait_ms);
    reliefs++;
    lull_configure("heap_limit_mb", "0");
    return relieved;
}

static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("warm_reserve_mb", "0"));
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
    if (!lull_reclaim_now()) cr_skip_test("no reclaim thread: no relief to wait for");
    real_relief = lull_resident_relief_hook;
    cr_assert_not_null(real_relief);
}

/* A limit that leaves less than 1 MiB above what lull holds now (and is
 * not 0, no limit), nothing free left to purge, the reclaim thread held,
 * and the relief wrapped. Each allocation below needs 1 MiB or more of
 * slices or pages that are not resident. */
static void at_the_limit(void) {
    lull_purge_all();
    unsigned mb = (unsigned)((lull_resident_bytes() + MiB - 1) >> 20);
    char v[16];
    snprintf(v, sizeof v, "%u", mb ? mb : 1);
    cr_assert(lull_configure("heap_limit_mb", v));
    cr_assert_lt(lull_resident_room(), MiB);
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    reliefs = 0;
    lull_resident_relief_hook = relief_then_no_limit;
}

static void done(void) {
    lull_resident_relief_hook = real_relief;
    cr_assert(reclaim_release());
    cr_assert_eq(reliefs, 1, "the allocation did not wait for the relief");
}

Test(errno_limit_relief, a_large_malloc_that_finds_room_after_the_relief, .init = setup) {
    at_the_limit();
    errno = 0;
    void *p = lull_malloc(4 * MiB);
    int e = errno;
    done();
    cr_assert_not_null(p);
    cr_assert_eq(e, 0, "malloc succeeded with errno %d (%s)", e, strerror(e));
    memset(p, 1, 4 * MiB);
    lull_free(p);
}

Test(errno_limit_relief, a_small_span_taken_after_the_relief, .init = setup) {
    /* a class whose span is taken anew: the first block of 256 KiB, whose
     * span is 1 MiB */
    at_the_limit();
    errno = 0;
    void *p = lull_malloc(256 * KiB);
    int e = errno;
    done();
    cr_assert_not_null(p);
    cr_assert_eq(e, 0, "malloc succeeded with errno %d (%s)", e, strerror(e));
    lull_free(p);
}

Test(errno_limit_relief, a_huge_block_grown_after_the_relief, .init = setup) {
    char *p = lull_malloc(40 * MiB);
    cr_assert_not_null(p);
    memset(p, 7, 40 * MiB);
    at_the_limit();
    errno = 0;
    char *q = lull_realloc(p, 48 * MiB);
    int e = errno;
    done();
    cr_assert_not_null(q);
    cr_assert_eq(e, 0, "realloc succeeded with errno %d (%s)", e, strerror(e));
    for (size_t i = 0; i < 40 * MiB; i += 4096)
        cr_assert_eq(q[i], 7, "byte %zu lost", i);
    lull_free(q);
}
