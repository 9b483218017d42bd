/* NUMA start-up (a module: base/module.h) and the node -> arena mapping. */
#ifndef LULL_NUMA_MODULE_H
#define LULL_NUMA_MODULE_H

#include <stdbool.h>

void lull_numa_register(void);
/* True when the module's start would dlopen libnuma, which must not run
 * inside a malloc (dlopen allocates): the start cannot wait for the first
 * allocation then. */
bool lull_numa_start_loads_library(void);
/* The arena that serves `node` (the nearest node with memory, within
 * LULL_MAX_NODES arenas); node < 0: the calling thread's home arena. */
int lull_numa_arena_of_node(int node);

#endif
