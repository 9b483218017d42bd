/* A malloc that succeeds leaves errno as the caller had it, also when the
 * NUMA policy of the new segment it mapped could not be set: the segment
 * hook (numa_segment_prepare) calls mbind, and set_mempolicy_home_node
 * with numa=bind, and their failures are best effort (the pages go where
 * the kernel puts them; one message says so). Their errno stayed: with
 * numa=bind on a kernel before 5.17 (set_mempolicy_home_node: ENOSYS), or
 * where mbind is refused (a cpuset without the node: EINVAL), every
 * malloc that mapped a segment returned its block with errno changed.
 *
 * Two nodes are injected on this host (numa_topology_inject) and the
 * configuration binds to node 1, which the kernel here does not have (a
 * host that has it skips the test): mbind fails with EINVAL. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "numa/bind.h"
#include "tests/support/numa_unbindable.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define SENTINEL 4242 /* no errno value of the kernel's */
#define BLOCKS 16     /* of 8 MiB: 4 per 32 MiB segment at most */

Test(numa_bind_errno, a_malloc_whose_segment_cannot_be_bound_keeps_errno) {
    numa_bind_to_absent_node();

    struct numa_bind_stats before, after;
    numa_bind_stats(&before);
    uint32_t segments = atomic_load(&lull_arenas[0].segment_count);
    void *blocks[BLOCKS];
    int n = 0, bad = 0, bad_errno = 0;
    for (; n < BLOCKS && atomic_load(&lull_arenas[0].segment_count) < segments + 2; n++) {
        errno = SENTINEL;
        blocks[n] = lull_malloc(8 * MiB);
        int e = errno;
        cr_assert_not_null(blocks[n], "malloc(8 MiB) #%d failed (errno %d)", n, e);
        if (e != SENTINEL && !bad++) bad_errno = e;
    }
    numa_bind_stats(&after);
    for (int i = 0; i < n; i++)
        lull_free(blocks[i]);
    cr_assert_geq(atomic_load(&lull_arenas[0].segment_count), segments + 2,
                  "%d blocks of 8 MiB mapped fewer than two segments", n);
    if (after.failed == before.failed)
        cr_skip_test("binding to node 1 worked here (the host has a node 1): nothing failed");
    cr_assert_eq(bad, 0,
                 "%d of %d successful mallocs changed errno (to %d, %s); the segment bind "
                 "failed %llu times (last error %d)",
                 bad, n, bad_errno, strerrorname_np(bad_errno),
                 (unsigned long long)(after.failed - before.failed), after.last_error);
}
