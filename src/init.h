/* Process-wide start-up and fork handling; the modules' hooks they run
 * are base/module.h's. */
#ifndef LULL_INIT_H
#define LULL_INIT_H

#include <stdbool.h>

/* Initialise the core once (config, size classes, arenas, heaps). Safe to
 * call from the first malloc: it allocates nothing. */
bool lull_ensure_init(void);

#endif
