/* The node a thread's new heap and spans should use: 0, unless the NUMA
 * module (numa/numa_module.c) installed its choice at start. A module of
 * its own, so that heaps and start-up both use it without knowing each
 * other. */
#ifndef LULL_HOME_ARENA_H
#define LULL_HOME_ARENA_H

int lull_home_node(void);
/* Installed once, at start, before threads other than the first exist. */
void lull_set_home_node_fn(int (*fn)(void));

#endif
