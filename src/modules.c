/* The modules that start with lull, in start order. Each registers its
 * hooks (start, fork, exit) with lull_register_module(); fork-child hooks
 * run in this order, so the counter page is forgotten before the child's
 * reclaim thread starts and opens its own. */
#include "numa/numa_module.h"
#include "reclaim/reclaim.h"
#include "base/module.h"
#include "base/fork_exec.h"

void lull_modules_register_all(void);
void lull_stats_publish_register(void);
void lull_profile_register(void);

LULL_FORK_EXEC_TEXT void lull_modules_register_all(void) {
    lull_numa_register();
    lull_stats_publish_register();
    lull_reclaim_register();
    lull_profile_register();
}
