/* lull_purge_all() with thp=auto leaves no warm slice. The warm reserve's
 * drain (reclaim/warm_reserve.c) does not purge a warm run in a huge
 * region that is kept (a span in use there: a purge would split it); it
 * turns it dirty, and lull_purge_all's slice step purges it next. A drain
 * batch (64 runs) made only of such runs purged nothing, returned 0, and
 * lull_warm_reserve_drain_all() stopped there: the warm runs past that
 * batch, or in another arena, stayed warm, against the promise that
 * lull_purge_all() leaves no warm bytes (docs/configuration.md).
 *
 * The scenario runs in a new process of this program (thp is a start-up
 * key; tests/support/reexec.h), without a reclaim thread (LULL_FAULT=
 * thread_create: its ticks would drain the reserve batch by batch, and
 * lull_purge_all then runs on the caller). It makes huge warm regions as
 * the reserve does (a clean region prefaulted into a huge page), then takes
 * every other slice of each into use: each region is kept, with 16 warm
 * runs of one slice, and the regions hold more runs than a drain batch. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "numa/slice_state.h"
#include "numa/thp.h"
#include "reclaim/reclaim.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REGIONS 6 /* 16 warm runs each: 96, a drain batch is 64 */

static size_t warm_slices(void) {
    size_t n = 0;
    for (int i = 0; i < lull_arena_count; i++)
        n += lull_arena_count_slices(&lull_arenas[i], 1);
    return n;
}

static void scenario(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* the library is initialised */
    lull_free(p);
    lull_reclaim_stats r;
    lull_reclaim_get_stats(&r);
    dprintf(1, "running=%d\nthp_on=%d\n", (int)r.running, (int)lull_thp_on());
    if (!lull_thp_on()) return;
    lull_arena *a = &lull_arenas[0];
    if (!lull_arena_add_spare_segment(a)) return;
    lull_slice_run runs[REGIONS];
    size_t n = lull_arena_take_clean_regions(a, REGIONS, runs, REGIONS);
    size_t made = 0;
    for (size_t i = 0; i < n; i++) {
        if (lull_thp_prefault_region(runs[i].segment, runs[i].first / LULL_THP_REGION_SLICES)) {
            lull_arena_make_warm_prefaulted(&runs[i]);
            made++;
        } else {
            lull_arena_return_clean(&runs[i]);
        }
    }
    dprintf(1, "made=%zu\n", made);
    if (made < REGIONS) return; /* no huge page to be had: the parent skips */
    /* every other slice in use: a huge page with live slices, kept */
    pthread_mutex_lock(&a->lock);
    bool taken = true;
    for (size_t i = 0; i < n; i++)
        for (unsigned k = 0; k < LULL_THP_REGION_SLICES; k += 2) {
            bool zeroed;
            uint64_t lazy[LULL_SLICE_WORDS];
            taken &= lull_slices_take(runs[i].segment, runs[i].first + k, 1, &zeroed, lazy) ==
                     LULL_TAKE_OK;
        }
    pthread_mutex_unlock(&a->lock);
    size_t kept = 0;
    for (size_t i = 0; i < n; i++)
        kept += lull_thp_region_kept(runs[i].segment, runs[i].first);
    size_t before = warm_slices();
    lull_purge_all();
    size_t after = warm_slices();
    dprintf(1, "taken=%d\nkept=%zu\nwarm_before=%zu\nwarm_after=%zu\n", (int)taken, kept, before,
            after);
}

__attribute__((constructor(200))) static void drain_kept_probe(void) {
    if (!getenv("LULL_TEST_DRAIN_KEPT")) return;
    scenario();
    _exit(0);
}

Test(drain_kept, purge_all_leaves_no_warm_slice_in_kept_huge_regions, .timeout = 120) {
    child_run cr;
    const char *vars[] = {"LULL_TEST_DRAIN_KEPT=1", "LULL_CONF=thp=auto",
                          "LULL_FAULT=thread_create", NULL};
    reexec_run("test_drain_kept_probe", vars, "drain_kept", 60000, &cr);
    reexec_assert_exited_0(&cr, "drain_kept");
    cr_assert_eq(reexec_field(&cr, "running"), 0, "a reclaim thread runs:\n%s", cr.out);
    if (!reexec_field(&cr, "thp_on")) cr_skip_test("thp unavailable here");
    if (reexec_field(&cr, "made") < REGIONS) cr_skip_test("no huge page to be had:\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "taken"), 1, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "kept"), REGIONS, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "warm_before"), REGIONS * LULL_THP_REGION_SLICES / 2, "%s",
                 cr.out);
    cr_assert_eq(reexec_field(&cr, "warm_after"), 0,
                 "warm slices left after lull_purge_all() (%d runs of one slice in kept huge "
                 "regions, a drain batch takes 64):\n%s",
                 REGIONS * LULL_THP_REGION_SLICES / 2, cr.out);
}
