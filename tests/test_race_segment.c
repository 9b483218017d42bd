/* A new segment is published (numa/arena.c, segment_create) before the
 * request thread that made it claims its first span; the reclaim thread's
 * warm reserve claims clean slices without the arena lock, and may take
 * part of that run meanwhile. The request thread must look again, not
 * fail: returning NULL there made a malloc(962) fail in CI (tsan_reclaim,
 * no heap limit set).
 *
 * With the race harness holding that window open (point segment_new, a
 * -DLULL_RACE=ON build), a thread claims every clean slice it can find and
 * gives it back, over and over, as the reserve does, while the main thread
 * allocates 8 MiB blocks (a new segment every third or fourth), until the
 * window was held MIN_HITS times: every allocation must succeed. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "numa/arena.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define BLOCK ((size_t)8 << 20)
#define MIN_HITS 12
#define MAX_BLOCKS 400

static atomic_bool stop;
static atomic_ulong claimed;

static void *claim_clean(void *arg) {
    (void)arg;
    lull_slice_run runs[16];
    while (!atomic_load(&stop)) {
        size_t n = lull_arena_take_clean(&lull_arenas[0], 512, runs, 16);
        for (size_t i = 0; i < n; i++)
            lull_arena_return_clean(&runs[i]);
        atomic_fetch_add(&claimed, n);
        sched_yield();
    }
    return NULL;
}

Test(race, a_span_of_a_new_segment_whose_slices_the_reserve_claims) {
    static void *blocks[MAX_BLOCKS];
    lull_free(lull_malloc(16)); /* lull started: the arena exists */
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, claim_clean, NULL), 0);
    lull_race_arm(1u << LULL_RACE_SEGMENT_NEW, 7, 3000);
    unsigned n = 0, failed = 0;
    while (n < MAX_BLOCKS && lull_race_hits(LULL_RACE_SEGMENT_NEW) < MIN_HITS) {
        blocks[n] = lull_malloc(BLOCK);
        if (!blocks[n])
            failed++;
        else
            n++;
        if (failed) break;
    }
    uint64_t hits = lull_race_hits(LULL_RACE_SEGMENT_NEW);
    lull_race_arm(0, 0, 0);
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    for (unsigned i = 0; i < n; i++)
        lull_free(blocks[i]);
    cr_log_info("%u blocks, %llu new segments held open, %lu clean runs claimed meanwhile", n,
                (unsigned long long)hits, (unsigned long)atomic_load(&claimed));
    cr_assert_eq(failed, 0, "malloc(%zu) returned NULL after %u blocks (%llu segments held)", BLOCK,
                 n, (unsigned long long)hits);
    cr_assert_geq(hits, MIN_HITS, "the window was held %llu times", (unsigned long long)hits);
}
