/* The reclaim steps; see reclaim_steps.h. */
#include "reclaim/reclaim_steps.h"
#include "numa/page_park.h"
#include "reclaim/huge_reclaim.h"
#include "reclaim/purge_backend.h"
#include "reclaim/refault.h"
#include "reclaim/warm_reserve.h"
#include "base/race.h"
#include "base/fork_exec.h"

#include <pthread.h>
#include <sys/mman.h>

/* Held across each step that moves slices or huge mappings through a
 * state no map, slot or queue records, and by fork's prepare handler. */
static LULL_FORK_EXEC_DATA pthread_mutex_t step_lock = PTHREAD_MUTEX_INITIALIZER;

void lull_steps_lock(void) {
    pthread_mutex_lock(&step_lock);
}

void lull_steps_unlock(void) {
    pthread_mutex_unlock(&step_lock);
}

LULL_FORK_EXEC_TEXT void lull_steps_after_fork_child(void) {
    lull_mutex_reset_in_child(&step_lock);
}

#define STAT_ADD(st, field, v) __atomic_fetch_add(&(st)->field, (v), __ATOMIC_RELAXED)

void purge_ranges_of_runs(const lull_slice_run *runs, size_t n, purge_range *ranges) {
    for (size_t i = 0; i < n; i++) {
        ranges[i].addr = lull_slice_address(runs[i].segment, runs[i].first);
        ranges[i].len = (size_t)runs[i].count << LULL_SLICE_SHIFT;
    }
}

/* Purge claimed runs in one backend batch and finish each: FREE_CLEAN (the
 * refault monitor re-arms it first: MADV_DONTNEED dropped its markers) or,
 * if the kernel refused, FREE_DIRTY again. Returns the bytes purged. */
static size_t purge_runs(struct purge_backend *b, lull_reclaim_stats *st,
                         const lull_slice_run *runs, size_t n, int advice) {
    purge_range ranges[LULL_STEP_RUNS] = {{0}}; /* (gcc cannot see that n <= LULL_STEP_RUNS) */
    int results[LULL_STEP_RUNS];
    purge_ranges_of_runs(runs, n, ranges);
    LULL_RACE_POINT(LULL_RACE_RECLAIM_PURGE);
    purge_backend_run(b, ranges, n, advice, results);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (results[i] == 0) {
            lull_refault_after_purge(ranges[i].addr, ranges[i].len);
            lull_arena_purge_done(&runs[i], advice == MADV_FREE);
            bytes += ranges[i].len;
        } else {
            lull_arena_purge_failed(&runs[i]);
            STAT_ADD(st, purge_failures, 1);
        }
    }
    return bytes;
}

/* One batch of a walk's claims: dirty slices, or (lazy) MADV_FREE'd ones. */
static size_t claim_free(lull_arena *a, bool lazy, uint32_t before, bool any_age,
                         lull_claim_cursor *at, lull_slice_run *runs) {
    if (lazy)
        return any_age
                   ? lull_arena_claim_all_lazy(a, at, runs, LULL_STEP_RUNS, LULL_STEP_BYTES)
                   : lull_arena_claim_lazy(a, before, at, runs, LULL_STEP_RUNS, LULL_STEP_BYTES);
    return any_age ? lull_arena_claim_all_dirty(a, at, runs, LULL_STEP_RUNS, LULL_STEP_BYTES)
                   : lull_arena_claim_dirty(a, before, at, runs, LULL_STEP_RUNS, LULL_STEP_BYTES);
}

/* One walk over the arena's dirty (or lazy) slices, batch after batch, or
 * its first batch only (one_batch). One walk: a run the kernel refused (a
 * locked page; mlockall: every one) is dirty again, and a claim from the
 * newest segment took it again, batch after batch (a lazy one is lazy no
 * more, but the lazy step ended at a batch that purged nothing); a batch of
 * refused runs only ended the step, and every slice behind them stayed
 * unpurged after lull_purge_all() (tests/test_step_refused_batch.c,
 * tests/test_step_refused_lazy.c). */
static bool walk_free(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a, bool lazy,
                      uint32_t before, bool any_age, int advice, bool one_batch) {
    lull_slice_run runs[LULL_STEP_RUNS];
    bool work = false;
    lull_claim_cursor at = {0};
    for (;;) {
        lull_steps_lock();
        size_t n = claim_free(a, lazy, before, any_age, &at, runs);
        size_t claimed = 0;
        for (size_t i = 0; i < n; i++)
            claimed += (size_t)runs[i].count << LULL_SLICE_SHIFT;
        size_t bytes = n ? purge_runs(b, st, runs, n, advice) : 0;
        lull_steps_unlock();
        if (n == 0) break;
        work = true;
        /* a lazy slice's bytes were counted when it was MADV_FREE'd */
        if (!lazy) {
            STAT_ADD(st, purge_runs, n);
            STAT_ADD(st, purged_bytes, bytes);
        }
        /* short by what was claimed, not by what was purged: a batch cut
         * at the byte bound with one run refused (a locked page) is not
         * the last, and ending there left every dirty slice past it
         * (tests/test_step_refused_run.c). A short batch reached the end
         * of the walk. (A batch of refused runs only, mlockall's, needs no
         * end of its own: the walk goes on past them, and ends.) */
        if (one_batch || (n < LULL_STEP_RUNS && claimed < LULL_STEP_BYTES)) break;
    }
    return work;
}

bool lull_step_slices(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                      uint32_t freed_before, bool any_age, int advice) {
    return walk_free(b, st, a, false, freed_before, any_age, advice, false);
}

/* MADV_FREE'd slices still count in RSS until the kernel needs the pages:
 * the ones that stayed free long enough are purged for good, one batch a
 * tick (lull_purge_all's: every one). A refused run is dirty again, freed
 * from the refusal on: the dirty step's, a purge delay later. */
bool lull_step_lazy(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                    uint32_t purged_before, bool any_age) {
    return walk_free(b, st, a, true, purged_before, any_age, MADV_DONTNEED, !any_age);
}

/* Pages parked inside spans still in use (numa/page_park.h), one batch of
 * runs a step, adjacent runs merged into one range. Always MADV_DONTNEED:
 * their span is in use, so nothing would purge a MADV_FREE'd page again,
 * and it would count in RSS until the kernel runs short. */
bool lull_step_pages(struct purge_backend *b, lull_reclaim_stats *st, lull_arena *a,
                     uint32_t parked_before, bool any_age) {
    lull_page_run runs[LULL_STEP_RUNS];
    purge_range ranges[LULL_STEP_RUNS];
    int results[LULL_STEP_RUNS];
    uint16_t range_of[LULL_STEP_RUNS];
    bool work = false;
    for (lull_segment *s = atomic_load_explicit(&a->segments, memory_order_acquire); s;
         s = s->next) {
        /* one walk over the segment, as lull_step_slices's over the arena:
         * a page the kernel refused (a locked page) is PENDING again, and a
         * claim from the segment's first slice took it again, batch after
         * batch; a batch of refused pages only ended the segment's walk, and
         * every page parked behind them stayed (tests/test_step_refused_pages.c) */
        unsigned at = 0;
        do {
            lull_steps_lock();
            size_t n = any_age ? lull_pages_claim_all(s, &at, runs, LULL_STEP_RUNS)
                               : lull_pages_claim(s, parked_before, &at, runs, LULL_STEP_RUNS);
            size_t k = 0, bytes = 0;
            for (size_t i = 0; i < n; i++) {
                size_t len;
                char *addr = lull_page_run_address(&runs[i], &len);
                if (k && (char *)ranges[k - 1].addr + ranges[k - 1].len == addr)
                    ranges[k - 1].len += len;
                else
                    ranges[k++] = (purge_range){.addr = addr, .len = len};
                range_of[i] = (uint16_t)(k - 1);
            }
            if (n) purge_backend_run(b, ranges, k, MADV_DONTNEED, results);
            uint32_t refused_at = 0;
            for (size_t i = 0; i < n; i++) {
                if (results[range_of[i]] != 0) {
                    /* due again a purge delay from now */
                    if (!refused_at) refused_at = lull_now_ms();
                    lull_pages_refused(&runs[i], refused_at);
                    continue;
                }
                lull_pages_finish(&runs[i], true);
                bytes += (size_t)__builtin_popcount(runs[i].mask) * LULL_PAGE_SIZE;
            }
            lull_steps_unlock();
            if (n == 0) break;
            work = true;
            for (size_t i = 0; i < k; i++)
                if (results[i]) STAT_ADD(st, purge_failures, 1);
            STAT_ADD(st, purge_runs, k);
            STAT_ADD(st, purged_bytes, bytes);
            STAT_ADD(st, page_purged_bytes, bytes);
            /* the walk ends at the segment's end (a batch of refused pages
             * only, mlockall's, needs no end of its own) */
        } while (at < LULL_SLICES);
    }
    return work;
}

bool lull_step_huge(struct purge_backend *b, lull_reclaim_stats *st, uint32_t now, long delay,
                    int advice, bool all) {
    lull_huge_reclaim_counts c = {0};
    /* one step: a mapping evicted from its slot or taken off the queue is
     * in neither until it is unmapped or cached again */
    lull_steps_lock();
    bool work =
        all ? lull_huge_reclaim_all(b, now, &c) : lull_huge_reclaim_tick(b, now, delay, advice, &c);
    lull_steps_unlock();
    STAT_ADD(st, huge_freed, c.unmapped);
    STAT_ADD(st, huge_freed_bytes, c.unmapped_bytes);
    STAT_ADD(st, purged_bytes, c.purged_bytes);
    STAT_ADD(st, huge_purged_bytes, c.purged_bytes);
    STAT_ADD(st, purge_failures, c.purge_failures);
    return work;
}

/* The warm reserve takes clean (or warm) slices into PURGING, prefaults
 * (or purges) them and finishes them: one step. */
bool lull_step_warm(struct purge_backend *b, uint32_t now, bool all) {
    lull_steps_lock();
    bool work = all ? lull_warm_reserve_drain_all(b) > 0 : lull_warm_reserve_tick(b, now);
    lull_steps_unlock();
    return work;
}
