/* The module registry; see module.h. */
#include "base/module.h"
#include "base/fork_exec.h"

#include <stddef.h>

/* written by the library constructor, read by the fork handlers */
static LULL_FORK_EXEC_DATA lull_module_hooks modules[LULL_MAX_MODULES];
static LULL_FORK_EXEC_DATA int module_count;

LULL_FORK_EXEC_TEXT void lull_register_module(const lull_module_hooks *hooks) {
    if (module_count < LULL_MAX_MODULES) modules[module_count++] = *hooks;
}

static void (*hook_of(const lull_module_hooks *m, lull_module_event event))(void) {
    switch (event) {
    case LULL_MODULE_START:
        return m->start;
    case LULL_MODULE_FORK_PREPARE:
        return m->fork_prepare;
    case LULL_MODULE_FORK_PARENT:
        return m->fork_parent;
    case LULL_MODULE_FORK_CHILD:
        return m->fork_child;
    default:
        return m->at_exit;
    }
}

LULL_FORK_EXEC_TEXT void lull_modules_run(lull_module_event event, int reversed) {
    for (int k = 0; k < module_count; k++) {
        const lull_module_hooks *m = &modules[reversed ? module_count - 1 - k : k];
        void (*fn)(void) = hook_of(m, event);
        if (fn) fn();
    }
}

static LULL_FORK_EXEC_DATA void (*starter)(void);

LULL_FORK_EXEC_TEXT void lull_modules_set_starter(void (*start)(void)) {
    __atomic_store_n(&starter, start, __ATOMIC_RELEASE);
}

void lull_modules_ensure_started(void) {
    void (*start)(void) = __atomic_load_n(&starter, __ATOMIC_ACQUIRE);
    if (start) start();
}
