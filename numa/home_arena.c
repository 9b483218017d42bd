/* The thread's home node; see home_arena.h. */
#include "numa/home_arena.h"
#include "numa/arena.h"

static int (*home_node_fn)(void);

int lull_home_node(void) {
    int n = home_node_fn ? home_node_fn() : 0;
    return n >= 0 && n < lull_arena_count ? n : 0;
}

void lull_set_home_node_fn(int (*fn)(void)) {
    home_node_fn = fn;
}
