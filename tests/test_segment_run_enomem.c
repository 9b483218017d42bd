/* A segment the kernel refuses (an address space limit) leaves no hole in
 * the segment run (base/segment_map.h): the boundary it was to take is
 * given back, and the segment made once the limit is lifted joins the run.
 * Each refused malloc took the next 32 MiB boundary for good: the run
 * ended at the first refusal, every later segment was found through the
 * map, and a program that retried under the limit walked the segments'
 * hint through their region into the huge blocks'. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/segment_map.h"

#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <sys/resource.h>

#define MiB ((size_t)1 << 20)
#define HELD 64
#define REFUSED 8

Test(segment_run_enomem, a_segment_refused_at_a_limit_leaves_no_hole_in_the_run) {
    lull_set_purge_delay_ms(-1); /* no purges, no reclaim work meanwhile */
    lull_free(lull_malloc(16));
    cr_assert_gt(atomic_load(&lull_the_segment_run.len), 0, "the first segment is in the run");
    struct rlimit old;
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    /* no room for one more segment: 16 MiB blocks fill the free slices of
     * the segments there are, then fail */
    struct rlimit lim = {vm_bytes() + 4 * MiB, old.rlim_max};
    void *held[HELD];
    int n = 0, refused = 0, errors = 0;
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    while (n < HELD && refused < REFUSED) {
        errno = 0;
        void *p = lull_malloc(16 * MiB);
        if (p) {
            held[n++] = p;
            continue;
        }
        refused++;
        if (errno != ENOMEM) errors++;
    }
    cr_assert_eq(setrlimit(RLIMIT_AS, &old), 0);
    cr_assert_eq(refused, REFUSED, "16 MiB blocks kept coming under the limit");
    cr_assert_eq(errors, 0, "a refused malloc did not set ENOMEM");
    uintptr_t len_refused = atomic_load(&lull_the_segment_run.len);
    /* the limit lifted: two new segments, both in the run */
    void *after[4];
    for (int i = 0; i < 4; i++) {
        after[i] = lull_malloc(16 * MiB);
        cr_assert_not_null(after[i]);
        cr_assert(lull_in_segment_run(after[i]),
                  "block %d at %p after the limit is outside the run [%#lx, %#lx)", i, after[i],
                  (unsigned long)atomic_load(&lull_the_segment_run.lo),
                  (unsigned long)(atomic_load(&lull_the_segment_run.lo) +
                                  atomic_load(&lull_the_segment_run.len)));
    }
    cr_assert_geq(atomic_load(&lull_the_segment_run.len), len_refused + 2 * (uintptr_t)32 * MiB,
                  "the run grew by the new segments");
    for (int i = 0; i < 4; i++)
        lull_free(after[i]);
    for (int i = 0; i < n; i++)
        lull_free(held[i]);
}
