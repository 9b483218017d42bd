/* The small public API around the malloc family: configuration, the purge
 * delay, per-thread controls. */
#include "lull.h"
#include "src/config.h"
#include "src/heap.h"
#include "src/init.h"

LULL_EXPORT bool lull_configure(const char *key, const char *value) {
    return lull_config_set(key, value);
}

LULL_EXPORT void lull_set_purge_delay_ms(long ms) {
    if (ms < LULL_PURGE_DELAY_AUTO) ms = LULL_PURGE_DELAY_NEVER;
    /* the reclaim thread compares 32-bit millisecond times */
    if (ms > LULL_PURGE_DELAY_MAX_MS) ms = LULL_PURGE_DELAY_MAX_MS;
    __atomic_store_n(&lull_config.purge_delay_ms, ms, __ATOMIC_RELAXED);
}

LULL_EXPORT long lull_purge_delay_ms(void) {
    return __atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED);
}

LULL_EXPORT void lull_thread_collect(void) {
    lull_heap *h = lull_tl_heap;
    if (h != &lull_heap_empty) lull_heap_collect(h, true);
}
