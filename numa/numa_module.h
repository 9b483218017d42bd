/* NUMA start-up (a module: base/module.h) and the node -> arena mapping. */
#ifndef LULL_NUMA_MODULE_H
#define LULL_NUMA_MODULE_H

void lull_numa_register(void);
/* The arena that serves `node` (the nearest node with memory, within
 * LULL_MAX_NODES arenas); node < 0: the calling thread's home arena. */
int lull_numa_arena_of_node(int node);

#endif
