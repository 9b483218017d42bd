/* Memory policy of whole segments (mbind), and where pages landed
 * (move_pages / get_mempolicy) for tests and statistics.
 *
 * Bind a segment once, after mmap and before publishing it: a policy on
 * part of a mapping splits its VMA (vm.max_map_count is 65530), and the
 * policy only steers pages faulted in after it is set (existing pages are
 * not moved). All functions make raw system calls: no libnuma, no
 * allocation. */
#ifndef LULL_NUMA_BIND_H
#define LULL_NUMA_BIND_H

#include <stddef.h>
#include <stdint.h>

#include "numa/topology.h"
#include "base/config.h"

/* Set the policy of [addr, addr + len) (addr page aligned) for an arena of
 * `node`:
 *   LULL_NUMA_LOCAL       MPOL_PREFERRED {node}: pages come from node, and
 *                         when it is full from the nearest node with free
 *                         memory (the kernel walks node's zonelist, ordered
 *                         by distance). node < 0: MPOL_LOCAL (the node of
 *                         whichever CPU faults the page in).
 *   LULL_NUMA_INTERLEAVE  MPOL_INTERLEAVE over nodemask (0: every node with
 *                         memory), page by page.
 *   LULL_NUMA_BIND        MPOL_BIND to nodemask (0: every node with memory):
 *                         never outside it (the kernel OOMs instead). When
 *                         node is in the mask it becomes the policy's home
 *                         node (set_mempolicy_home_node, 5.17+), so pages
 *                         come from node first, then the nearest node of
 *                         the mask; without that call the faulting CPU's
 *                         node comes first. Kernels before 6.7 ignore the
 *                         home node for transparent huge pages: a huge page
 *                         comes from the faulting CPU's node when the mask
 *                         allows it (measured in the guest on 6.1).
 *   LULL_NUMA_OFF         nothing (returns 1).
 * Returns 0 when the policy was set, 1 when there was nothing to do (policy
 * off, or a one-node topology), or -errno (-EINVAL: bad alignment, a node
 * the kernel does not have, an empty mask). A failure leaves the default
 * policy: memory still works, it is just not placed. */
int numa_bind_segment(void *addr, size_t len, int node, lull_numa_policy policy, uint64_t nodemask);

/* The allocator's segment hook (shape of lull_segment_prepare_hook): bind
 * a new segment of `node`'s arena as lull_config.numa and
 * lull_config.numa_nodes say. A failure is reported once (lull_message)
 * and counted; the segment stays usable. */
void numa_segment_prepare(void *segment, size_t len, int node);

/* What numa_bind_segment() did so far, for the stats. */
struct numa_bind_stats {
    uint64_t bound;   /* policies set */
    uint64_t skipped; /* nothing to do (policy off, one node) */
    uint64_t failed;  /* the kernel refused (segment left on the default policy) */
    int last_error;   /* -errno of the last failure, 0 if none */
};
void numa_bind_stats(struct numa_bind_stats *out);

/* Node holding the page at addr (move_pages with no target nodes), or
 * -errno: -ENOENT when the page is not present (never touched, or purged;
 * kernels before 6.x say -EFAULT there), -EFAULT for an unmapped address. */
int numa_page_node(const void *addr);

/* Count the pages of [addr, addr + len) per node into counts[0..63]
 * (zeroed first); pages not present are counted in *absent (may be NULL).
 * Returns the number of pages examined, or -errno. page_size 0 = 4096. */
long numa_pages_nodes(const void *addr, size_t len, size_t page_size,
                      uint64_t counts[NUMA_MAX_NODES], uint64_t *absent);

/* The policy set on the mapping that contains addr: *mode gets MPOL_* (0 =
 * MPOL_DEFAULT), *mask its node mask. 0 or -errno. */
int numa_segment_policy(const void *addr, int *mode, uint64_t *mask);

#endif
