/* Freed huge blocks waiting for the reclaim thread: a lock-free stack that
 * any thread pushes onto (one CAS) and the reclaim thread empties whole. */
#ifndef LULL_HUGE_QUEUE_H
#define LULL_HUGE_QUEUE_H

#include "src/types.h"

void lull_huge_queue_push(lull_huge *h);
/* Take every queued block (oldest last). */
lull_huge *lull_huge_queue_take_all(void);

#endif
