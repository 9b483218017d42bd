/* Purge everything now; see purge_now.h. */
#include "reclaim/purge_now.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim_steps.h"

#include <string.h>
#include <sys/mman.h>

bool lull_purge_now(struct purge_backend *b, lull_reclaim_stats *st) {
    /* the remote frees into heaps of exited threads first: the spans they
     * empty go back to their arenas now, and are purged below */
    void (*collect)(void) = __atomic_load_n(&lull_reclaim_collect_hook, __ATOMIC_ACQUIRE);
    if (collect) collect();
    uint32_t now = lull_now_ms();
    bool work = lull_step_huge(b, st, now, 0, MADV_DONTNEED, true);
    /* the reserve first: its slices are clean when the arenas' turn comes */
    work |= lull_step_warm(b, now, true);
    for (int i = 0; i < lull_arena_count; i++) {
        lull_arena *a = &lull_arenas[i];
        work |= lull_step_slices(b, st, a, 0, true, MADV_DONTNEED);
        work |= lull_step_lazy(b, st, a, 0, true);
        work |= lull_step_pages(b, st, a, 0, true);
    }
    return work;
}

void lull_purge_now_on_caller(lull_reclaim_stats *st) {
    /* never opened: it purges with plain madvise, and holds no ring or
     * descriptor to close (reclaim/purge_backend.h) */
    purge_backend b;
    memset(&b, 0, sizeof b);
    lull_purge_now(&b, st);
    /* the counter page's purge_errors: this backend is gone after the call */
    __atomic_fetch_add(&st->caller_purge_errors, b.errors, __ATOMIC_RELAXED);
    /* and its purges, for the same reason (tests/test_caller_purge_counted.c) */
    const purge_kind_counters *m = &b.per_kind[LULL_BACKEND_MADVISE];
    __atomic_fetch_add(&st->caller_purge_ranges, m->ranges, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->caller_purge_bytes, m->bytes, __ATOMIC_RELAXED);
    __atomic_fetch_add(&st->caller_purge_calls, m->calls, __ATOMIC_RELAXED);
}
