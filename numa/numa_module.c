/* NUMA start-up and the node -> arena mapping. Arena i serves node i
 * (LULL_MAX_NODES arenas; a node id beyond that, or a node without memory,
 * uses the nearest node with memory). Started from the library constructor:
 * numa_topology_init() may dlopen libnuma, which allocates. */
#include "lull.h"
#include "numa/arena.h"
#include "numa/bind.h"
#include "numa/home_node.h"
#include "numa/topology.h"
#include "src/config.h"
#include "src/heap.h"
#include "src/init.h"
#include "src/message.h"

#include <errno.h>

void lull_set_home_node_fn(int (*fn)(void));
void lull_numa_register(void);

static int arena_of_node(int node) {
    const struct numa_topology *t = numa_topology();
    if (node < 0) node = 0;
    if (node >= 64 || !(t->mem_node_mask >> node & 1)) {
        int order[1];
        if (numa_nearest_nodes(node, order, 1) > 0) node = order[0];
    }
    if (node >= lull_arena_count) node = 0;
    return node;
}

static int home_arena(void) { return arena_of_node(lull_current_node()); }

static void numa_start(void) {
    if (lull_config.numa == LULL_NUMA_OFF) return;
    numa_topology_init();
    home_node_init();
    const struct numa_topology *t = numa_topology();
    int arenas = t->max_node + 1;
    if (arenas > LULL_MAX_NODES) {
        lull_message("numa: %d nodes; lull keeps arenas for nodes 0-%d, the others use the "
                     "nearest of those",
                     arenas, LULL_MAX_NODES - 1);
        arenas = LULL_MAX_NODES;
    }
    if (arenas < 1) arenas = 1;
    lull_arena_count = arenas;
    lull_segment_prepare_hook = numa_segment_prepare;
    if (arenas > 1) lull_set_home_node_fn(home_arena);
    lull_verbose("numa: %d node(s), topology from %s, home node from %s", t->node_count,
                 numa_topology_source(), home_node_source());
}

LULL_EXPORT int lull_thread_set_node(int node) {
    lull_heap *h = lull_heap_get_or_create();
    if (!h) return -ENOMEM;
    int err = home_node_set_thread(node);
    if (err) return err;
    h->node_pinned = node >= 0;
    h->node = node >= 0 ? arena_of_node(node) : home_arena();
    h->arena = &lull_arenas[h->node];
    return 0;
}

void lull_numa_register(void) {
    static const lull_module_hooks hooks = {.start = numa_start};
    lull_register_module(&hooks);
}
