/* Segments whose NUMA binding the kernel refuses: two nodes injected on
 * this host (numa_topology_inject) and the configuration binding to node 1,
 * which the kernel here does not have, so numa_segment_prepare's mbind
 * fails with EINVAL (a host that has a node 1 binds: the caller checks
 * numa_bind_stats and skips). Header-only: a Criterion test includes it. */
#ifndef LULL_TEST_NUMA_UNBINDABLE_H
#define LULL_TEST_NUMA_UNBINDABLE_H

#include "lull.h"
#include "base/config.h"
#include "numa/arena.h"
#include "numa/bind.h"
#include "numa/topology.h"

#include <criterion/criterion.h>
#include <string.h>

static inline void numa_bind_to_absent_node(void) {
    lull_free(lull_malloc(16)); /* lull started: the segment hook is set */
    cr_assert(lull_segment_prepare_hook == numa_segment_prepare,
              "numa=local at start installs the segment hook");
    struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = 1;
    t.cpu_node[0] = 0;
    t.mem_total[0] = t.mem_total[1] = 1ull << 30;
    t.mem_free[0] = t.mem_free[1] = 1ull << 29;
    cr_assert_eq(numa_topology_inject(&t), 0);
    cr_assert_eq(numa_node_count(), 2);
    lull_config.numa = LULL_NUMA_BIND;
    lull_config.numa_nodes = 1ull << 1;
}

#endif
