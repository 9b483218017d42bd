/* The aborts of invalid frees that more than one path reports (the free
 * paths of alloc.c, the owner's collection in heap.c, the sized frees of
 * entry.c and of the C++ operators): one message each, naming the
 * address. */
#ifndef LULL_FREE_ERRORS_H
#define LULL_FREE_ERRORS_H

#include "base/types.h"

/* A block freed twice from other threads (alloc.c's push, heap.c's
 * collection). */
__attribute__((noreturn, cold)) void lull_fatal_remote_double_free(const void *p);
/* malloc reached a free block that also waits as its heap's deferred free,
 * or free() was given the block that waits there (src/alloc.h): it was
 * freed twice. */
__attribute__((noreturn, cold)) void lull_fatal_deferred_double_free(const void *p);
/* free() of a pointer inside a small block, not at its start: names it and
 * the block. */
__attribute__((noreturn, cold)) void lull_fatal_misaligned(const void *p, const lull_span *span);
/* The same from another call, `who` naming it ("realloc()"). */
__attribute__((noreturn, cold)) void lull_fatal_misaligned_by(const char *who, const void *p,
                                                              const lull_span *span);
/* The same for the pointer that free() has just put in h's deferred slot
 * (src/alloc.h), and its span. */
__attribute__((noreturn, cold)) void lull_fatal_misaligned_deferred(const lull_heap *h);
/* A sized free (free_sized(), a sized operator delete) whose size a
 * request of that size and alignment (1 for none) would not have been given
 * this block for: aborts, `who` naming the call. A wrong size is a caller
 * bug that would otherwise corrupt accounting silently. */
void lull_check_sized_free(const char *who, void *p, size_t alignment, size_t size);

#endif
