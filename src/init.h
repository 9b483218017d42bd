/* Process-wide start-up, fork handling and the hooks the other modules
 * (reclaim/, numa/, the counter page) register at start. */
#ifndef LULL_INIT_H
#define LULL_INIT_H

#include <stdbool.h>

/* Initialise the core once (config, size classes, arenas, heaps). Safe to
 * call from the first malloc: it allocates nothing. */
bool lull_ensure_init(void);

/* Module hooks, each optional; set during start-up. */
typedef struct lull_module_hooks {
    void (*start)(void);        /* after the core, outside any lull lock */
    void (*fork_prepare)(void); /* take the module's locks (reverse order, before the core's) */
    void (*fork_parent)(void);
    /* reset; start no thread: the child stays single-threaded until it
     * needs one (reclaim/reclaim.h) */
    void (*fork_child)(void);
    void (*at_exit)(void);
} lull_module_hooks;

#define LULL_MAX_MODULES 8
void lull_register_module(const lull_module_hooks *hooks);

#endif
