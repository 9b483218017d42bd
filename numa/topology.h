/* NUMA topology: which nodes exist, which CPUs and how much memory each
 * has, and how far apart they are.
 *
 * numa_topology_init() fills it once, from libnuma when libnuma.so.1 can be
 * loaded (dlopen at run time: lull never links libnuma, so it runs where
 * libnuma is absent), else from /sys/devices/system/node directly, else as
 * a single node. It may allocate (dlopen and libnuma do): call it once the
 * allocator can serve those allocations, never from a malloc path. Every
 * other function here is allocation-free and syscall-free.
 *
 * Unit tests replace the detected topology with numa_topology_inject() to
 * fake several nodes on a one-node host. */
#ifndef LULL_NUMA_TOPOLOGY_H
#define LULL_NUMA_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>

#define NUMA_MAX_NODES 64  /* node ids 0..63: a node mask is one uint64_t */
#define NUMA_MAX_CPUS 1024 /* CPU ids 0..1023 */
#define NUMA_DISTANCE_LOCAL 10
#define NUMA_DISTANCE_REMOTE 20 /* the kernel's default without an ACPI SLIT */

typedef enum {
    NUMA_SOURCE_SINGLE,   /* no NUMA information: one node 0 with every CPU */
    NUMA_SOURCE_SYSFS,    /* /sys/devices/system/node read directly */
    NUMA_SOURCE_LIBNUMA,  /* libnuma.so.1, loaded with dlopen */
    NUMA_SOURCE_INJECTED, /* numa_topology_inject() (tests) */
} numa_source;

struct numa_topology {
    numa_source source;
    int node_count;         /* number of nodes present (bits set in node_mask) */
    int max_node;           /* highest node id present */
    int cpu_count;          /* highest possible CPU id + 1 (<= NUMA_MAX_CPUS) */
    uint64_t node_mask;     /* bit n: node n is present (online) */
    uint64_t mem_node_mask; /* bit n: node n has memory */
    /* cpu_node[c]: node of CPU c, -1 when c is not present. */
    int16_t cpu_node[NUMA_MAX_CPUS];
    uint16_t node_cpu_count[NUMA_MAX_NODES];
    uint64_t node_cpus[NUMA_MAX_NODES][NUMA_MAX_CPUS / 64]; /* CPU bitmap per node */
    /* distance[a][b]: SLIT distance from a to b (10 = local). It need not be
     * symmetric. 0 for nodes that are not present. */
    uint8_t distance[NUMA_MAX_NODES][NUMA_MAX_NODES];
    uint64_t mem_total[NUMA_MAX_NODES]; /* bytes */
    uint64_t mem_free[NUMA_MAX_NODES];  /* bytes, when the topology was read */
};

/* The topology in force. Before numa_topology_init() it is one node 0 that
 * owns every CPU (source "single"). Hidden so that the inline accessors are
 * one PC-relative load. */
extern const struct numa_topology *lull_numa_current __attribute__((visibility("hidden")));

/* Detect the topology (libnuma, else sysfs, else single node). Always leaves
 * a usable topology and returns its node count. LULL_FAULT_NUMA armed makes
 * it behave as if libnuma were absent. Not safe against concurrent readers:
 * call it once at start (tests may call it again). It does not undo an
 * injection: numa_topology_inject(NULL) does. */
int numa_topology_init(void);
/* Would numa_topology_init() load libnuma (more than one possible node)?
 * Reads one sysfs file; allocates nothing. */
bool numa_topology_needs_libnuma(void);

static inline const struct numa_topology *numa_topology(void) {
    return lull_numa_current;
}

/* Node of a CPU, -1 when unknown. */
static inline int numa_cpu_node(int cpu) {
    if ((unsigned)cpu >= NUMA_MAX_CPUS) return -1;
    return lull_numa_current->cpu_node[cpu];
}

static inline int numa_node_count(void) {
    return lull_numa_current->node_count;
}

static inline bool numa_node_present(int node) {
    return (unsigned)node < NUMA_MAX_NODES && (lull_numa_current->node_mask >> node & 1);
}

/* Distance between two present nodes; 0 if either is not present. */
static inline int numa_node_distance(int from, int to) {
    if ((unsigned)from >= NUMA_MAX_NODES || (unsigned)to >= NUMA_MAX_NODES) return 0;
    return lull_numa_current->distance[from][to];
}

/* The nodes with memory ordered by distance from `node` (ties: lower id
 * first), `node` itself first when it has memory. A node without memory
 * (a CPU-only node) gets its nearest memory nodes. Writes at most max
 * entries and returns how many; -1 if node is not present. For an arena
 * whose node has no free memory left: try order[1], order[2], ... */
int numa_nearest_nodes(int node, int *order, int max);

/* "libnuma", "sysfs", "injected" or "single". */
const char *numa_topology_source(void);
/* Why the topology did not come from libnuma ("" when it did), e.g.
 * "libnuma.so.1: cannot open shared object file", "fault injected",
 * "one possible node: libnuma not loaded",
 * "/sys/devices/system/node: No such file or directory". For the stats. */
const char *numa_topology_fallback_reason(void);

/* Replace the topology with a copy of *t (tests). Only the fields a test
 * means need be set: cpu_count, cpu_node[0..cpu_count), distance and
 * mem_total / mem_free of each node; node_mask (0: the nodes named in
 * cpu_node or with memory), mem_node_mask (0: nodes with mem_total > 0, or
 * every node when no node has mem_total), node_count, max_node,
 * node_cpu_count and node_cpus are derived; distance entries left 0 become
 * 10 on the diagonal and 20 elsewhere. source becomes NUMA_SOURCE_INJECTED.
 * NULL restores the detected topology. Returns 0, or -EINVAL (with the
 * topology unchanged) for a node id >= NUMA_MAX_NODES or cpu_count out of
 * range. Call home_node_init() afterwards so the home node uses it. */
int numa_topology_inject(const struct numa_topology *t);

/* On a machine with one possible node the topology comes from sysfs and
 * libnuma is never loaded; on (tests): load libnuma there too. */
void numa_topology_always_libnuma(bool on);

/* Read sysfs from root instead of "/sys" (NULL: back to "/sys"): tests
 * give the sysfs reader a fake tree (root/devices/system/node/...). libnuma
 * always reads the real one, so arm LULL_FAULT_NUMA too. 0 or -EINVAL. */
int numa_topology_set_sysfs_root(const char *root);

/* Format "nodes=2 source=sysfs node0: cpus=1 mem=512M dist=10,21 ..." into
 * buf (for verbose output and the guest test). Returns the length. */
int numa_topology_format(char *buf, int len);

#endif
