/* The warm reserve; see warm_reserve.h. */
#include "reclaim/warm_reserve.h"
#include "numa/arena.h"
#include "numa/slice_state.h"
#include "numa/thp.h"
#include "reclaim/policy.h"
#include "reclaim/purge_backend.h"
#include "reclaim/refault.h"
#include "base/bitmap.h"
#include "base/config.h"
#include "base/linux_compat.h"
#include "base/resident.h"

#define STEP_RUNS 64

static struct {
    uint64_t last_demand;     /* lull_refault_pages_back() at the last tick */
    uint32_t last_refault_ms; /* when the demand last grew */
    uint64_t recent_refault_pages;
    lull_warm_stats stats;
} W;

static size_t warm_slices(void) {
    size_t n = 0;
    for (int i = 0; i < lull_arena_count; i++)
        n += lull_arena_count_slices(&lull_arenas[i], 1);
    return n;
}

/* Purge up to max_slices warm slices, one batch; the bytes purged, and in
 * *gone (if not NULL) the runs that are warm no more. With thp on, a run in
 * a huge region that is kept (a span in use there) is not purged, which
 * would split the region: it becomes free dirty slices, left to the purge
 * policy and its bound on what huge regions keep. */
static uint64_t drain(struct purge_backend *b, size_t max_slices, size_t *gone) {
    lull_slice_run runs[STEP_RUNS], purged[STEP_RUNS];
    purge_range ranges[STEP_RUNS];
    int results[STEP_RUNS];
    uint64_t free_bits[STEP_RUNS];
    size_t n = 0, k = 0;
    if (gone) *gone = 0;
    for (int i = 0; i < lull_arena_count && n == 0; i++)
        n = lull_arena_take_warm(&lull_arenas[i], max_slices, runs, STEP_RUNS);
    if (n == 0) return 0;
    if (gone) *gone = n; /* less the runs whose purge is refused, below */
    bool thp = lull_thp_on();
    for (size_t i = 0; i < n; i++) {
        if (thp && lull_thp_region_kept(runs[i].segment, runs[i].first)) {
            lull_arena_warm_to_dirty(&runs[i]);
            continue;
        }
        if (thp) free_bits[k] = lull_slices_free_word(runs[i].segment, runs[i].first / 64);
        purged[k++] = runs[i];
    }
    if (k == 0) return 0;
    purge_ranges_of_runs(purged, k, ranges);
    purge_backend_run(b, ranges, k, MADV_DONTNEED, results);
    uint64_t bytes = 0;
    for (size_t i = 0; i < k; i++) {
        if (results[i] == 0) {
            /* MADV_DONTNEED dropped the write-protect markers */
            lull_refault_after_purge(ranges[i].addr, ranges[i].len);
            if (thp) {
                lull_thp_note_purge(purged[i].segment, purged[i].first / 64,
                                    lull_bits_mask(purged[i].first % 64, purged[i].count),
                                    free_bits[i]);
            }
            lull_arena_purge_done(&purged[i], false);
            bytes += ranges[i].len;
        } else {
            lull_arena_make_warm(&purged[i]);
            if (gone) --*gone;
        }
    }
    __atomic_store_n(&W.stats.drained_bytes, W.stats.drained_bytes + bytes, __ATOMIC_RELAXED);
    return bytes;
}

/* thp on: the reserve is whole 2 MiB regions made huge pages of zeroes
 * (numa/thp.h), ahead of the heap's growth, so that new spans land on
 * memory a huge page backs already: the request thread neither faults
 * (512 faults of 4 KiB a region, ~0.9 ms here) nor waits for a collapse
 * of what it has just written. Demand: clean slices taken (first use
 * included: what grows the heap is what needs huge pages) and reserve
 * slices used, since the last tick. The target is twice the recent
 * demand, in regions, within warm_reserve_mb, for HUGE_HOLD_MS after the
 * last growth; then the reserve goes back (RSS 1.2 s after a bulk free).
 * The regions are prefaulted HUGE_REGIONS_A_TICK a tick (~150 us each on
 * this thread, docs/bench/thp.md). */
#define HUGE_HOLD_MS 250
#define HUGE_REGIONS_A_TICK 32
#define REGION_SLICES LULL_THP_REGION_SLICES

static struct {
    uint64_t last_fresh; /* lull_slices_fresh_taken() at the last tick */
    size_t last_warm;    /* warm slices after the last tick */
    size_t demand;       /* slices a tick, recently */
    uint32_t last_growth_ms;
} H;

/* Up to `regions` regions made huge and warm; the number made. */
static size_t prefault_regions(size_t regions) {
    lull_slice_run runs[HUGE_REGIONS_A_TICK];
    if (regions > HUGE_REGIONS_A_TICK) regions = HUGE_REGIONS_A_TICK;
    uint64_t region_bytes = (uint64_t)REGION_SLICES << LULL_SLICE_SHIFT;
    uint64_t room = lull_resident_room();
    if (room / region_bytes < regions) regions = (size_t)(room / region_bytes);
    /* the room is held for this step, as in lull_warm_reserve_tick */
    uint64_t held = regions * region_bytes;
    if (!regions || !lull_resident_try_grow(held)) return 0;
    size_t n = 0;
    for (int i = 0; i < lull_arena_count && n == 0; i++) {
        n = lull_arena_take_clean_regions(&lull_arenas[i], regions, runs, regions);
        /* the segments in use have no more whole regions: a new one has 15 */
        if (n < regions && lull_arena_add_spare_segment(&lull_arenas[i])) {
            __atomic_store_n(&W.stats.spare_segments, W.stats.spare_segments + 1, __ATOMIC_RELAXED);
            n += lull_arena_take_clean_regions(&lull_arenas[i], regions - n, runs + n, regions - n);
        }
    }
    size_t made = 0;
    for (size_t i = 0; i < n; i++) {
        if (lull_thp_prefault_region(runs[i].segment, runs[i].first / REGION_SLICES)) {
            lull_arena_make_warm_prefaulted(&runs[i]);
            made++;
        } else {
            lull_arena_return_clean(&runs[i]); /* its first page stays, zero */
        }
    }
    lull_resident_sub(held);
    __atomic_store_n(&W.stats.prefaulted_bytes, W.stats.prefaulted_bytes + made * region_bytes,
                     __ATOMIC_RELAXED);
    return made;
}

static bool growing(uint32_t now) {
    return H.last_growth_ms && (int32_t)(now - H.last_growth_ms) < HUGE_HOLD_MS;
}

bool lull_warm_reserve_growing(uint32_t now) {
    return lull_thp_on() && growing(now);
}

static bool huge_tick(struct purge_backend *b, uint32_t now) {
    uint64_t fresh = lull_slices_fresh_taken();
    size_t have = warm_slices();
    size_t taken = (size_t)(fresh - H.last_fresh) + (H.last_warm > have ? H.last_warm - have : 0);
    H.last_fresh = fresh;
    if (taken) {
        /* up at once, down by halves */
        H.demand = taken > H.demand ? taken : H.demand - (H.demand - taken) / 2;
        H.last_growth_ms = now;
    }
    size_t bound =
        __atomic_load_n(&lull_config.warm_reserve_bytes, __ATOMIC_RELAXED) >> LULL_SLICE_SHIFT;
    bool active = growing(now);
    size_t target = active ? (2 * H.demand + REGION_SLICES - 1) / REGION_SLICES * REGION_SLICES : 0;
    if (target > bound) target = bound / REGION_SLICES * REGION_SLICES;
    __atomic_store_n(&W.stats.target_bytes, (uint64_t)target << LULL_SLICE_SHIFT, __ATOMIC_RELAXED);
    bool work = false, acted = true;
    if (have + REGION_SLICES <= target)
        work = prefault_regions((target - have) / REGION_SLICES) > 0;
    else if (have > target && (!active || have > bound))
        /* while the heap grows, what was made is used soon */
        work = drain(b, have - target, NULL) > 0;
    else
        acted = false;
    /* so that the next tick sees what request threads used of it (a drain
     * may also have turned slices dirty, without a purge) */
    H.last_warm = acted ? warm_slices() : have;
    return work;
}

bool lull_warm_reserve_tick(struct purge_backend *b, uint32_t now) {
    if (lull_thp_on()) return huge_tick(b, now);
    /* Demand: purged slices coming back (refaults), which fault on the
     * request thread unless prefaulted. Slices touched for the first time
     * are not counted: a working set that grew once (a start-up, the 512
     * MiB of bench/demo.sh) made the reserve prefault 64 MiB ahead of it
     * and keep it LULL_WARM_IDLE_MS, and each fork copied its page tables;
     * without them bench/burst.c still takes 3-70 faults a burst against
     * 25,000-36,000 with purge_delay_ms=0 (tests/test_warm_first_use.c).
     * Counted in pages where the refault monitor sees them: a purged slice
     * taken again for a span that writes one page of it was a slice of
     * demand, and the reserve prefaulted all 16 pages for each (a program
     * of short threads, bench/footprint.c short_threads: peak RSS 2.8-4.2
     * MiB against 2.8-2.9 with warm_reserve_mb=0). */
    uint64_t demand = lull_refault_pages_back();
    if (demand != W.last_demand) {
        /* a working set is coming back: remember how much of it */
        uint64_t d = demand - W.last_demand;
        W.recent_refault_pages = W.recent_refault_pages / 2 + d;
        W.last_refault_ms = now;
        W.last_demand = demand;
    }
    size_t bound =
        __atomic_load_n(&lull_config.warm_reserve_bytes, __ATOMIC_RELAXED) >> LULL_SLICE_SHIFT;
    bool active = W.last_refault_ms && (int32_t)(now - W.last_refault_ms) < LULL_WARM_IDLE_MS;
    /* in slices, rounded up */
    uint64_t pages = active ? W.recent_refault_pages : 0;
    size_t target = (size_t)((pages + LULL_PAGES_PER_SLICE - 1) / LULL_PAGES_PER_SLICE);
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
        return drain(b, have - target, NULL) > 0;
    return false;
}

uint64_t lull_warm_reserve_drain_all(struct purge_backend *b) {
    /* batch after batch while runs leave the reserve: not while bytes are
     * purged, for a batch whose runs all lie in kept huge regions purges
     * none (they turn dirty, for lull_purge_all's slice step), and ending
     * there left every warm run past it warm (tests/test_drain_kept.c).
     * A batch whose purges were all refused is warm again: the end. */
    uint64_t bytes = 0;
    size_t gone;
    do
        bytes += drain(b, SIZE_MAX, &gone);
    while (gone > 0);
    /* the demand seen so far is answered: no prefault until purged slices
     * come back into use again */
    W.recent_refault_pages = 0;
    W.last_refault_ms = 0;
    H.demand = 0;
    H.last_growth_ms = 0;
    H.last_warm = 0;
    __atomic_store_n(&W.stats.target_bytes, 0, __ATOMIC_RELAXED);
    return bytes;
}

void lull_warm_reserve_stats(lull_warm_stats *out) {
    out->prefaulted_bytes = __atomic_load_n(&W.stats.prefaulted_bytes, __ATOMIC_RELAXED);
    out->drained_bytes = __atomic_load_n(&W.stats.drained_bytes, __ATOMIC_RELAXED);
    out->spare_segments = __atomic_load_n(&W.stats.spare_segments, __ATOMIC_RELAXED);
    out->target_bytes = __atomic_load_n(&W.stats.target_bytes, __ATOMIC_RELAXED);
}
