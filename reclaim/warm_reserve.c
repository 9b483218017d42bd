/* The warm reserve; see warm_reserve.h. */
#include "reclaim/warm_reserve.h"
#include "numa/arena.h"
#include "reclaim/policy.h"
#include "reclaim/purge_backend.h"
#include "reclaim/refault.h"
#include "base/config.h"
#include "base/linux_compat.h"
#include "base/resident.h"

#define STEP_RUNS 64

static struct {
    uint64_t last_demand;     /* refaulted + first-use slices at the last tick */
    uint32_t last_refault_ms; /* when the demand last grew */
    uint64_t recent_refault_slices;
    lull_warm_stats stats;
} W;

static size_t warm_slices(void) {
    size_t n = 0;
    for (int i = 0; i < lull_arena_count; i++)
        n += lull_arena_count_slices(&lull_arenas[i], 1);
    return n;
}

/* Purge up to max_slices warm slices, one batch; the bytes purged. */
static uint64_t drain(struct purge_backend *b, size_t max_slices) {
    lull_slice_run runs[STEP_RUNS];
    purge_range ranges[STEP_RUNS];
    int results[STEP_RUNS];
    size_t n = 0;
    for (int i = 0; i < lull_arena_count && n == 0; i++)
        n = lull_arena_take_warm(&lull_arenas[i], max_slices, runs, STEP_RUNS);
    if (n == 0) return 0;
    purge_ranges_of_runs(runs, n, ranges);
    purge_backend_run(b, ranges, n, MADV_DONTNEED, results);
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (results[i] == 0) {
            /* MADV_DONTNEED dropped the write-protect markers */
            lull_refault_after_purge(ranges[i].addr, ranges[i].len);
            lull_arena_purge_done(&runs[i], false);
            bytes += ranges[i].len;
        } else {
            lull_arena_make_warm(&runs[i]);
        }
    }
    __atomic_store_n(&W.stats.drained_bytes, W.stats.drained_bytes + bytes, __ATOMIC_RELAXED);
    return bytes;
}

bool lull_warm_reserve_tick(struct purge_backend *b, uint32_t now) {
    /* Demand: purged slices coming back (refaults), which fault on the
     * request thread unless prefaulted. Slices touched for the first time
     * are not counted: a working set that grew once (a start-up, the 512
     * MiB of bench/demo.sh) made the reserve prefault 64 MiB ahead of it
     * and keep it LULL_WARM_IDLE_MS, and each fork copied its page tables;
     * without them bench/burst.c still takes 3-70 faults a burst against
     * 25,000-36,000 with purge_delay_ms=0 (tests/test_warm_first_use.c). */
    uint64_t demand = atomic_load_explicit(&lull_the_policy.refaulted_slices, memory_order_relaxed);
    if (demand != W.last_demand) {
        /* a working set is coming back: remember how much of it */
        uint64_t d = demand - W.last_demand;
        W.recent_refault_slices = W.recent_refault_slices / 2 + d;
        W.last_refault_ms = now;
        W.last_demand = demand;
    }
    size_t bound =
        __atomic_load_n(&lull_config.warm_reserve_bytes, __ATOMIC_RELAXED) >> LULL_SLICE_SHIFT;
    bool active = W.last_refault_ms && (int32_t)(now - W.last_refault_ms) < LULL_WARM_IDLE_MS;
    size_t target = active ? (size_t)W.recent_refault_slices : 0;
    if (target > bound) target = bound;
    __atomic_store_n(&W.stats.target_bytes, (uint64_t)target << LULL_SLICE_SHIFT, __ATOMIC_RELAXED);
    size_t have = warm_slices();
    lull_slice_run runs[STEP_RUNS];
    purge_range ranges[STEP_RUNS];
    int results[STEP_RUNS];
    if (have < target) {
        size_t want = target - have, n = 0;
        /* prefaulted slices are resident: within the heap limit. The room
         * is held for this step (the finish of each run counts it again,
         * then the hold goes), so no request thread takes it meanwhile */
        uint64_t room = lull_resident_room();
        if (room >> LULL_SLICE_SHIFT < want) want = (size_t)(room >> LULL_SLICE_SHIFT);
        uint64_t held = (uint64_t)want << LULL_SLICE_SHIFT;
        if (!want || !lull_resident_try_grow(held)) return false;
        for (int i = 0; i < lull_arena_count && n == 0; i++) {
            n = lull_arena_take_clean(&lull_arenas[i], want, runs, STEP_RUNS);
            if (n == 0 && lull_arena_add_spare_segment(&lull_arenas[i])) {
                __atomic_store_n(&W.stats.spare_segments, W.stats.spare_segments + 1,
                                 __ATOMIC_RELAXED);
                n = lull_arena_take_clean(&lull_arenas[i], want, runs, STEP_RUNS);
            }
        }
        if (n == 0) {
            lull_resident_sub(held);
            return false;
        }
        purge_ranges_of_runs(runs, n, ranges);
        purge_backend_run(b, ranges, n, MADV_POPULATE_WRITE, results);
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            if (results[i] == 0) {
                lull_arena_make_warm(&runs[i]);
                bytes += ranges[i].len;
            } else {
                lull_arena_return_clean(&runs[i]); /* e.g. a kernel before 5.14 */
            }
        }
        lull_resident_sub(held);
        __atomic_store_n(&W.stats.prefaulted_bytes, W.stats.prefaulted_bytes + bytes,
                         __ATOMIC_RELAXED);
        return true;
    }
    if (have > target) /* shrink: purge the surplus */
        return drain(b, have - target) > 0;
    return false;
}

uint64_t lull_warm_reserve_drain_all(struct purge_backend *b) {
    uint64_t bytes = 0, got;
    while ((got = drain(b, SIZE_MAX)) > 0)
        bytes += got;
    /* the demand seen so far is answered: no prefault until purged slices
     * come back into use again */
    W.recent_refault_slices = 0;
    W.last_refault_ms = 0;
    __atomic_store_n(&W.stats.target_bytes, 0, __ATOMIC_RELAXED);
    return bytes;
}

void lull_warm_reserve_stats(lull_warm_stats *out) {
    out->prefaulted_bytes = __atomic_load_n(&W.stats.prefaulted_bytes, __ATOMIC_RELAXED);
    out->drained_bytes = __atomic_load_n(&W.stats.drained_bytes, __ATOMIC_RELAXED);
    out->spare_segments = __atomic_load_n(&W.stats.spare_segments, __ATOMIC_RELAXED);
    out->target_bytes = __atomic_load_n(&W.stats.target_bytes, __ATOMIC_RELAXED);
}
