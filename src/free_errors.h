/* The aborts of invalid frees that more than one path reports (the free
 * paths of alloc.c, the owner's collection in heap.c): one message each,
 * naming the address. */
#ifndef LULL_FREE_ERRORS_H
#define LULL_FREE_ERRORS_H

#include "base/types.h"

/* A block freed twice from other threads (alloc.c's push, heap.c's
 * collection). */
__attribute__((noreturn, cold)) void lull_fatal_remote_double_free(const void *p);
/* free() of a pointer inside a small block, not at its start: names it and
 * the block. */
__attribute__((noreturn, cold)) void lull_fatal_misaligned(const void *p, const lull_span *span);

#endif
