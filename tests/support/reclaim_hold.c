/* Holding the reclaim thread inside its tick: see reclaim_hold.h. */
#define _GNU_SOURCE
#include "reclaim_hold.h"
#include "timing.h"

#include <stdatomic.h>
#include <stdint.h>

#define HOLD_TIMEOUT_MS 20000

/* reclaim/reclaim_thread.c; read atomically by the reclaim thread */
extern void (*lull_reclaim_tick_hook)(void);

/* atomic: the reclaim thread reads it while a test thread may set it */
static void (*_Atomic chained_hook)(void);
static atomic_int hook_installed, hold_request, held;

static void holding_hook(void) {
    void (*chained)(void) = atomic_load(&chained_hook);
    if (chained) chained();
    if (!atomic_load(&hold_request)) return;
    atomic_store(&held, 1);
    while (atomic_load(&hold_request))
        sleep_ms(1);
    atomic_store(&held, 0);
}

bool reclaim_hold(void) {
    if (!atomic_exchange(&hook_installed, 1)) {
        atomic_store(&chained_hook, __atomic_load_n(&lull_reclaim_tick_hook, __ATOMIC_ACQUIRE));
        __atomic_store_n(&lull_reclaim_tick_hook, holding_hook, __ATOMIC_RELEASE);
    }
    atomic_store(&hold_request, 1);
    uint64_t until = now_ms() + HOLD_TIMEOUT_MS;
    while (!atomic_load(&held) && now_ms() < until)
        sleep_ms(1);
    return atomic_load(&held);
}

bool reclaim_release(void) {
    atomic_store(&hold_request, 0);
    uint64_t until = now_ms() + HOLD_TIMEOUT_MS;
    while (atomic_load(&held) && now_ms() < until)
        sleep_ms(1);
    return !atomic_load(&held);
}

bool reclaim_held(void) {
    return atomic_load(&held) != 0;
}
