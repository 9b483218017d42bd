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

static int home_arena(void) {
    return arena_of_node(lull_current_node());
}

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
    /* Segments mapped before the hook (allocations of the dynamic loader,
     * of libc's start-up, of the dlopen of libnuma just above) have no
     * policy yet: bind them now. Their touched pages stay where they are;
     * the rest (most of a 32 MiB segment) follow the policy. Only arena 0
     * can have any: there was one arena until now. */
    for (lull_segment *s = atomic_load_explicit(&lull_arenas[0].segments, memory_order_acquire); s;
         s = s->next)
        numa_segment_prepare(s, LULL_SEGMENT_SIZE, lull_arenas[0].node);
    if (arenas > 1) lull_set_home_node_fn(home_arena);
    lull_verbose("numa: %d node(s), topology from %s, home node from %s", t->node_count,
                 numa_topology_source(), home_node_source());
}

LULL_EXPORT int lull_thread_set_node(int node) {
    lull_heap *h = lull_heap_get_or_create();
    if (!h) return -ENOMEM;
    int err = home_node_set_thread(node);
    if (err) return err;
    int arena = node >= 0 ? arena_of_node(node) : home_arena();
    if (arena != h->node) {
        /* The heap's spans are memory of its old node, and it would keep
         * serving small blocks from them: leave it to the next thread of
         * that node (as at thread exit) and take a heap of the new one
         * (lull_home_node() now sees the override). */
        lull_heap_abandon(h);
        h = lull_heap_get_or_create();
        if (!h) return -ENOMEM;
    }
    h->node_pinned = node >= 0;
    h->node = arena;
    h->arena = &lull_arenas[arena];
    return 0;
}

void lull_numa_register(void) {
    static const lull_module_hooks hooks = {.start = numa_start};
    lull_register_module(&hooks);
}
