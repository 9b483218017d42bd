/* A thread's last free of a block of its own waits in its heap until its
 * next free (the deferred free, src/alloc.h). complete_last_free() frees
 * another block, which completes it: the block is back on its span's free
 * list, first to be handed out, and its span's count of blocks in use is
 * down by one. For tests that look at either. */
#ifndef TESTS_SUPPORT_DEFERRED_FREE_H
#define TESTS_SUPPORT_DEFERRED_FREE_H

#include "lull.h"

static inline void complete_last_free(void) {
    lull_free(lull_malloc(16));
}

#endif
