/* The heap profile's stacks: the calling thread's return addresses, the
 * same as libgcc's _Unwind_Backtrace gives, at a few instructions a frame
 * once the return addresses have been seen (src/profile_stack.c says how). */
#ifndef LULL_PROFILE_STACK_H
#define LULL_PROFILE_STACK_H

#include "src/pprof_write.h"

#include <stdbool.h>
#include <stdint.h>

/* What a walk keeps, and what it found. A frame is its return address
 * (where its function resumes) and its stack pointer at that call (the
 * callee's CFA: what _Unwind_GetCFA gives for it in a backtrace). */
typedef struct lull_stack {
    /* frames whose stack pointer is below `below`, and those whose return
     * address is in [skip_from, skip_to), are not kept */
    uintptr_t below, skip_from, skip_to;
    uint32_t depth; /* frames kept, at most LULL_PROFILE_MAX_DEPTH */
    uintptr_t ra[LULL_PROFILE_MAX_DEPTH];
    uintptr_t sp[LULL_PROFILE_MAX_DEPTH];
} lull_stack;

/* The frames of the caller of lull_stack_take and above, innermost first,
 * filtered as `s` asks. True if the cached rules walked the whole stack,
 * false if it was walked again by _Unwind_Backtrace (a signal frame, a
 * frame whose rule is not cached, another stack than the thread's); the
 * frames are the same either way. */
bool lull_stack_take(lull_stack *s);

/* The same with _Unwind_Backtrace alone: what lull_stack_take must equal
 * (tests/test_profile_stack.c). Returns false, as lull_stack_take does
 * when it walks so. */
bool lull_stack_take_slow(lull_stack *s);
/* fork: the stack-walk cache's lock is taken before the copy (after the
 * profile's own lock, src/profile.c) and let go or reset after it: a walk
 * another thread was making held it, and the child's first sample waited
 * for ever (tests/test_profile_fork.c) */
void lull_stack_fork_prepare(void);
void lull_stack_fork_parent(void);
void lull_stack_fork_child(void);

#endif
