/* Tails of huge blocks shrunk in place by realloc, waiting for the reclaim
 * thread to purge and unmap them: a request thread never gives memory back
 * to the kernel itself.
 *
 * A Treiber stack whose nodes live in the tails themselves (their first
 * page): push is one CAS on the head by the realloc that cut the tail off
 * its block (the block's owner); the reclaim thread takes the stack whole
 * (one exchange: no ABA) inside its huge step and gives every tail back.
 * Nobody else reads a node. */
#ifndef LULL_HUGE_TAIL_H
#define LULL_HUGE_TAIL_H

#include "base/types.h"

typedef struct lull_huge_tail {
    struct lull_huge_tail *next;
    size_t len;   /* the tail's address space, from the node on */
    size_t dirty; /* of which the first bytes were the block's: maybe resident */
    int node;     /* accounting node of the block it was cut from */
} lull_huge_tail;

/* Any thread: queue [start, start + len) (page aligned) for the reclaim
 * thread, its first `dirty` bytes counted in the resident estimate and as
 * `freed` (numa/huge.h, lull_huge_shrink_in_place). */
void lull_huge_tail_push(void *start, size_t len, size_t dirty, int node);
/* The reclaim thread: every queued tail, newest first, linked by `next`. */
lull_huge_tail *lull_huge_tail_take_all(void);
/* The reclaim thread, after it unmapped a taken tail of `len` bytes. */
void lull_huge_tail_unmapped(size_t len);
/* The address space the tails pushed and not yet unmapped hold: room a
 * mapping the kernel refused (an address space limit) gets back from the
 * next forced tick, as a freed mapping's (numa/huge.h, the held hook). */
uint64_t lull_huge_tail_bytes(void);
/* In the child after fork (reclaim_thread.c's fork handler): the held
 * bytes counted again from the stack (a push another thread had counted
 * and not yet made is not the child's). */
void lull_huge_tail_after_fork_child(void);

#endif
