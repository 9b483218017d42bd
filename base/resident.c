/* The resident estimate and the heap limit; see resident.h. */
#include "base/resident.h"
#include "base/config.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <stdatomic.h>

static _Atomic uint64_t resident;
static _Atomic uint64_t refusals;
LULL_FORK_EXEC_DATA bool (*lull_resident_relief_hook)(long wait_ms); /* set by the constructor */

void lull_resident_add(uint64_t bytes) {
    atomic_fetch_add_explicit(&resident, bytes, memory_order_relaxed);
}

void lull_resident_sub(uint64_t bytes) {
    atomic_fetch_sub_explicit(&resident, bytes, memory_order_relaxed);
}

uint64_t lull_resident_limit(void) {
    return __atomic_load_n(&lull_config.heap_limit_bytes, __ATOMIC_RELAXED);
}

bool lull_resident_try_grow(uint64_t bytes) {
    uint64_t limit = lull_resident_limit();
    if (!limit) {
        lull_resident_add(bytes);
        return true;
    }
    uint64_t cur = atomic_load_explicit(&resident, memory_order_relaxed);
    do {
        if (bytes > limit || cur > limit - bytes) return false;
    } while (!atomic_compare_exchange_weak_explicit(&resident, &cur, cur + bytes,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

uint64_t lull_resident_room(void) {
    uint64_t limit = lull_resident_limit();
    if (!limit) return UINT64_MAX;
    uint64_t cur = lull_resident_bytes();
    return cur < limit ? limit - cur : 0;
}

uint64_t lull_resident_bytes(void) {
    return atomic_load_explicit(&resident, memory_order_relaxed);
}

static bool relieve_waiting(long wait_ms) {
    bool (*relieve)(long) = __atomic_load_n(&lull_resident_relief_hook, __ATOMIC_ACQUIRE);
    /* the wait for the purge is a futex wait, which ends with ETIMEDOUT or
     * EAGAIN: an allocation that found room after it returned its memory
     * with that errno (tests/test_errno_limit_relief.c) */
    int saved = errno;
    bool relieved = relieve && relieve(wait_ms);
    errno = saved;
    return relieved;
}

bool lull_resident_relieve(void) {
    return relieve_waiting(LULL_LIMIT_WAIT_MS);
}

bool lull_resident_relieve_until_done(void) {
    return relieve_waiting(-1);
}

void lull_resident_refuse(void) {
    atomic_fetch_add_explicit(&refusals, 1, memory_order_relaxed);
    errno = ENOMEM;
}

uint64_t lull_resident_refusals(void) {
    return atomic_load_explicit(&refusals, memory_order_relaxed);
}
