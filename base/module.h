/* The modules that start with lull (reclaim/, numa/, the counter page):
 * each registers its hooks once at start (src/modules.c lists them), and
 * start-up and fork (src/init.c) run them. Here, below every folder, so
 * that a module registers without knowing who runs it. */
#ifndef LULL_MODULE_H
#define LULL_MODULE_H

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

/* Run one hook of every module: in registration order, or reversed. */
typedef enum {
    LULL_MODULE_START,
    LULL_MODULE_FORK_PREPARE,
    LULL_MODULE_FORK_PARENT,
    LULL_MODULE_FORK_CHILD,
    LULL_MODULE_AT_EXIT,
} lull_module_event;
void lull_modules_run(lull_module_event event, int reversed);

/* The start may wait for the first allocation (src/init.c): an entry point
 * that needs the modules started (lull_reclaim_now, the statistics) calls
 * lull_modules_ensure_started(), which runs what src/init.c installed. */
void lull_modules_set_starter(void (*start)(void));
void lull_modules_ensure_started(void);

#endif
