/* NUMA start-up and the node -> arena mapping. Arena i serves node i
 * (LULL_MAX_NODES arenas; a node id beyond that, or a node without memory,
 * uses the nearest node with memory). Started from the library constructor:
 * numa_topology_init() may dlopen libnuma, which allocates. */
#include "lull.h"
#include "numa/arena.h"
#include "numa/bind.h"
#include "numa/home_node.h"
#include "numa/numa_module.h"
#include "numa/topology.h"
#include "base/config.h"
#include "numa/home_arena.h"
#include "base/module.h"
#include "base/fork_exec.h"
#include "base/message.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>

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

/* "0-2,5" for the nodes of mask into buf. */
static void format_nodes(char *buf, size_t len, uint64_t mask) {
    size_t n = 0;
    buf[0] = '\0';
    for (int a = 0; a < 64 && n + 12 < len; a++) {
        if (!(mask >> a & 1)) continue;
        int b = a;
        while (b + 1 < 64 && (mask >> (b + 1) & 1))
            b++;
        int w = b > a ? snprintf(buf + n, len - n, "%s%d-%d", n ? "," : "", a, b)
                      : snprintf(buf + n, len - n, "%s%d", n ? "," : "", a);
        if (w < 0) break;
        n += (size_t)w;
        a = b;
    }
}

/* numa_nodes names nodes for bind and interleave: those this machine does
 * not have (a configuration written for another machine), or that have no
 * memory, are dropped, and said once. The nodes left stay in force; when
 * none is left, numa_nodes is the default, every node. */
static void check_numa_nodes(const struct numa_topology *t) {
    uint64_t want = lull_config.numa_nodes;
    if (!want || (lull_config.numa != LULL_NUMA_BIND && lull_config.numa != LULL_NUMA_INTERLEAVE))
        return;
    uint64_t usable = want & t->node_mask & t->mem_node_mask;
    if (usable == want) return;
    uint64_t absent = want & ~t->node_mask, memless = want & t->node_mask & ~t->mem_node_mask;
    char a[192], m[192], here[192], left[192], what[448];
    format_nodes(a, sizeof a, absent);
    format_nodes(m, sizeof m, memless);
    format_nodes(here, sizeof here, t->node_mask & t->mem_node_mask);
    format_nodes(left, sizeof left, usable);
    bool one_absent = (absent & (absent - 1)) == 0, one_memless = (memless & (memless - 1)) == 0;
    int n = 0;
    if (absent)
        n = snprintf(what, sizeof what, "node%s %s do%s not exist", one_absent ? "" : "s", a,
                     one_absent ? "es" : "");
    if (memless && n >= 0 && (size_t)n < sizeof what)
        snprintf(what + n, sizeof what - (size_t)n, "%snode%s %s ha%s no memory",
                 absent ? ", " : "", one_memless ? "" : "s", m, one_memless ? "s" : "ve");
    const char *policy = lull_config.numa == LULL_NUMA_BIND ? "bind" : "interleave";
    if (usable)
        lull_message("numa_nodes: %s (nodes with memory here: %s); numa=%s uses node%s %s", what,
                     here, policy, (usable & (usable - 1)) ? "s" : "", left);
    else
        lull_message("numa_nodes: %s (nodes with memory here: %s); numa=%s uses every node", what,
                     here, policy);
    lull_config.numa_nodes = usable;
}

static void numa_start(void) {
    if (lull_config.numa == LULL_NUMA_OFF) return;
    numa_topology_init();
    home_node_init();
    const struct numa_topology *t = numa_topology();
    check_numa_nodes(t);
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

int lull_numa_arena_of_node(int node) {
    return node >= 0 ? arena_of_node(node) : home_arena();
}

LULL_FORK_EXEC_TEXT bool lull_numa_start_loads_library(void) {
    /* the configuration is not loaded yet: numa=off may still say no */
    return numa_topology_needs_libnuma();
}

LULL_FORK_EXEC_TEXT void lull_numa_register(void) {
    static const lull_module_hooks hooks = {.start = numa_start};
    lull_register_module(&hooks);
}
